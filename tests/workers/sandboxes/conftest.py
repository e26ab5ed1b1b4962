"""The sandbox tests' shared local backend: one per test module, on a fresh root under /tmp (0711, so the
unprivileged uids bubblewrap drops to can pass through it), every sandbox destroyed and the root removed after."""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest

from workers.sandboxes.local import LocalBackend


@pytest.fixture(scope="module")
def backend(request):
    root = tempfile.mkdtemp(prefix=f"trove-{request.module.__name__.rsplit('.', 1)[-1]}-", dir="/tmp")
    os.chmod(root, 0o711)
    local = LocalBackend(root)
    yield local
    for handle in local.list({}):
        local.destroy(handle.name)
    shutil.rmtree(root, ignore_errors=True)
