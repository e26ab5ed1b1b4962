"""Reward integrity: a command inside a real bubblewrap sandbox attacks the in-sandbox agent, and the host must
never receive a forged result. After each attack the next exec either reaches the real agent and reports the
true exit code, or fails as an infrastructure error (AgentUnavailable / AgentIntegrityError); it never says
"exit 0" for a command that failed.

Run as root, the way the workers run (the commands' uid and the agent's uid then differ); the attacks that need
that are skipped otherwise.
"""

from __future__ import annotations

import json
import os
import re
import socket
import stat
import threading
import uuid

import pytest

from workers.sandboxes import agent, procs
from workers.sandboxes.base import (
    AgentAuthError,
    AgentIntegrityError,
    AgentUnavailable,
    SandboxError,
    SandboxHandle,
    SandboxSpec,
)
from workers.sandboxes.local import LocalAgentClient, LocalBackend

as_root = pytest.mark.skipif(os.geteuid() != 0, reason="two sandbox users need root (as the workers run)")

# The attack that forged rewards: an impostor agent takes over every socket it can find or make (the agent's
# old /run/trove/agent.sock first) and answers every request with success. It speaks both protocols: the old
# one (the host spoke first and sent the raw secret, which it keeps) and the current one (it greets like the
# agent, then signs with a mac it must make up).
IMPOSTOR = r'''
import json, os, socket, stat, sys, threading
FORGED = {"ok": True, "exit_code": 0, "stdout": "", "stderr": "", "duration_ms": 1.0, "timed_out": False,
          "idle_timed_out": False, "truncated_bytes": 0, "pid": 1, "content_b64": ""}

def answer(conn):
    try:
        conn.settimeout(0.5)
        try:
            first = conn.recv(65536)
        except socket.timeout:
            first = b""
        if first:
            with open("/tmp/impostor-captured", "ab") as f:
                f.write(first)
        else:
            conn.sendall(b"trove-agent/2 " + b"0" * 32 + b"\n")
            conn.settimeout(5)
            first = conn.recv(65536)
        body = json.dumps(FORGED).encode()
        conn.sendall((b"" if first.startswith(b"{") else b"0" * 64 + b" ") + body + b"\n")
    except OSError:
        pass
    finally:
        conn.close()

def serve(listener):
    while True:
        conn, _ = listener.accept()
        threading.Thread(target=answer, args=(conn,), daemon=True).start()

def visible_sockets():
    for top in ("/run", "/tmp", "/workspace", "/var", "/dev/shm", "/opt", "/proc/1/root/run"):
        for root, _, files in os.walk(top):
            for name in files:
                path = os.path.join(root, name)
                try:
                    if stat.S_ISSOCK(os.lstat(path).st_mode):
                        yield path
                except OSError:
                    pass

taken = []
for path in sorted(set(visible_sockets()) | {"/run/trove/agent.sock"}):
    try:
        if os.path.lexists(path):
            os.unlink(path)
        listener = socket.socket(socket.AF_UNIX)
        listener.bind(path)
        listener.listen(64)
    except OSError:
        continue
    taken.append(path)
    threading.Thread(target=serve, args=(listener,), daemon=True).start()
print(json.dumps({"taken": taken}), flush=True)
threading.Event().wait()
'''

# Runs the impostor in the background (it outlives the command) and prints what it took over.
TAKEOVER = (
    "cat > /tmp/impostor.py <<'PY'\n" + IMPOSTOR + "\nPY\n"
    "setsid python3 /tmp/impostor.py > /tmp/impostor.out 2>&1 < /dev/null &\n"
    "for i in $(seq 100); do [ -s /tmp/impostor.out ] && break; sleep 0.05; done\n"
    "cat /tmp/impostor.out\n"
)


@pytest.fixture
def sandbox(backend):
    name = f"integrity-{uuid.uuid4().hex[:10]}"
    handle = backend.create(SandboxSpec(name=name))
    yield handle
    backend.destroy(name)


