"""docker-compose.yml's promises, checked on the file itself (no Docker engine runs on CI machines)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
TROVE_SERVICES = ("web", "worker", "beat", "proxy")


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load((REPO / "docker-compose.yml").read_text())


def test_no_secret_is_committed(compose):
    assert "secrets" not in compose or all("file" not in s for s in (compose.get("secrets") or {}).values())
    tracked = "\n".join(p.name for p in (REPO / "deploy").iterdir())
    assert "secret_key" not in tracked, "a secret key file is in deploy/"
    init = compose["services"]["init"]["command"][-1]
    assert "secrets.token_urlsafe" in init and "-s /run/trove-secrets/secret_key" in init


def test_services_wait_for_migrations(compose):
    for name in TROVE_SERVICES:
        depends = compose["services"][name]["depends_on"]
        assert depends["migrate"]["condition"] == "service_completed_successfully", name


def test_web_runs_a_real_wsgi_server(compose):
    command = compose["services"]["web"]["command"]
    assert command.startswith("gunicorn webapp.wsgi:application")
    assert "runserver" not in command and "manage.py serve" not in command


def test_only_the_sandboxing_worker_is_root_and_none_is_unconfined(compose):
    for name in TROVE_SERVICES:
        service = compose["services"][name]
        assert "seccomp=unconfined" not in service.get("security_opt", []), name
        assert service["user"] == ("root" if name == "worker" else "trove"), name


def test_web_serves_what_the_worker_built(compose):
    """Datasets, the FAISS index and the spool live under TROVE_VAR_DIR: one volume for every service."""
    var_dir = compose["x-trove-env"]["TROVE_VAR_DIR"]
    for name in TROVE_SERVICES:
        assert f"var:{var_dir}" in compose["services"][name]["volumes"], name


def test_proxy_socket_is_shared_with_the_worker(compose):
    socket = compose["x-trove-env"]["TROVE_PROXY_SOCKET"]
    socket_dir = str(Path(socket).parent)
    for name in ("proxy", "worker"):
        assert f"proxy-socket:{socket_dir}" in compose["services"][name]["volumes"], name
    assert f"--unix-path {socket}" in compose["services"]["proxy"]["command"]


def test_dockerignore_keeps_local_state_out():
    ignored = (REPO / ".dockerignore").read_text().split()
    for entry in (".git", ".venv", "var"):
        assert entry in ignored
