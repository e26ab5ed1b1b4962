"""Attacks on the job -> endpoint -> upstream path, against the Trove-wired proxy on a real Postgres: a job
that aims the proxy at Trove itself or at loopback, a finished rollout's token, a key reference edited to
name the server's own secrets, a name that resolves to loopback only after it was registered. Each must end
with a clear error and nothing reaching the target (real listening sockets, a real upstream that counts)."""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Iterator

import pytest

from experience.models import Step
from tests.webapp.proxy.harness import PROXY_TIMEOUT_S, UpstreamState, new_call_id, send
from tests.webapp.proxy.rollouts import finish, running_rollout
from webapp.proxy.recorder import InProcessSink
from webapp.proxy.server import ProxyServer, serve_in_thread
from webapp.proxy.wiring import make_trove_proxy_app
from webapp.rollouts.endpoints import endpoint_register
from webapp.rollouts.models import ModelEndpoint, Rollout, rollout_token_hash

pytestmark = pytest.mark.django_db(transaction=True)
BODY = {"model": "scripted-ok", "messages": [{"role": "user", "content": "List the files."}]}


@pytest.fixture
def trove_proxy(settings, tmp_path) -> Iterator[tuple[ProxyServer, InProcessSink]]:
    settings.REDIS_URL = None  # records straight to the database
    settings.TROVE_PROXY_SPOOL_DIR = tmp_path / "spool"
    app, sink = make_trove_proxy_app(upstream_timeout=PROXY_TIMEOUT_S)
    server = serve_in_thread(app, shutdown_timeout=0.5)
    yield server, sink
    server.stop()
    sink.close(10)


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    """Something listening on loopback that no refused call may reach."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    sock.setblocking(False)
    yield sock
    sock.close()


def chat(server: ProxyServer, rollout: Rollout, **kwargs):
    return send(f"{server.base_url}/r/{rollout.proxy_token}/v1/chat/completions", body=BODY, **kwargs)


def unchecked_endpoint(base_url: str, **fields) -> ModelEndpoint:
    """An endpoint row as a careless admin or a direct database edit would leave it: no registration checks."""
    return ModelEndpoint.objects.create(name=fields.pop("name", "unchecked"), base_url=base_url,
                                        model_names=["scripted-ok"], **fields)


def stored_steps(rollout: Rollout) -> list[Step]:
    return list(Step.objects.filter(trajectory_id=rollout.trajectory_id, kind="model_call"))


def test_a_job_aimed_at_trove_itself_gets_a_clear_error_and_trove_answers_nothing(trove_proxy, live_server):
    server, sink = trove_proxy
    rollout = running_rollout(endpoint=unchecked_endpoint(f"{live_server.url}/api/v1"))

    reply = chat(server, rollout, call_id=new_call_id())
    sink.flush(10)

    assert reply.status == 403 and reply.json()["error"]["code"] == "endpoint_refused"
    assert "loopback" in reply.json()["error"]["message"]
    [step] = stored_steps(rollout)
    assert step.is_error and step.payload["error_kind"] == "endpoint_refused"
    assert "<html" not in json.dumps(step.payload).lower(), "no reply of the web app was stored"


def test_a_job_aimed_at_loopback_reaches_nothing(trove_proxy, listener):
    server, sink = trove_proxy
    port = listener.getsockname()[1]
    rollout = running_rollout(endpoint=unchecked_endpoint(f"http://127.0.0.1:{port}/v1"))

    reply = chat(server, rollout)
    models = send(f"{server.base_url}/r/{rollout.proxy_token}/v1/models", method="GET")

    assert (reply.status, models.status) == (403, 403)
    assert "127.0.0.1 is a loopback address" in reply.json()["error"]["message"]
    with pytest.raises(BlockingIOError):
        listener.accept()


def test_a_name_that_resolves_to_loopback_after_registration_reaches_nothing(trove_proxy, listener):
    """DNS rebinding: the name was public when it was registered, and is loopback when the proxy connects."""
    server, _ = trove_proxy
    port = listener.getsockname()[1]

    def answered_public_then(host, port, **kwargs):  # the DNS answer at registration time
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("93.184.216.34", port))]

    endpoint = endpoint_register(name="rebinding", base_url=f"http://localhost:{port}/v1", protocol="chat",
                                 model_names=["scripted-ok"], resolve=answered_public_then)
    rollout = running_rollout(endpoint=endpoint)

    reply = chat(server, rollout)

    assert reply.status == 403 and "loopback" in reply.json()["error"]["message"]
    with pytest.raises(BlockingIOError):
        listener.accept()


def test_a_finished_or_unknown_rollouts_token_makes_no_upstream_call(trove_proxy, upstream: UpstreamState,
                                                                   monkeypatch):
    server, sink = trove_proxy
    monkeypatch.setenv("TROVE_MODEL_KEY_COUNTED", "sk-counted-key-0001")
    rollout = running_rollout(upstream_v1=f"{upstream.url}/v1", key_ref="env:TROVE_MODEL_KEY_COUNTED")
    assert chat(server, rollout).status == 200
    calls_while_running = len(upstream.requests)

    finish(rollout)
    late = [chat(server, rollout), send(f"{server.base_url}/r/{rollout.proxy_token}/v1/models", method="GET"),
            send(f"{server.base_url}/r/never-issued/v1/chat/completions", body=BODY)]

    assert [reply.status for reply in late] == [401, 401, 401]
    assert len(upstream.requests) == calls_while_running, "no call went out with the endpoint's key"


@pytest.mark.parametrize("reference", ["env:SECRET_KEY", "env:DATABASE_URL", "file:/etc/shadow", "file:../outside"])
def test_a_key_reference_edited_to_name_the_servers_secrets_is_refused_before_any_call(
    trove_proxy, upstream: UpstreamState, settings, tmp_path, monkeypatch, reference
):
    server, sink = trove_proxy
    monkeypatch.setenv("SECRET_KEY", "the-django-secret-key")
    settings.TROVE_MODEL_SECRETS_DIR = str(tmp_path / "secrets")
    (tmp_path / "secrets").mkdir()
    (tmp_path / "outside").write_text("root-only-contents")
    os.chmod(tmp_path / "outside", 0o600)
    rollout = running_rollout(endpoint=unchecked_endpoint(f"{upstream.url}/v1", key_ref=reference,
                                                          allow_private_network=True))
    before = len(upstream.requests)

    reply = chat(server, rollout, call_id=new_call_id())
    sink.flush(10)

    assert reply.status == 403 and reply.json()["error"]["code"] == "endpoint_refused"
    assert "key_ref" in reply.json()["error"]["message"]
    assert len(upstream.requests) == before, "the upstream never saw a request, so never a key"
    stored = json.dumps([step.payload for step in stored_steps(rollout)])
    assert "the-django-secret-key" not in reply.body.decode() + stored
    assert "root-only-contents" not in reply.body.decode() + stored


def test_a_symlink_planted_in_the_secrets_directory_is_not_followed_out(trove_proxy, upstream: UpstreamState,
                                                                      settings, tmp_path):
    server, _ = trove_proxy
    secrets_dir = tmp_path / "secrets"
    secrets_dir.mkdir()
    (tmp_path / "root-only").write_text("root-only-contents")
    (secrets_dir / "model-key").symlink_to(tmp_path / "root-only")
    settings.TROVE_MODEL_SECRETS_DIR = str(secrets_dir)
    rollout = running_rollout(endpoint=unchecked_endpoint(f"{upstream.url}/v1", key_ref="file:model-key",
                                                          allow_private_network=True))
    before = len(upstream.requests)

    reply = chat(server, rollout)

    assert reply.status == 403 and "leads out of TROVE_MODEL_SECRETS_DIR" in reply.json()["error"]["message"]
    assert len(upstream.requests) == before


def test_a_key_file_in_the_secrets_directory_is_sent_to_its_endpoint_and_nowhere_else(
    trove_proxy, upstream: UpstreamState, settings, tmp_path
):
    server, sink = trove_proxy
    secrets_dir = tmp_path / "secrets"
    secrets_dir.mkdir()
    (secrets_dir / "lab-key").write_text("sk-from-a-file-7781\n")
    settings.TROVE_MODEL_SECRETS_DIR = str(secrets_dir)
    rollout = running_rollout(upstream_v1=f"{upstream.url}/v1", key_ref="file:lab-key")
    call_id = new_call_id()

    reply = chat(server, rollout, call_id=call_id)
    sink.flush(10)

    assert reply.status == 200
    assert upstream.requests[-1]["headers"]["Authorization"] == "Bearer sk-from-a-file-7781"
    assert "sk-from-a-file-7781" not in json.dumps(Step.objects.get(call_id=call_id).payload)


def test_only_the_hash_of_a_rollout_token_is_stored(trove_proxy, upstream: UpstreamState):
    server, _ = trove_proxy
    rollout = running_rollout(upstream_v1=f"{upstream.url}/v1")

    stored = Rollout.objects.get(pk=rollout.pk).token

    assert stored == rollout_token_hash(rollout.proxy_token) and rollout.proxy_token not in stored
    assert not Rollout.objects.filter(token=rollout.proxy_token).exists()
    assert chat(server, rollout).status == 200, "the plaintext is what the harness sends"
    assert send(f"{server.base_url}/r/{stored}/v1/chat/completions", body=BODY).status == 401, \
        "the stored hash is no token: a database reader cannot call the model"
