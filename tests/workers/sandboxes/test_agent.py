"""The in-sandbox agent on its own, in its TCP mode (how the Kubernetes backend runs it at a pod IP)."""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import socket
import subprocess
import tempfile
import threading
from pathlib import Path

import pytest

from workers.sandboxes import agent
from workers.sandboxes.agent_client import AgentClient
from workers.sandboxes.base import AgentAuthError

AGENT = Path(agent.__file__)
SECRET = "tcp-test-secret"


@pytest.fixture
def tcp_agent(tmp_path):
    """An agent on 127.0.0.1:<free port>, secret from TROVE_AGENT_SECRET; yields (client, workspace)."""
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    env = {"PATH": os.environ["PATH"], "TROVE_AGENT_SECRET": SECRET}
    process = subprocess.Popen(
        ["/usr/bin/python3", "-I", "-S", str(AGENT), "--listen", "tcp:127.0.0.1:0", "--workspace", str(workspace)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True,
    )
    ready = process.stdout.readline()
    assert ready.startswith("trove-agent ready tcp:127.0.0.1:"), process.stderr.read()
    endpoint = ready.split()[-1]
    yield AgentClient(endpoint, SECRET), workspace
    process.kill()
    process.wait()


def exchange(endpoint: str, body: bytes, *, secret: str | None = SECRET, nonce: bytes | None = None) -> dict:
    """One exchange by hand: read the greeting, send `body` signed with `secret` (unsigned if None) over the
    greeting's nonce (or over `nonce`, to replay an old signature), return the reply after checking its mac."""
    host, port = endpoint.removeprefix("tcp:").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        reader = sock.makefile("rb")
        greeting = reader.readline().rstrip(b"\n")
        assert greeting.startswith(agent.GREETING)
        fresh = greeting.removeprefix(agent.GREETING)
        request_mac = b"0" * 64 if secret is None else sign(secret, agent.REQUEST_CONTEXT, nonce or fresh, b"\n", body)
        sock.sendall(request_mac + b" " + body + b"\n")
        reply_mac, reply = reader.readline().rstrip(b"\n").split(b" ", 1)
    assert reply_mac == sign(SECRET, agent.RESPONSE_CONTEXT, fresh, b"\n", request_mac, b"\n", reply)
    return json.loads(reply)


def sign(secret: str, *parts: bytes) -> bytes:
    return hmac.new(secret.encode(), b"".join(parts), hashlib.sha256).hexdigest().encode()


def test_tcp_agent_executes_and_hides_its_secret_from_commands(tcp_agent):
    client, workspace = tcp_agent

    result = client.exec('pwd; echo "${TROVE_AGENT_SECRET:-hidden}"')

    assert result.stdout == f"{workspace}\nhidden\n"
    assert client.ping() > 0


def test_tcp_agent_refuses_a_wrong_secret(tcp_agent):
    client, _ = tcp_agent

    with pytest.raises(AgentAuthError):
        AgentClient(client.endpoint, "wrong").exec("echo hi")
    unsigned = exchange(client.endpoint, b'{"op": "ping"}', secret=None)
    wrong = exchange(client.endpoint, b'{"op": "ping"}', secret="wrong")

    for reply in (unsigned, wrong):
        assert reply["ok"] is False and reply["error"] == "auth"


@pytest.mark.parametrize(
    ("payload", "code"),
    [
        (b"{not json", "bad_request"),
        (b"[1, 2]", "bad_request"),
        (b'{"op": "dance"}', "bad_request"),
        (b'{"op": "exec", "cmd": 5}', "bad_request"),
        (b'{"op": "exec", "cmd": "true", "timeout": -1}', "bad_request"),
        (b'{"op": "read_file", "path": "../x"}', "path"),
        (b'{"op": "read_file", "path": "missing.txt"}', "path"),
    ],
)
def test_bad_requests_get_a_coded_error(tcp_agent, payload, code):
    client, _ = tcp_agent

    reply = exchange(client.endpoint, payload)

    assert reply["ok"] is False and reply["error"] == code and reply["message"]


def test_a_signed_request_works_once_and_its_replay_on_a_new_connection_is_refused(tcp_agent):
    client, workspace = tcp_agent
    body = b'{"op": "exec", "cmd": "echo ran >> count.txt"}'
    host, port = client.endpoint.removeprefix("tcp:").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        reader = sock.makefile("rb")
        nonce = reader.readline().rstrip(b"\n").removeprefix(agent.GREETING)
        captured = sign(SECRET, agent.REQUEST_CONTEXT, nonce, b"\n", body) + b" " + body + b"\n"
        sock.sendall(captured)
        assert json.loads(reader.readline().split(b" ", 1)[1])["exit_code"] == 0

    with socket.create_connection((host, int(port)), timeout=10) as sock:
        reader = sock.makefile("rb")
        reader.readline()
        sock.sendall(captured)  # the same bytes, under the new connection's nonce
        replayed = json.loads(reader.readline().split(b" ", 1)[1])
    tampered = exchange(client.endpoint, body.replace(b"echo ran", b"echo bad"), nonce=nonce)

    assert replayed["error"] == "auth" and tampered["error"] == "auth"
    assert (workspace / "count.txt").read_text() == "ran\n"


def test_the_lean_hmac_agrees_with_the_hmac_module():
    for key in (b"", b"k", b"k" * 64, b"k" * 65, b"\xff" * 200):
        mac = agent.HmacSha256(key)
        for parts in ((), (b"a",), (b"a", b"bc", b"\n" * 1000)):
            assert mac.hexdigest(*parts) == hmac.new(key, b"".join(parts), hashlib.sha256).hexdigest().encode()


def test_a_slow_command_does_not_block_other_connections(tcp_agent):
    client, _ = tcp_agent
    slow_done = threading.Event()

    def slow() -> None:
        client.exec("sleep 3", timeout=30)
        slow_done.set()

    threading.Thread(target=slow, daemon=True).start()
    answers = [client.exec(f"echo {i}").stdout for i in range(20)]

    assert not slow_done.is_set()
    assert answers == [f"{i}\n" for i in range(20)]
    assert slow_done.wait(30)


def test_many_concurrent_execs_all_answer(tcp_agent):
    client, _ = tcp_agent
    results: dict[int, str] = {}

    def run(i: int) -> None:
        results[i] = client.exec(f"sleep 0.2; echo {i}").stdout

    threads = [threading.Thread(target=run, args=(i,)) for i in range(40)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)

    assert results == {i: f"{i}\n" for i in range(40)}


@pytest.mark.parametrize(
    "value",
    [{"a": [1, -2.5, None, True, False, "é\n\"\\"], "b": {}}, [], "plain", 12345678901234567890, {"u": "\u2028"}],
)
def test_the_lean_json_codec_agrees_with_the_json_module(value):
    text = json.dumps(value)

    assert agent.json_loads(text) == value
    assert json.loads(agent.json_dumps(value)) == value


@pytest.mark.parametrize("text", ["{bad", "", '{"a": 1', "[1] [2]", "NaN", '"\x01"'])
def test_the_lean_json_codec_rejects_what_json_rejects(text):
    with pytest.raises(ValueError):
        agent.json_loads(text)


def test_output_capture_keeps_the_head_and_counts_the_rest():
    capture = agent.Capture(5)

    for chunk in (b"abc", b"defg", b"hij"):
        capture.add(chunk)

    assert (bytes(capture.data), capture.dropped) == (b"abcde", 5)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to start the agent as another uid")
def test_an_agent_without_a_user_of_its_own_is_undumpable_so_commands_of_its_uid_cannot_read_it():
    """The kernel gives /proc/<pid> of an undumpable process to root: a command of the agent's uid cannot
    open its mem, environ or fds."""
    workspace = tempfile.mkdtemp(prefix="trove-agent-", dir="/tmp")  # reachable by uid 65000
    os.chmod(workspace, 0o755)
    process = subprocess.Popen(
        ["/usr/bin/setpriv", "--reuid=65000", "--regid=65000", "--clear-groups", "--", "/usr/bin/python3", "-I",
         "-S", str(AGENT), "--listen", "tcp:127.0.0.1:0", "--workspace", workspace],
        stdout=subprocess.PIPE, env={"PATH": os.environ["PATH"], "TROVE_AGENT_SECRET": SECRET}, text=True)
    try:
        client = AgentClient(process.stdout.readline().split()[-1], SECRET)

        peek = client.exec("id -u; cat /proc/$PPID/environ >/dev/null && echo read-it")

        assert peek.stdout == "65000\n" and "Permission denied" in peek.stderr
        assert os.stat(f"/proc/{process.pid}/mem").st_uid == 0
    finally:
        process.kill()
        process.wait()
        os.rmdir(workspace)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to start the agent as another uid")
@pytest.mark.parametrize("run_as", ["65000:65000", "1000:1000"], ids=["its-own-uid", "cannot-switch"])
def test_an_agent_that_cannot_give_commands_another_user_refuses_to_start(run_as):
    """Fail closed: the agent, as uid 65000 without CAP_SETUID, either is asked to run commands as itself or
    cannot switch to 1000; it exits before it serves anything."""
    done = subprocess.run(
        ["/usr/bin/setpriv", "--reuid=65000", "--regid=65000", "--clear-groups", "--", "/usr/bin/python3", "-I",
         "-S", str(AGENT), "--listen", "tcp:127.0.0.1:0", "--workspace", "/", "--run-as", run_as],
        capture_output=True, env={"PATH": os.environ["PATH"], "TROVE_AGENT_SECRET": SECRET}, text=True, timeout=30)

    assert done.returncode == 2 and "trove-agent ready" not in done.stdout
    assert "commands" in done.stderr and run_as.split(":")[0] in done.stderr