def agent_pid(backend: LocalBackend, handle: SandboxHandle) -> str:
    """The agent's pid as the sandbox sees it: every command's parent."""
    return backend.exec(handle, "echo $PPID").stdout.strip()


def assert_the_real_agent_answers(backend: LocalBackend, handle: SandboxHandle, pid_before: str) -> None:
    """A failing command reports its own exit code (not a forged 0), and the agent is the one we started."""
    assert backend.exec(handle, "exit 3").exit_code == 3
    assert backend.exec(handle, "echo real; exit 1").stdout == "real\n"
    assert agent_pid(backend, handle) == pid_before


# ---------------------------------------------------------------- attacks from inside the sandbox


@as_root
def test_commands_and_file_operations_run_as_the_sandbox_user_and_the_agent_as_another(backend, sandbox):
    status = backend.exec(sandbox, "grep -E '^(Uid|Gid|CapPrm|CapEff|CapAmb|NoNewPrivs):' /proc/self/status; "
                                   "grep '^Uid:' /proc/$PPID/status").stdout.split("\n")

    assert [line.split() for line in status[:7]] == [
        ["Uid:", "1000", "1000", "1000", "1000"], ["Gid:", "1000", "1000", "1000", "1000"],
        ["CapPrm:", "0" * 16], ["CapEff:", "0" * 16], ["CapAmb:", "0" * 16], ["NoNewPrivs:", "1"],
        ["Uid:", "0", "0", "0", "0"]]  # the agent: uid 0 inside, its own host uid outside
    backend.write_file(sandbox, "written.txt", b"from the host\n")
    written = os.stat(os.path.join(backend.root, sandbox.name, "workspace", "written.txt"))
    assert written.st_uid == backend.host_uid != backend.agent_uid
    backend.exec(sandbox, "echo private > mine.txt; chmod 600 mine.txt")
    assert backend.read_file(sandbox, "mine.txt") == b"private\n"  # read with the owner's rights, not the agent's
    backend.exec(sandbox, "mkfifo trap")
    with pytest.raises(SandboxError, match="not a regular file"):
        backend.read_file(sandbox, "trap")  # a FIFO in a file's place does not hang the agent
    large = os.urandom(3 * 1024 * 1024)  # many times a pipe's buffer, through the dropped child both ways
    backend.write_file(sandbox, "deep/large.bin", large)
    assert backend.read_file(sandbox, "deep/large.bin") == large



def test_an_impostor_cannot_take_over_the_agents_socket(backend, sandbox):
    pid = agent_pid(backend, sandbox)
    socket_before = os.lstat(os.path.join(backend.root, sandbox.name, "agent.sock"))

    attack = backend.exec(sandbox, TAKEOVER, timeout=30)

    taken = json.loads(attack.stdout.splitlines()[-1])["taken"]
    assert "/run/trove/agent.sock" not in taken  # the agent's socket is nowhere in the sandbox's view
    assert_the_real_agent_answers(backend, sandbox, pid)
    socket_after = os.lstat(os.path.join(backend.root, sandbox.name, "agent.sock"))
    assert (socket_after.st_ino, socket_after.st_uid) == (socket_before.st_ino, os.geteuid())
    assert backend.exec(sandbox, "cat /tmp/impostor-captured 2>/dev/null | wc -c").stdout.strip() == "0"


@as_root
def test_commands_cannot_kill_stop_or_trace_the_agent(backend, sandbox):
    pid = agent_pid(backend, sandbox)

    attack = backend.exec(sandbox, f"""
        kill -STOP {pid}; echo "stop=$?"
        kill -9 {pid}; echo "kill=$?"
        python3 -c 'import ctypes; print("ptrace=%d" % ctypes.CDLL(None).ptrace(16, {pid}, 0, 0))'
        for p in $(ls /proc | grep '^[0-9]'); do [ "$p" = $$ ] || kill -9 $p 2>/dev/null; done
        kill -9 -1 2>/dev/null; echo survived
    """)

    assert "stop=1" in attack.stdout and "kill=1" in attack.stdout and "ptrace=-1" in attack.stdout
    assert "survived" in attack.stdout
    assert_the_real_agent_answers(backend, sandbox, pid)


