"""Harness bundles: each preset's package installed once per version into a directory of its own under
TROVE_HARNESS_DIR (`<dir>/<name>/<version>/`), then mounted read-only into local sandboxes at
/opt/trove/bundles (on Kubernetes an image or an init container provides the same tree; deploy/README.md).

An install is atomic: it builds `<version>.partial-<pid>` and renames it into place once the package
installed and its executable is there, then writes nothing more; a bundle is installed when its manifest
(BUNDLE_MANIFEST) exists. Concurrent installs of one bundle (two CI jobs, a test and a demo) wait on a lock
file, and the second finds the first's bundle. Files are world-readable, never writable by the sandboxes.

npm packages: `npm install --prefix BUNDLE NAME@VERSION` (postinstall scripts run: Claude Code's only links
its native binary, opencode's picks the binary for this CPU). PyPI packages: a virtualenv on /usr/bin/python3,
the interpreter the sandbox has, with `pip install NAME==VERSION`.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from workers.harness.presets.base import Preset

BUNDLE_MANIFEST = ".trove-bundle.json"
SANDBOX_PYTHON = "/usr/bin/python3"  # what a local sandbox runs python with (the host's /usr, read-only)
Progress = Callable[[str], None]


class InstallFailed(RuntimeError):
    """The registry client failed; the message ends with what it printed."""


def bundle_path(root: str | os.PathLike[str], preset: Preset, version: str) -> Path:
    return Path(root) / preset.name / version


def bundle_installed(root: str | os.PathLike[str], preset: Preset, version: str) -> bool:
    return (bundle_path(root, preset, version) / BUNDLE_MANIFEST).is_file()


def bundle_manifest(root: str | os.PathLike[str], preset: Preset, version: str) -> dict | None:
    path = bundle_path(root, preset, version) / BUNDLE_MANIFEST
    return json.loads(path.read_text()) if path.is_file() else None


def harness_install(*, preset: Preset, version: str, root: str | os.PathLike[str],
                    progress: Progress = lambda line: None) -> Path:
    """Install `preset` at `version` under `root` unless it is there already; returns the bundle's path.
    Idempotent; safe to run concurrently. Raises InstallFailed (nothing is left half-installed)."""
    target = bundle_path(root, preset, version)
    target.parent.mkdir(parents=True, exist_ok=True)
    _open_up(Path(root), target.parent)
    with _install_lock(target):
        if bundle_installed(root, preset, version):
            progress(f"{preset.name}@{version} already installed at {target}")
            return target
        partial = target.with_name(f"{version}.partial-{os.getpid()}")
        shutil.rmtree(partial, ignore_errors=True)
        started = time.monotonic()
        try:
            _install_package(preset, version, partial, progress)
            _check_executable(preset, partial)
            _make_readable(partial)
            shutil.rmtree(target, ignore_errors=True)  # a bundle without a manifest: an install cut short
            partial.rename(target)
        except BaseException:
            shutil.rmtree(partial, ignore_errors=True)
            raise
        install_s, size = round(time.monotonic() - started, 1), _tree_bytes(target)
        manifest = {"name": preset.name, "version": version, "registry": preset.package.registry,
                    "package": preset.package.name, "protocol": preset.protocol, "executable": preset.executable,
                    "installed_at": datetime.now(UTC).isoformat(), "install_s": install_s, "bytes": size}
        (target / BUNDLE_MANIFEST).write_text(json.dumps(manifest, indent=2))
        os.chmod(target / BUNDLE_MANIFEST, 0o644)
        progress(f"{preset.name}@{version} installed at {target} ({size / 1e6:.0f} MB, {install_s} s)")
        return target


def _install_package(preset: Preset, version: str, into: Path, progress: Progress) -> None:
    into.mkdir(parents=True)
    spec = preset.package.spec(version)
    if preset.package.registry == "npm":
        # --loglevel=http prints a line per fetched tarball: the progress an operator sees.
        _run(["npm", "install", "--prefix", str(into), "--no-audit", "--no-fund", "--no-update-notifier",
              "--loglevel=http", spec], progress, cwd=into)
    else:
        _run([SANDBOX_PYTHON, "-m", "venv", str(into / "venv")], progress)
        _run([str(into / "venv" / "bin" / "python"), "-m", "pip", "install", "--disable-pip-version-check",
              "--no-input", "--progress-bar", "off", spec], progress)


def _run(argv: list[str], progress: Progress, *, cwd: Path | None = None) -> None:
    progress("$ " + " ".join(argv))
    env = {**os.environ, "npm_config_update_notifier": "false"}
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace",
                               cwd=cwd, env=env, stdin=subprocess.DEVNULL)
    tail: list[str] = []
    assert process.stdout is not None
    for line in process.stdout:
        line = line.rstrip()
        if line and not line.startswith("WARNING: Location"):  # pip's notes on this machine's local indexes
            progress("  " + line)
            tail = [*tail[-19:], line]
    if process.wait() != 0:
        raise InstallFailed(f"{argv[0]} exited {process.returncode}: " + "\n".join(tail))


def _check_executable(preset: Preset, bundle: Path) -> None:
    executable = bundle / preset.executable
    if not executable.exists():
        raise InstallFailed(f"{preset.package.spec()} installed, but its executable {preset.executable} is not in "
                            "the bundle (another platform? a package layout the preset does not know?)")


def _make_readable(tree: Path) -> None:
    """World-readable (and traversable where it is a directory or executable): the sandboxes' uids read it."""
    subprocess.run(["chmod", "-R", "a+rX,go-w", str(tree)], check=True)


def _open_up(root: Path, *directories: Path) -> None:
    for directory in (root, *directories):
        if directory.is_dir() and directory.stat().st_uid == os.geteuid():
            directory.chmod(0o755)


def _tree_bytes(tree: Path) -> int:
    """Disk use, each file once (postinstall scripts hard-link binaries)."""
    sizes = {(stat.st_dev, stat.st_ino): stat.st_size for entry in tree.rglob("*")
             if entry.is_file() and not entry.is_symlink() for stat in [entry.stat()]}
    return sum(sizes.values())


class _install_lock:
    def __init__(self, target: Path) -> None:
        self.path = target.with_name(f".{target.name}.lock")

    def __enter__(self) -> None:
        self.handle = open(self.path, "w")  # noqa: SIM115 (held until __exit__)
        fcntl.flock(self.handle, fcntl.LOCK_EX)

    def __exit__(self, *exc) -> None:
        fcntl.flock(self.handle, fcntl.LOCK_UN)
        self.handle.close()
