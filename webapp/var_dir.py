"""Where Trove keeps its files, and who may read them (used by settings.py only; no Django here).

var/ (TROVE_VAR_DIR) holds the embedded SQLite database, datasets, the search index and the proxy's spool:
readable by its owner only (0700; the database file 0600, and SQLite gives its -wal and -shm files the
database file's mode). The sandboxes' files cannot live there when Trove runs as root: bubblewrap runs as
unprivileged uids that must pass through every parent of the sandbox root and of the proxy socket. So as
root their default home is a directory of their own per var/ under /var/lib/trove-sandboxes (root-owned,
0711: passable, not listable), which also keeps a checkout under /root (0700) from being unreachable.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

SANDBOX_HOME = Path("/var/lib/trove-sandboxes")


def private_dir(path: Path) -> Path:
    """Create `path` (and its parents) if missing; make it 0700 if it is ours. Returns it."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    _tighten(path, 0o700)
    return path


def private_file(path: Path) -> Path:
    """Create the empty file `path` as 0600 if missing (an empty file is a valid SQLite database, so SQLite
    keeps that mode), and make an existing one, and its -wal and -shm companions, 0600 if ours."""
    os.close(os.open(path, os.O_CREAT | os.O_WRONLY | os.O_CLOEXEC, 0o600))
    for candidate in (path, Path(f"{path}-wal"), Path(f"{path}-shm")):
        if candidate.exists():
            _tighten(candidate, 0o600)
    return path


def sandbox_host_dir(var_dir: Path, *, euid: int | None = None) -> Path:
    """The default home of the sandbox root and the proxy socket for this var/ (see the module docstring):
    var/ itself for an ordinary user (bubblewrap runs as that user, who owns var/), else a directory named
    after var/ under SANDBOX_HOME, so that two checkouts on one machine never share sandboxes."""
    if (os.geteuid() if euid is None else euid) != 0:
        return var_dir
    return SANDBOX_HOME / hashlib.sha256(str(var_dir.resolve()).encode()).hexdigest()[:12]


def _tighten(path: Path, mode: int) -> None:
    st = path.stat()
    if st.st_uid == os.geteuid() and st.st_mode & 0o777 != mode:
        path.chmod(mode)