@as_root
def test_commands_cannot_read_the_secret_from_proc_or_the_environment(backend, sandbox):
    pid = agent_pid(backend, sandbox)

    attack = backend.exec(sandbox, f"""
        env; cat /proc/*/environ /proc/*/cmdline 2>/dev/null | tr '\\0' '\\n'
        for p in {pid} 1; do
          for f in environ mem maps fd/0 fd/1 fd/3 fd/4; do
            head -c 100000 /proc/$p/$f >/dev/null 2>&1 && echo "LEAK=$p/$f"
          done
          ls /proc/$p/fd >/dev/null 2>&1 && echo "LEAK=$p/fd"
        done
        python3 - <<'PY'
import os
pid = {pid}
try:
    with open(f"/proc/{{pid}}/mem", "rb") as mem, open(f"/proc/{{pid}}/maps") as maps:
        print("LEAK=" + "mem")
except OSError as exc:
    print("mem:", exc.strerror)
PY
        grep -rs . /opt/trove/agent /run /tmp 2>/dev/null | head -c 100000
    """, max_output=1024 * 1024)

    assert sandbox.secret not in attack.stdout + attack.stderr
    assert not re.search(r"LEAK=[0-9m]", attack.stdout)
    assert "Permission denied" in attack.stdout  # the agent's /proc/<pid>/mem, for one
    assert_the_real_agent_answers(backend, sandbox, pid)


def test_symlinks_planted_in_the_sandbox_do_not_redirect_the_host(backend, sandbox):
    pid = agent_pid(backend, sandbox)

    backend.exec(sandbox, TAKEOVER, timeout=30)
    backend.exec(sandbox, """
        for target in /tmp/impostor.sock agent.sock ../agent.sock; do
          ln -sf /tmp/impostor-sock "/workspace/$target" 2>/dev/null
        done
        ln -sf /tmp /workspace/run; mkdir -p /workspace/.trove; ln -sf /tmp/x /workspace/.trove/agent.sock
        true
    """)

    assert_the_real_agent_answers(backend, sandbox, pid)
    host_socket = os.path.join(backend.root, sandbox.name, "agent.sock")
    assert stat.S_ISSOCK(os.lstat(host_socket).st_mode)


# ---------------------------------------------------------------- the host's own checks


def test_the_host_refuses_a_symlink_or_a_foreign_socket_in_the_agents_place(backend, sandbox, tmp_path):
    """As if something had got write access to the sandbox's host directory: the host connects to nothing
    but its own socket file there, and the socket the symlink points at hears nothing."""
    bait = Bait(str(tmp_path / "bait.sock"))
    host_socket = os.path.join(backend.root, sandbox.name, "agent.sock")
    moved = host_socket + ".real"
    os.rename(host_socket, moved)
    try:
        os.symlink(bait.path, host_socket)
        with pytest.raises(AgentIntegrityError, match="symlink"):
            backend.exec(sandbox, "exit 1")
        os.unlink(host_socket)

        foreign = Bait(host_socket)
        os.chown(host_socket, backend.host_uid or 12345, backend.host_uid or 12345)
        with pytest.raises(AgentIntegrityError, match="owned by uid"):
            backend.exec(sandbox, "exit 1")
        foreign.close()
    finally:
        if os.path.lexists(host_socket):
            os.unlink(host_socket)
        os.rename(moved, host_socket)

    assert bait.connections == 0
    assert backend.exec(sandbox, "exit 5").exit_code == 5


