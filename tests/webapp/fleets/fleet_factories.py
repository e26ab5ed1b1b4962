"""Shared helpers for the fleet tests: templates, fleets, warm rows, a real local backend under /tmp.

Rows are made and moved through the real services; `warm_rows` stands in for a backend only where the test
is about the database side (a claim never touches the backend, so a warm row needs no sandbox behind it).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest
from django.conf import settings

from webapp.fleets import services
from webapp.fleets.models import EnvironmentTemplate, Fleet, Sandbox, SandboxEvent

S = Sandbox.State
REPO = Path(__file__).resolve().parents[3]


def make_template(name: str | None = None, **fields) -> EnvironmentTemplate:
    fields.setdefault("network", "none")
    return services.template_create(name=name or f"tpl-{uuid.uuid4().hex[:6]}", **fields)


def make_fleet(*, template: EnvironmentTemplate | None = None, name: str | None = None, **fields) -> Fleet:
    fields.setdefault("sizing", Fleet.Sizing.FIXED)
    return services.fleet_create(name=name or f"fleet-{uuid.uuid4().hex[:6]}", template=template or make_template(),
                                 **fields)


def warm_rows(fleet: Fleet, n: int) -> list[Sandbox]:
    """n rows moved requested -> provisioning -> warm by the services, with no backend object."""
    rows = services.sandboxes_request(fleet=fleet, n=n)
    for row in rows:
        services.sandbox_transition(sandbox=row, to=S.PROVISIONING, expect=(S.REQUESTED,), reason="test")
        services.sandbox_transition(sandbox=row, to=S.WARM, expect=(S.PROVISIONING,), reason="test",
                                    endpoint="unix:/nowhere", agent_secret="s3cret-agent-value")
    return rows


def events_of(sandbox: Sandbox) -> list[tuple[str, str, str]]:
    """(kind, to_state, reason) oldest first."""
    return list(SandboxEvent.objects.filter(sandbox=sandbox).order_by("id").values_list("kind", "to_state", "reason"))


def transitions_of(sandbox: Sandbox) -> list[str]:
    return [to for kind, to, _ in events_of(sandbox) if kind == "transition"]


def wait_until(predicate, *, timeout: float = 20.0, interval: float = 0.05, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


@pytest.fixture
def pool_backend(settings):
    """A real LocalBackend under a world-searchable /tmp root (so bubblewrap drops to the sandbox uid),
    installed as the "local" backend; everything left is destroyed afterwards."""
    from workers.sandboxes import registry
    from workers.sandboxes.local import LocalBackend

    root = tempfile.mkdtemp(prefix="trove-fleet-")
    os.chmod(root, 0o711)
    backend = LocalBackend(root)
    settings.TROVE_SANDBOX_ROOT = root
    registry.set_backend("local", backend)
    yield backend
    for handle in backend.list({}):
        backend.destroy(handle.name)
    registry._backends.pop("local", None)
    shutil.rmtree(root, ignore_errors=True)


def database_url() -> str:
    db = settings.DATABASES["default"]
    return f"postgres://{db['USER']}:{db['PASSWORD']}@{db['HOST']}:{db['PORT']}/{db['NAME']}"


def start_django_process(code: str, *, env: dict[str, str] | None = None) -> subprocess.Popen:
    """A separate Python process with Django set up on this test's database, running `code`."""
    prelude = "import django, os; os.environ.setdefault('DJANGO_SETTINGS_MODULE', 'webapp.settings'); django.setup()\n"
    full_env = dict(os.environ, DATABASE_URL=database_url(), SECRET_KEY="trove-test-secret", **(env or {}))
    return subprocess.Popen([sys.executable, "-c", prelude + code], cwd=REPO, env=full_env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


KUBE_IMAGE = "registry.trove.test/sandbox@sha256:" + "0" * 64


@pytest.fixture
def kube_pool(kube_cluster, kube_kubelet, kube_namespace):
    """A real KubernetesBackend on the loopback API server (its own namespace), installed as "kubernetes"."""
    from workers.sandboxes import registry
    from workers.sandboxes.kubernetes import KubernetesBackend, KubeSandboxConfig

    backend = KubernetesBackend(namespace=kube_namespace, api_client=kube_cluster.api_client(),
                                config=KubeSandboxConfig(default_image=KUBE_IMAGE, delete_grace_seconds=1))
    registry.set_backend("kubernetes", backend)
    yield backend
    registry._backends.pop("kubernetes", None)


def make_kube_fleet(**fields) -> Fleet:
    template = fields.pop("template", None) or make_template(image=fields.pop("image", KUBE_IMAGE),
                                                             cpu=fields.pop("cpu", 0.25), memory_mb=128)
    return make_fleet(template=template, backend=Fleet.Backend.KUBERNETES, **fields)


def pods(core, namespace: str) -> dict[str, str]:
    """Pod name -> phase (or "deleting") of every sandbox pod in `namespace`."""
    found = core.list_namespaced_pod(namespace, label_selector="trove.dev/sandbox").items
    return {p.metadata.name: "deleting" if p.metadata.deletion_timestamp else p.status.phase for p in found}
