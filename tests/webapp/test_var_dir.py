"""var/ and the embedded SQLite database are readable by their owner only; the sandboxes' files live where
the sandbox uids can reach them."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

from webapp.var_dir import SANDBOX_HOME, private_dir, private_file, sandbox_host_dir

REPO = Path(__file__).resolve().parents[2]

# Run in a fresh process (settings are read once): migrate the embedded database, then, with the connection
# still open (so SQLite's -wal and -shm files exist), report the modes.
EMBEDDED_MODES = """
import json, os, stat, django
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")
django.setup()
from django.conf import settings
from django.core.management import call_command
from django.db import connection
call_command("migrate", verbosity=0)
with connection.cursor() as cursor:
    cursor.execute("select count(*) from django_migrations")
var = settings.VAR_DIR
names = ["", "trove.sqlite3", "trove.sqlite3-wal", "trove.sqlite3-shm"]
print(json.dumps({n: oct(stat.S_IMODE(os.stat(var / n).st_mode)) for n in names if (var / n).exists()}))
"""


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_the_embedded_database_and_var_are_owner_only(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    env.update(TROVE_VAR_DIR=str(tmp_path / "var"), SECRET_KEY="t")

    done = subprocess.run([sys.executable, "-c", EMBEDDED_MODES], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=300)

    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.splitlines()[-1]) == {
        "": "0o700", "trove.sqlite3": "0o600", "trove.sqlite3-wal": "0o600", "trove.sqlite3-shm": "0o600"}


def test_an_existing_var_and_database_are_tightened(tmp_path):
    var = tmp_path / "var"
    var.mkdir(mode=0o755)
    var.chmod(0o755)
    database = var / "trove.sqlite3"
    for path in (database, Path(f"{database}-wal")):
        path.write_bytes(b"")
        path.chmod(0o644)

    private_file(private_dir(var) / "trove.sqlite3")

    assert (mode(var), mode(database), mode(Path(f"{database}-wal"))) == (0o700, 0o600, 0o600)


def test_sandboxes_live_under_var_for_an_ordinary_user_and_outside_it_for_root(tmp_path):
    var = tmp_path / "checkout" / "var"

    as_user, as_root = sandbox_host_dir(var, euid=1000), sandbox_host_dir(var, euid=0)

    assert as_user == var
    assert as_root.parent == SANDBOX_HOME and as_root == sandbox_host_dir(var, euid=0)
    assert as_root != sandbox_host_dir(tmp_path / "another" / "var", euid=0)  # two checkouts never share