def test_an_impostor_without_the_secret_is_never_believed(backend, sandbox, tmp_path):
    """Something answering at the agent's address (no secret) gets its "exit 0" rejected as forged."""
    impostor = Bait(str(tmp_path / "impostor.sock"), greet=True,
                    reply=b"0" * 64 + b' {"ok": true, "exit_code": 0, "stdout": "", "stderr": ""}\n')
    client = LocalAgentClient(f"unix:{impostor.path}", sandbox.secret)

    with pytest.raises(AgentIntegrityError, match="not signed"):
        client.exec("exit 1")
    with pytest.raises(AgentIntegrityError):
        client.read_file("tests/test_task.py")
    assert impostor.connections == 2
    assert sandbox.secret.encode() not in impostor.received  # what it heard gives the secret away nowhere


def test_a_tampered_reply_is_rejected(backend, sandbox, tmp_path):
    """A relay between host and agent that turns the agent's exit 1 into exit 0 breaks the reply's mac."""
    relay = Relay(str(tmp_path / "relay.sock"), sandbox.endpoint,
                  rewrite=lambda reply: reply.replace(b'"exit_code": 1', b'"exit_code": 0'))

    with pytest.raises(AgentIntegrityError, match="not signed"):
        LocalAgentClient(f"unix:{relay.path}", sandbox.secret).exec("exit 1")
    assert relay.rewrote


def test_a_captured_request_replayed_to_the_agent_is_refused(backend, sandbox, tmp_path):
    relay = Relay(str(tmp_path / "relay.sock"), sandbox.endpoint)
    LocalAgentClient(f"unix:{relay.path}", sandbox.secret).exec("echo once >> replayed.txt")
    captured = relay.requests[0]
    assert sandbox.secret.encode() not in captured

    reply = replay(sandbox.endpoint, captured)

    assert reply["ok"] is False and reply["error"] == "auth"
    assert backend.read_file(sandbox, "replayed.txt") == b"once\n"
    with pytest.raises(AgentAuthError):
        LocalAgentClient(sandbox.endpoint, "not-the-secret").exec("echo twice >> replayed.txt")
    assert backend.read_file(sandbox, "replayed.txt") == b"once\n"


def test_a_dead_agent_fails_the_next_exec_at_once_and_the_sandbox_reports_failed(backend, sandbox):
    """Killed from outside (commands cannot): the host gets an infrastructure error, never an answer."""
    init_pid = json.loads(open(os.path.join(backend.root, sandbox.name, "status.json")).readline())["child-pid"]
    (agent_host_pid,) = procs.children(init_pid)
    os.kill(agent_host_pid, 9)

    with pytest.raises(AgentUnavailable):
        backend.exec(sandbox, "exit 1")
    assert wait_until(lambda: backend.get(sandbox.name).state == "failed")


# ---------------------------------------------------------------- helpers


class Bait:
    """A Unix socket server that records what connects; with `greet` it opens like an agent, then sends
    `reply` to whatever it is told."""

    def __init__(self, path: str, *, greet: bool = False, reply: bytes = b"") -> None:
        self.path, self.greet, self.reply = path, greet, reply
        self.connections = 0
        self.received = b""
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(path)
        self.server.listen(8)
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            self.connections += 1
            with conn:
                if self.greet:
                    conn.sendall(agent.GREETING + b"1" * 32 + b"\n")
                self.received += conn.recv(65536)
                if self.reply:
                    conn.sendall(self.reply)

    def close(self) -> None:
        self.server.close()


class Relay:
    """A man in the middle on a socket of its own: passes one exchange at a time to the agent, records the
    host's request lines, and may rewrite the agent's reply."""

    def __init__(self, path: str, agent_endpoint: str, rewrite=None) -> None:
        self.path, self.agent_path, self.rewrite = path, agent_endpoint.removeprefix("unix:"), rewrite
        self.requests: list[bytes] = []
        self.rewrote = False
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(path)
        self.server.listen(8)
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            host, _ = self.server.accept()
            with host, connect_to(self.agent_path) as upstream:
                agent_side, host_side = upstream.makefile("rb"), host.makefile("rb")
                host.sendall(agent_side.readline())  # the greeting
                request = host_side.readline()
                self.requests.append(request)
                upstream.sendall(request)
                reply = agent_side.readline()
                if self.rewrite is not None:
                    changed = self.rewrite(reply)
                    self.rewrote = changed != reply
                    reply = changed
                host.sendall(reply)


