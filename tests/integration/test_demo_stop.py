"""Stopping `manage.py demo` (Ctrl-C or SIGTERM, mid-job or while serving) destroys its sandboxes: no process,
no directory, no cgroup is left behind. Run as a newcomer would, in a subprocess, on the embedded default."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from workers.sandboxes import procs
from workers.sandboxes.local import LocalBackend

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.integration


def start_demo(var: Path, sandboxes: Path) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL", "SECRET_KEY")}
    env.update(TROVE_VAR_DIR=str(var), TROVE_SANDBOX_ROOT=str(sandboxes), TROVE_PROXY_PORT="0",
               TROVE_DEMO_MODEL_PORT="0", DJANGO_SETTINGS_MODULE="webapp.settings", PYTHONUNBUFFERED="1")
    return subprocess.Popen(
        [sys.executable, "manage.py", "demo", "--samples", "2", "--tasks", "2", "--serve", "1",
         "--addr", "127.0.0.1:0"],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )


def read_until(proc: subprocess.Popen, marker: str, deadline_s: float = 300) -> str:
    seen, deadline = [], time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line and proc.poll() is not None:
            break
        seen.append(line)
        if marker in line:
            return "".join(seen)
    proc.kill()
    raise AssertionError(f"{marker!r} never printed:\n" + "".join(seen)[-4000:])


def wait_for_a_live_sandbox(root: Path, deadline_s: float = 60) -> None:
    deadline = time.monotonic() + deadline_s
    while not [p for p in root.iterdir() if not p.name.startswith(".")]:
        assert time.monotonic() < deadline, "the demo never had a sandbox to destroy"
        time.sleep(0.2)


def sandbox_names(var: Path) -> list[str]:
    database = sqlite3.connect(var / "trove.sqlite3")
    try:
        return [row[0] for row in database.execute("select name from fleets_sandbox")]
    finally:
        database.close()


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
@pytest.mark.parametrize("when", ["mid-job", "serving"])
def test_stopping_the_demo_leaves_no_sandbox_behind(tmp_path, signum, when):
    var = tmp_path / "var"
    sandboxes = Path(tempfile.mkdtemp(prefix="trove-demo-stop-", dir="/tmp"))
    sandboxes.chmod(0o711)
    demo = start_demo(var, sandboxes)
    try:
        read_until(demo, "rollouts finished" if when == "mid-job" else "Dashboard:")
        wait_for_a_live_sandbox(sandboxes)  # mid-job: leased ones; serving: the warm pool, topped up by the beat
        names = sandbox_names(var)

        demo.send_signal(signum)
        output = demo.communicate(timeout=120)[0]

        assert demo.returncode is not None
        backend = LocalBackend(root=sandboxes)
        for name in names:
            assert not (sandboxes / name).exists(), f"{name}'s directory is left:\n{output[-2000:]}"
            assert not [d for d in backend.cgroup_dirs(name) if os.path.exists(d)], f"{name}'s cgroup is left"
        assert procs.processes_mentioning(str(sandboxes) + "/") == []
        database = sqlite3.connect(var / "trove.sqlite3")
        live = database.execute("select count(*) from fleets_sandbox where state != 'terminated'").fetchone()[0]
        assert live == 0
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.wait()
        subprocess.run(["rm", "-rf", str(sandboxes)], check=False)
