"""The privilege drop cannot fail open: a sandbox root that the unprivileged bubblewrap uid cannot reach is
refused (it used to run sandboxes as host root, which read root-only files), and the roots Trove uses by
default, the tests' included, are reachable."""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from pathlib import Path

import pytest

from webapp.var_dir import SANDBOX_HOME, sandbox_host_dir
from workers.sandboxes.base import SandboxError, SandboxSpec
from workers.sandboxes.local import LocalBackend

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the privilege drop happens when Trove runs as root")
ROOT_ONLY_TEXT = "the server's secret\n"


@pytest.fixture
def closed_parent():
    """A directory like pytest's basetemp or /root: 0700, owned by root."""
    parent = tempfile.mkdtemp(prefix="trove-closed-")
    yield Path(parent)
    shutil.rmtree(parent, ignore_errors=True)


def plant_root_only_file(backend: LocalBackend) -> str:
    """A root-owned 0600 file in a directory every sandbox sees (/opt/trove/harness). Returns its inside path."""
    path = Path(backend.shared_dir, "harness", "root-only.txt")
    path.write_text(ROOT_ONLY_TEXT)
    path.chmod(0o600)
    return "/opt/trove/harness/root-only.txt"


def read_from_a_sandbox(backend: LocalBackend, inside_path: str) -> str:
    name = f"pd-{uuid.uuid4().hex[:10]}"
    try:
        handle = backend.create(SandboxSpec(name=name))
        result = backend.exec(handle, f"cat {inside_path}")
        return result.stdout + result.stderr
    finally:
        backend.destroy(name)


def test_a_root_whose_parent_the_sandbox_uid_cannot_pass_is_refused(closed_parent):
    with pytest.raises(SandboxError) as refused:
        LocalBackend(closed_parent / "sandboxes")

    message = str(refused.value)
    assert refused.value.reason == "sandbox_root_unreachable" and refused.value.permanent
    assert f"chmod o+x {closed_parent}`" in message and "TROVE_SANDBOX_ROOT" in message
    assert "mode 0700" in message


def test_after_the_suggested_chmod_the_sandbox_runs_unprivileged_and_cannot_read_root_only_files(closed_parent):
    closed_parent.chmod(0o701)  # what the error says: `chmod o+x`
    backend = LocalBackend(closed_parent / "sandboxes")
    inside = plant_root_only_file(backend)

    seen = read_from_a_sandbox(backend, inside)

    assert ROOT_ONLY_TEXT not in seen and "Permission denied" in seen


def test_host_uid_none_as_root_is_refused():
    root = tempfile.mkdtemp(prefix="trove-nouid-")
    os.chmod(root, 0o711)
    try:
        with pytest.raises(SandboxError) as refused:
            LocalBackend(root, host_uid=None)
    finally:
        shutil.rmtree(root)

    assert refused.value.reason == "bad_host_uid"


def test_missing_parents_are_made_passable_under_a_strict_umask():
    base = tempfile.mkdtemp(prefix="trove-umask-")
    os.chmod(base, 0o711)
    previous = os.umask(0o077)
    try:
        backend = LocalBackend(os.path.join(base, "a", "b", "sandboxes"))
    finally:
        os.umask(previous)
    try:
        modes = [os.stat(os.path.join(base, *parts)).st_mode & 0o777 for parts in (["a"], ["a", "b"])]
        assert modes == [0o711, 0o711]
        assert "Permission denied" in read_from_a_sandbox(backend, plant_root_only_file(backend))
    finally:
        shutil.rmtree(base)


def test_the_tests_sandbox_root_fixture_is_reachable(sandbox_root):
    backend = LocalBackend(sandbox_root)

    assert "Permission denied" in read_from_a_sandbox(backend, plant_root_only_file(backend))


def test_the_default_root_as_root_works_for_a_checkout_under_a_closed_directory(closed_parent):
    """A fresh clone under /root (0700): var/ is there, the sandboxes go under /var/lib/trove-sandboxes."""
    var_dir = closed_parent / "checkout" / "var"
    home = sandbox_host_dir(var_dir)
    assert home.parent == SANDBOX_HOME and not str(home).startswith(str(closed_parent))
    try:
        backend = LocalBackend(home / "sandboxes")

        assert "Permission denied" in read_from_a_sandbox(backend, plant_root_only_file(backend))
    finally:
        shutil.rmtree(home, ignore_errors=True)