def connect_to(path: str) -> socket.socket:
    fd = os.open(path, os.O_PATH)
    try:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(30)
        sock.connect(f"/proc/self/fd/{fd}")
    finally:
        os.close(fd)
    return sock


def replay(endpoint: str, request_line: bytes) -> dict:
    """Send a recorded request line on a new connection; return the agent's reply (checked only for form)."""
    with connect_to(endpoint.removeprefix("unix:")) as sock:
        reader = sock.makefile("rb")
        assert reader.readline().startswith(agent.GREETING)
        sock.sendall(request_line)
        return json.loads(reader.readline().split(b" ", 1)[1])


def wait_until(predicate, attempts: int = 200) -> bool:
    event = threading.Event()
    for _ in range(attempts):
        if predicate():
            return True
        event.wait(0.05)
    return False


# ---------------------------------------------------------------- through the rollout runner


@pytest.mark.django_db(transaction=True)
def test_a_policy_that_attempts_the_takeover_on_a_failing_task_gets_reward_0(
    local_backend, unix_proxy, model_upstream, proxy_only_fleet
):
    """The reported attack end to end: the policy (an external harness, so a command of its own choosing
    inside the sandbox) stands up an impostor agent and exits; the task's evaluation fails for real. The
    runner's evaluation must record that failure, not the impostor's "exit 0"."""
    from tests.webapp.rollouts.jobs_factories import make_endpoint
    from webapp.rollouts.models import Rollout
    from webapp.rollouts.services import job_create, taskset_upsert
    from workers.rollout_runner import rollout_run

    task_set = taskset_upsert(name=f"takeover-{uuid.uuid4().hex[:6]}", description="", source="api", tasks=[{
        "key": "unsolvable", "instruction": "Make status.txt say fixed.", "eval_command": "grep -qx fixed status.txt",
        "files": {"status.txt": "broken\n"},
    }])
    job = job_create(task_set=task_set, fleet=proxy_only_fleet, endpoint=make_endpoint(model_upstream.url),
                     model_name="stand-in", enqueue=lambda rollout_id: None, harness="external",
                     harness_command=TAKEOVER)
    rollout = job.rollouts.get()

    status = rollout_run(rollout_id=rollout.pk, worker="test-worker")

    rollout.refresh_from_db()
    assert status == Rollout.Status.FAILED == rollout.status
    assert rollout.reward == 0.0
    trajectory = rollout.trajectory
    assert trajectory.reward == 0.0 and trajectory.success is False
    harness = trajectory.steps.get(kind="command", payload__harness="external")
    assert harness.exit_code == 0  # the takeover ran (and found no agent socket to take)
    assert trajectory.steps.get(kind="eval").exit_code == 1


