"""Fixtures for the local backend tests: real bubblewrap sandboxes under a throwaway root.

The root is made with tempfile under /tmp (world-searchable), not pytest's 0700 basetemp, so that
bubblewrap can run as the unprivileged sandbox uid, the configuration these tests are about.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid

import pytest

from workers.sandboxes.base import SandboxHandle, SandboxSpec
from workers.sandboxes.local import LocalBackend


@pytest.fixture(scope="module")
def backend():
    root = tempfile.mkdtemp(prefix="trove-sbtest-")
    os.chmod(root, 0o711)
    local = LocalBackend(root)
    yield local
    for handle in local.list({}):
        local.destroy(handle.name)
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def make_sandbox(backend):
    """make_sandbox(**spec_fields) -> a ready handle; every sandbox made is destroyed afterwards."""
    names = []

    def make(**fields) -> SandboxHandle:
        name = fields.pop("name", f"t-{uuid.uuid4().hex[:10]}")
        names.append(name)
        return backend.create(SandboxSpec(name=name, **fields))

    yield make
    for name in names:
        backend.destroy(name)


@pytest.fixture
def sandbox(make_sandbox) -> SandboxHandle:
    return make_sandbox()