# The other attacks the policy can make on the agent from its own harness command: each must leave the
# evaluation to the real agent, so the failing task still ends with reward 0 (not an infrastructure error,
# which would let a policy dodge its bad score).
KILL_EVERYTHING = (
    "for p in $(ls /proc | grep '^[0-9]'); do [ \"$p\" = $$ ] || kill -STOP $p 2>/dev/null; done\n"
    "for p in $(ls /proc | grep '^[0-9]'); do [ \"$p\" = $$ ] || kill -9 $p 2>/dev/null; done\n"
    "kill -9 -1 2>/dev/null; echo survived; exit 0\n"
)
PLANT_SYMLINKS = TAKEOVER + (
    "for target in agent.sock ../agent.sock .trove/agent.sock; do\n"
    "  mkdir -p \"$(dirname \"/workspace/$target\")\" 2>/dev/null; ln -sf /tmp/impostor.sock \"/workspace/$target\" 2>/dev/null\n"
    "done\n"
    "ln -sfn /tmp /workspace/run 2>/dev/null; true\n"
)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("attack", [
    pytest.param(KILL_EVERYTHING, id="kill-and-stop-every-process", marks=as_root),
    pytest.param(PLANT_SYMLINKS, id="impostor-behind-planted-symlinks"),
])
def test_a_policy_that_attacks_the_agent_from_its_harness_on_a_failing_task_gets_reward_0(
    attack, local_backend, unix_proxy, model_upstream, proxy_only_fleet
):
    from tests.webapp.rollouts.jobs_factories import make_endpoint
    from webapp.rollouts.models import Rollout
    from webapp.rollouts.services import job_create, taskset_upsert
    from workers.rollout_runner import rollout_run

    task_set = taskset_upsert(name=f"attack-{uuid.uuid4().hex[:6]}", description="", source="api", tasks=[{
        "key": "unsolvable", "instruction": "Make status.txt say fixed.", "eval_command": "grep -qx fixed status.txt",
        "files": {"status.txt": "broken\n"},
    }])
    job = job_create(task_set=task_set, fleet=proxy_only_fleet, endpoint=make_endpoint(model_upstream.url),
                     model_name="stand-in", enqueue=lambda rollout_id: None, harness="external",
                     harness_command=attack)
    rollout = job.rollouts.get()

    status = rollout_run(rollout_id=rollout.pk, worker="test-worker")

    rollout.refresh_from_db()
    assert status == Rollout.Status.FAILED == rollout.status, rollout.error
    assert rollout.reward == 0.0
    trajectory = rollout.trajectory
    assert trajectory.reward == 0.0 and trajectory.success is False
    assert trajectory.steps.get(kind="command", payload__harness="external").exit_code == 0  # the attack ran
    assert trajectory.steps.get(kind="eval").exit_code == 1


@pytest.mark.django_db(transaction=True)
def test_a_rollout_whose_agent_dies_ends_as_an_infrastructure_error_without_a_reward(
    local_backend, unix_proxy, model_upstream, proxy_only_fleet
):
    """The agent killed while the policy runs (from outside: commands cannot): the runner hears a refused or
    dropped connection, never an answer, and the attempt is retried or ends infra_error, with no reward."""
    from experience.models import Trajectory
    from tests.webapp.rollouts.jobs_factories import make_endpoint
    from webapp.rollouts.models import Rollout
    from webapp.rollouts.services import job_create, taskset_upsert
    from workers.rollout_runner import rollout_run

    task_set = taskset_upsert(name=f"dies-{uuid.uuid4().hex[:6]}", description="", source="api", tasks=[{
        "key": "passes", "instruction": "Nothing to do.", "eval_command": "true", "files": {"README.md": "x\n"},
    }])
    job = job_create(task_set=task_set, fleet=proxy_only_fleet, endpoint=make_endpoint(model_upstream.url),
                     model_name="stand-in", enqueue=lambda rollout_id: None, harness="external",
                     harness_command="touch started.flag; sleep 120")
    rollout = job.rollouts.get()
    killer = threading.Thread(target=kill_the_agent_once_started, args=(local_backend,), daemon=True)
    killer.start()

    status = rollout_run(rollout_id=rollout.pk, worker="test-worker")

    killer.join(30)
    rollout.refresh_from_db()
    assert status == rollout.status and status in (Rollout.Status.QUEUED, Rollout.Status.INFRA_ERROR)
    assert rollout.reward is None
    (attempt,) = Trajectory.objects.filter(metadata__rollout_id=rollout.pk)
    assert attempt.status == "infra_error" and attempt.reward is None


def kill_the_agent_once_started(backend: LocalBackend) -> None:
    """SIGKILL the agent of the sandbox whose workspace holds started.flag, once one does."""
    for _ in range(1200):
        for name in os.listdir(backend.root):
            if os.path.exists(os.path.join(backend.root, name, "workspace", "started.flag")):
                with open(os.path.join(backend.root, name, "status.json")) as f:
                    init_pid = json.loads(f.readline())["child-pid"]
                for pid in procs.children(init_pid):
                    os.kill(pid, 9)
                return
        threading.Event().wait(0.05)
