"""The local bubblewrap backend, end to end: real sandboxes, real agent, real cgroups.

Sandbox roots are made with tempfile under /tmp (world-searchable), not pytest's 0700 basetemp, so that
bubblewrap runs as the unprivileged sandbox uid: the configuration these tests are about.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import uuid
from dataclasses import replace
from pathlib import Path

import pytest

from workers.sandboxes import procs
from workers.sandboxes.base import (
    AgentAuthError,
    AgentUnavailable,
    SandboxError,
    SandboxHandle,
    SandboxNotFound,
    SandboxSpec,
    SandboxStartFailed,
)
from workers.sandboxes.local import LocalBackend

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture
def make_sandbox(backend):
    """make_sandbox(**spec_fields) -> a ready handle; every sandbox made is destroyed afterwards."""
    names = []

    def make(**fields) -> SandboxHandle:
        name = fields.pop("name", unique_name())
        names.append(name)
        return backend.create(SandboxSpec(name=name, **fields))

    yield make
    for name in names:
        backend.destroy(name)


@pytest.fixture
def sandbox(make_sandbox) -> SandboxHandle:
    return make_sandbox()


def unique_name(prefix: str = "t") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def assert_nothing_left(backend: LocalBackend, name: str) -> None:
    sandbox_dir = os.path.join(backend.root, name)
    assert not os.path.exists(sandbox_dir)
    assert procs.processes_mentioning(sandbox_dir) == []
    assert [d for d in backend.cgroup_dirs(name) if os.path.exists(d)] == []
    with open("/proc/mounts") as f:
        assert sandbox_dir not in f.read()


# ---------------------------------------------------------------- exec


def test_exec_returns_stdout_stderr_and_exit_code(backend, sandbox):
    result = backend.exec(sandbox, "echo out; echo err >&2; exit 3")

    assert (result.exit_code, result.stdout, result.stderr) == (3, "out\n", "err\n")
    assert not result.timed_out and result.truncated_bytes == 0
    assert result.duration_ms > 0


class Refused(Exception):
    pass


def test_a_check_before_send_that_refuses_keeps_the_request_from_the_agent(backend, sandbox):
    seen = []

    def refuse() -> None:
        seen.append("checked")
        raise Refused("the caller's lease is stale")

    with pytest.raises(Refused):
        backend.exec(sandbox, "echo ran > ran.txt", before_send=refuse)
    with pytest.raises(Refused):
        backend.write_file(sandbox, "written.txt", b"x", before_send=refuse)

    assert seen == ["checked", "checked"]
    assert backend.exec(sandbox, "ls").stdout == ""  # neither the command nor the write reached the sandbox


def test_a_check_before_send_that_passes_runs_once_before_the_command(backend, sandbox):
    seen = []
    result = backend.exec(sandbox, "echo ran", before_send=lambda: seen.append("checked"))

    assert (seen, result.stdout) == (["checked"], "ran\n")


def test_exec_runs_in_the_workspace_with_cwd_and_env(backend, sandbox):
    backend.exec(sandbox, "mkdir sub")

    result = backend.exec(sandbox, 'pwd; echo "$GREETING"', cwd="sub", env={"GREETING": "hello"})

    assert result.stdout == "/workspace/sub\nhello\n"


def test_timeout_kills_the_command_and_its_background_child_but_not_the_sandbox(backend, sandbox):
    result = backend.exec(sandbox, "sleep 300 & echo $! > bg.pid; sleep 300", timeout=1)

    assert result.timed_out and result.exit_code is None
    background_alive = backend.exec(sandbox, "kill -0 $(cat bg.pid) 2>/dev/null && echo alive || echo gone")
    assert background_alive.stdout == "gone\n"
    assert backend.exec(sandbox, "echo still here").stdout == "still here\n"


def test_idle_timeout_kills_a_command_that_stops_printing(backend, sandbox):
    result = backend.exec(sandbox, "echo started; sleep 300", timeout=60, idle_timeout=0.5)

    assert result.idle_timed_out and not result.timed_out
    assert result.exit_code is None
    assert result.stdout == "started\n"


def test_output_beyond_the_cap_is_cut_and_counted(backend, sandbox):
    result = backend.exec(sandbox, "head -c 100000 /dev/zero | tr '\\0' a; head -c 5000 /dev/zero >&2",
                          max_output=1000)

    assert result.stdout == "a" * 1000
    assert len(result.stderr) == 1000
    assert result.truncated_bytes == 99000 + 4000
    assert result.exit_code == 0


def test_background_job_of_a_finished_command_keeps_running(backend, sandbox):
    backend.exec(sandbox, "sleep 300 > /dev/null 2>&1 & echo $! > server.pid")

    result = backend.exec(sandbox, "kill -0 $(cat server.pid) && echo running")

    assert result.stdout == "running\n"


# ---------------------------------------------------------------- files and auth


def test_write_then_read_a_file_in_the_workspace(backend, sandbox):
    backend.write_file(sandbox, "dir/data.bin", b"\x00\xffbytes")

    assert backend.read_file(sandbox, "dir/data.bin") == b"\x00\xffbytes"
    assert backend.exec(sandbox, "cat dir/data.bin | tail -c 5").stdout == "bytes"


@pytest.mark.parametrize("path", ["../meta.json", "/etc/passwd", "a/../../x", "escape/passwd"])
def test_file_access_outside_the_workspace_is_refused(backend, sandbox, path):
    backend.exec(sandbox, "ln -s /etc escape")

    with pytest.raises(SandboxError) as read_error:
        backend.read_file(sandbox, path)
    with pytest.raises(SandboxError) as write_error:
        backend.write_file(sandbox, path, b"x")

    for error in (read_error.value, write_error.value):
        assert "path" in error.reason and error.permanent
    assert backend.exec(sandbox, "test -e /etc/x || echo untouched").stdout == "untouched\n"


def test_several_files_are_written_in_one_exchange_in_order(backend, sandbox, monkeypatch):
    from workers.sandboxes import agent_client

    ops = []
    call = agent_client.AgentClient.call
    monkeypatch.setattr(agent_client.AgentClient, "call",
                        lambda self, op, fields, **kw: (ops.append(op), call(self, op, fields, **kw))[1])

    backend.write_files(sandbox, {"empty": b"", "a.txt": b"first", "dir/b.bin": b"\x00\xff"})

    assert ops == ["write_files"]
    assert backend.exec(sandbox, "cat a.txt; echo; od -An -tx1 dir/b.bin; wc -c < empty").stdout.split() == [
        "first", "00", "ff", "0"]
    # written as the commands' user (the agent dropped to it once for the batch), as write_file does
    assert backend.exec(sandbox, 'test "$(stat -c %u a.txt dir/b.bin | sort -u)" = "$(id -u)" && echo same').stdout == "same\n"


def test_files_past_the_batch_size_go_in_more_exchanges(backend, sandbox, monkeypatch):
    from workers.sandboxes import agent_client

    monkeypatch.setattr(agent_client, "WRITE_BATCH_BYTES", 10)
    ops = []
    call = agent_client.AgentClient.call

    def counting(self, op, fields, **kw):
        if op == "write_files":
            ops.append(len(fields["files"]))
        return call(self, op, fields, **kw)

    monkeypatch.setattr(agent_client.AgentClient, "call", counting)

    backend.write_files(sandbox, {"a": b"12345", "b": b"12345", "c": b"1", "big": b"x" * 40, "d": b"1"})

    assert ops == [2, 1, 1, 1]
    assert backend.exec(sandbox, "cat a b c d; echo; wc -c < big").stdout.split() == ["123451234511", "40"]


@pytest.mark.parametrize("path", ["../meta.json", "/etc/passwd", "escape/passwd"])
def test_a_batch_naming_a_path_outside_the_workspace_writes_none_of_its_files(backend, sandbox, path):
    backend.exec(sandbox, "ln -s /etc escape")

    with pytest.raises(SandboxError) as error:
        backend.write_files(sandbox, {"fine.txt": b"x", path: b"x"})

    assert "path" in error.value.reason and error.value.permanent
    assert backend.exec(sandbox, "test -e fine.txt || test -e /etc/x || echo untouched").stdout == "untouched\n"


def test_an_agent_without_write_files_gets_one_write_file_each(backend, sandbox, monkeypatch):
    from workers.sandboxes import agent_client

    ops = []
    call = agent_client.AgentClient.call

    def older_agent(self, op, fields, **kw):
        ops.append(op)
        if op == "write_files":  # what an agent from before the op answers
            raise SandboxError("agent write_files failed (bad_request): unknown op 'write_files'",
                               reason="agent_bad_request", permanent=True)
        return call(self, op, fields, **kw)

    monkeypatch.setattr(agent_client.AgentClient, "call", older_agent)
    backend.write_files(sandbox, {"a.txt": b"a", "b.txt": b"b"})

    assert ops == ["write_files", "write_file", "write_file"]
    assert backend.exec(sandbox, "cat a.txt b.txt").stdout == "ab"


def test_a_wrong_secret_is_refused(backend, sandbox):
    with pytest.raises(AgentAuthError):
        backend.exec(replace(sandbox, secret="not-the-secret"), "echo hi")


def test_files_written_inside_belong_to_the_unprivileged_host_uid(backend, sandbox):
    if backend.host_uid is None:
        pytest.skip("not running as root: bubblewrap runs as the current user")
    backend.exec(sandbox, "echo x > mine.txt")

    owner = os.stat(os.path.join(backend.root, sandbox.name, "workspace", "mine.txt")).st_uid

    assert owner == backend.host_uid != 0


# ---------------------------------------------------------------- lifecycle


def test_create_is_idempotent_for_the_same_name(backend, make_sandbox):
    name = unique_name()
    first = make_sandbox(name=name, labels={"trove.dev/fleet": "7"})

    second = backend.create(SandboxSpec(name=name, labels={"trove.dev/fleet": "7"}))

    assert (second.endpoint, second.secret, second.details["pid"]) == (
        first.endpoint, first.secret, first.details["pid"])
    assert [h.name for h in backend.list({"trove.dev/fleet": "7"})] == [name]


def test_racing_creates_of_one_name_make_one_sandbox(backend, make_sandbox):
    name = unique_name()
    handles = []
    threads = [threading.Thread(target=lambda: handles.append(backend.create(SandboxSpec(name=name))))
               for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    make_sandbox(name=name)  # registers it for cleanup; returns the same sandbox again

    assert len(handles) == 4
    assert len({(h.secret, h.details["pid"]) for h in handles}) == 1
    assert all(h.state == "ready" for h in handles)


def test_create_without_wait_returns_at_once_and_a_later_create_waits_for_ready(backend, make_sandbox):
    name = unique_name()
    started = backend.create(SandboxSpec(name=name), wait=False)

    ready = make_sandbox(name=name)

    assert started.state == "provisioning" and ready.state == "ready"
    assert ready.secret == started.secret
    assert backend.exec(ready, "echo up").stdout == "up\n"


def test_list_filters_by_labels_and_get_reports_ready(backend, make_sandbox):
    fleet = unique_name("fleet")
    mine = make_sandbox(labels={"trove.dev/fleet": fleet, "role": "a"})
    make_sandbox(labels={"trove.dev/fleet": "someone-else"})

    listed = backend.list({"trove.dev/fleet": fleet})

    assert [h.name for h in listed] == [mine.name]
    assert listed[0].labels == {"trove.dev/fleet": fleet, "role": "a"}
    assert backend.get(mine.name).state == "ready"


def test_destroy_leaves_no_process_dir_mount_or_cgroup_and_is_idempotent(backend):
    name = unique_name()
    handle = backend.create(SandboxSpec(name=name, memory_mb=256, pids=128))
    backend.exec(handle, "sleep 300 > /dev/null 2>&1 &")
    cgroups = handle.details["cgroups"]
    assert cgroups and all(os.path.isdir(d) for d in cgroups)

    backend.destroy(name)
    backend.destroy(name)

    assert_nothing_left(backend, name)
    assert not any(os.path.exists(d) for d in cgroups)
    with pytest.raises(SandboxNotFound):
        backend.get(name)
    with pytest.raises(AgentUnavailable):
        backend.exec(handle, "echo hi")


def test_without_cgroups_sandboxes_still_run_and_destroy_cleanly():
    root = tempfile.mkdtemp(prefix="trove-nocg-")
    os.chmod(root, 0o711)
    backend = LocalBackend(root, use_cgroups=False)
    name = unique_name()
    try:
        handle = backend.create(SandboxSpec(name=name, memory_mb=64))
        backend.exec(handle, "sleep 300 > /dev/null 2>&1 &")

        assert not backend.limits_enforced and handle.details["cgroups"] == []
        assert backend.exec(handle, "echo fine").stdout == "fine\n"
    finally:
        backend.destroy(name)
        assert_nothing_left(backend, name)
        shutil.rmtree(root)


def test_a_sandbox_outlives_the_process_that_created_it(backend):
    name = unique_name()
    creator = textwrap.dedent(f"""
        import os, sys
        sys.path.insert(0, {str(REPO)!r})
        from workers.sandboxes.local import LocalBackend
        from workers.sandboxes.base import SandboxSpec
        LocalBackend({backend.root!r}).create(SandboxSpec(name={name!r}))
        print("created", flush=True)
        os.kill(os.getpid(), 9)
    """)
    done = subprocess.run([sys.executable, "-c", creator], capture_output=True, text=True, timeout=60)
    assert done.returncode == -signal.SIGKILL and done.stdout == "created\n", done.stderr

    handle = backend.get(name)

    assert handle.state == "ready"
    assert backend.exec(handle, "echo alive").stdout == "alive\n"
    backend.destroy(name)
    assert_nothing_left(backend, name)


def test_killing_the_supervisor_takes_the_sandbox_down_and_list_reports_it_failed(backend, make_sandbox):
    handle = make_sandbox(labels={"case": "supervisor-killed"})
    agent_pid_inside = backend.exec(handle, "echo $PPID").stdout  # the agent's pid, as the sandbox sees it
    assert agent_pid_inside.strip()

    os.kill(handle.details["pid"], signal.SIGKILL)

    assert procs.wait_gone(lambda: backend.get(handle.name).state == "failed", timeout=10)
    assert procs.wait_gone(lambda: procs.processes_mentioning(os.path.join(backend.root, handle.name)) == [],
                           timeout=10)
    [listed] = backend.list({"case": "supervisor-killed"})
    assert listed.state == "failed" and "exit" in listed.reason
    with pytest.raises(AgentUnavailable):
        backend.exec(handle, "echo hi", timeout=2)


# ---------------------------------------------------------------- isolation


@pytest.mark.parametrize("network", ["none", "proxy-only"])  # proxy-only without a proxy socket: no network
def test_the_sandbox_has_no_network(backend, make_sandbox, network):
    sandbox = make_sandbox(network=network)
    probe = textwrap.dedent("""
        import socket
        try:
            socket.create_connection(("127.0.0.1", 5432), timeout=2)
            print("connected")
        except OSError as exc:
            print("refused", type(exc).__name__)
        try:
            socket.create_connection(("10.0.0.1", 80), timeout=2)
            print("routed")
        except OSError as exc:
            print("unreachable", type(exc).__name__)
    """)
    backend.write_file(sandbox, "probe.py", probe.encode())

    result = backend.exec(sandbox, "python3 probe.py; grep -c : /proc/net/dev; grep -v lo: /proc/net/dev | tail -n +3")

    lines = result.stdout.splitlines()
    assert lines[0].startswith("refused") and lines[1].startswith("unreachable")
    assert lines[2] == "1"  # one interface: lo
    assert lines[3:] == []


def test_the_sandbox_runs_as_a_non_root_user_and_cannot_write_system_paths(backend, sandbox):
    result = backend.exec(sandbox, "id -u; for p in /usr/x /etc/x /x /opt/trove/x; do touch $p 2>/dev/null && echo wrote $p; done; true")

    assert result.stdout == "1000\n"


def test_the_sandbox_sees_only_its_own_processes(backend, sandbox):
    result = backend.exec(sandbox, "ls /proc | grep -c '^[0-9]'; cat /proc/1/cmdline | tr '\\0' ' '")

    count, init = result.stdout.splitlines()
    assert int(count) <= 6  # bwrap's init, the agent, this bash and its pipeline
    assert init.startswith("/usr/bin/bwrap")


def test_the_sandbox_environment_does_not_inherit_the_host_environment(backend, make_sandbox, monkeypatch):
    monkeypatch.setenv("TROVE_TEST_HOST_SECRET", "leak")
    handle = make_sandbox(env={"FROM_SPEC": "yes"})

    result = backend.exec(handle, 'echo "${TROVE_TEST_HOST_SECRET:-absent} $FROM_SPEC ${TROVE_AGENT_SECRET:-none}"')

    assert result.stdout == "absent yes none\n"


def test_a_memory_hog_is_killed_at_the_memory_limit(backend, make_sandbox):
    if not backend.limits_enforced:
        pytest.skip("cgroup limits are not available on this host")
    handle = make_sandbox(memory_mb=64)
    hog = "python3 -c 'b = bytearray(128 * 1024 * 1024); b[::4096] = b\"x\" * len(b[::4096]); print(\"survived\")'"

    result = backend.exec(handle, hog, timeout=60)

    assert result.exit_code not in (0, None) and "survived" not in result.stdout
    assert backend.exec(handle, "echo still here").stdout == "still here\n"


def test_a_fork_bomb_is_stopped_by_the_pids_limit(backend, make_sandbox):
    if not backend.limits_enforced:
        pytest.skip("cgroup limits are not available on this host")
    handle = make_sandbox(pids=64)
    bomb = textwrap.dedent("""
        import os, time
        children = []
        for _ in range(300):  # bounded: at most 300 even if no limit held
            try:
                pid = os.fork()
            except OSError:
                break
            if pid == 0:
                time.sleep(60)
                os._exit(0)
            children.append(pid)
        print(len(children), flush=True)
        for pid in children:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
    """)
    backend.write_file(handle, "bomb.py", bomb.encode())

    result = backend.exec(handle, "python3 bomb.py", timeout=60)

    forked = int(result.stdout)
    assert 0 < forked < 64
    assert backend.exec(handle, "echo still here").stdout == "still here\n"


def test_disk_mb_limits_the_sandbox_tmp(backend, make_sandbox):
    handle = make_sandbox(disk_mb=1)

    result = backend.exec(handle, "head -c 2000000 /dev/zero > /tmp/big; echo $?")

    assert result.stdout.strip() != "0" and "No space left" in result.stderr


def test_cgroup_limits_are_written_for_the_spec(backend, make_sandbox):
    if not backend.limits_enforced:
        pytest.skip("cgroup limits are not available on this host")
    handle = make_sandbox(memory_mb=96, pids=50, cpu=0.5)

    values = {}
    for directory in handle.details["cgroups"]:
        for filename in ("memory.limit_in_bytes", "memory.max", "pids.max", "cpu.cfs_quota_us", "cpu.max"):
            if os.path.exists(os.path.join(directory, filename)):
                values[filename] = Path(directory, filename).read_text().split()[0]

    assert values.get("memory.limit_in_bytes", values.get("memory.max")) == str(96 * 1024 * 1024)
    assert values["pids.max"] == "50"
    assert values.get("cpu.cfs_quota_us", values.get("cpu.max")) == "50000"


# ---------------------------------------------------------------- startup failures and network policy


def test_a_missing_rootfs_fails_permanently_and_leaves_nothing(backend):
    name = unique_name()

    with pytest.raises(SandboxStartFailed) as failure:
        backend.create(SandboxSpec(name=name, rootfs="/nonexistent/rootfs"))

    assert failure.value.permanent and failure.value.reason == "bad_rootfs"
    assert_nothing_left(backend, name)


def test_a_sandbox_that_dies_at_startup_reports_bwraps_error_and_leaves_nothing(backend):
    name = unique_name()
    empty_rootfs = tempfile.mkdtemp(prefix="trove-empty-rootfs-")
    os.chmod(empty_rootfs, 0o755)
    os.mkdir(os.path.join(empty_rootfs, "etc"))
    try:
        with pytest.raises(SandboxStartFailed) as failure:
            backend.create(SandboxSpec(name=name, rootfs=empty_rootfs))
    finally:
        os.rmdir(os.path.join(empty_rootfs, "etc"))
        os.rmdir(empty_rootfs)

    assert failure.value.reason == "exited"
    assert "bwrap" in str(failure.value) and "python3" in str(failure.value)
    assert_nothing_left(backend, name)


def test_allow_list_network_is_refused_without_host_network(backend):
    name = unique_name()

    with pytest.raises(SandboxStartFailed) as failure:
        backend.create(SandboxSpec(name=name, network="allow-list"))

    assert failure.value.permanent and failure.value.reason == "network_policy_unsupported"
    assert_nothing_left(backend, name)


def test_proxy_only_reaches_the_proxy_socket_and_nothing_else(backend, make_sandbox):
    proxy_dir = tempfile.mkdtemp(prefix="trove-proxy-")
    os.chmod(proxy_dir, 0o711)
    proxy_path = os.path.join(proxy_dir, "proxy.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(proxy_path)
    os.chmod(proxy_path, 0o666)
    server.listen(8)

    def serve_one() -> None:
        conn, _ = server.accept()
        with conn:
            conn.sendall(b"proxy says: " + conn.recv(1024))

    threading.Thread(target=serve_one, daemon=True).start()
    try:
        handle = make_sandbox(network="proxy-only", proxy_socket=proxy_path)
        client = textwrap.dedent("""
            import os, socket, urllib.parse
            url = urllib.parse.urlparse(os.environ["TROVE_PROXY_URL"])
            with socket.create_connection((url.hostname, url.port), timeout=5) as s:
                s.sendall(b"hello")
                s.shutdown(socket.SHUT_WR)
                print(s.recv(1024).decode())
        """)
        backend.write_file(handle, "client.py", client.encode())

        result = backend.exec(handle, "python3 client.py; grep -c : /proc/net/dev", timeout=30)
    finally:
        server.close()
        os.unlink(proxy_path)
        os.rmdir(proxy_dir)

    assert result.stdout == "proxy says: hello\n1\n", result.stderr


def test_a_root_too_deep_for_a_socket_path_still_works():
    deep = tempfile.mkdtemp(prefix="trove-" + "d" * 60 + "-")
    os.chmod(deep, 0o711)
    backend = LocalBackend(os.path.join(deep, "x" * 40))
    name = unique_name("long-name-" + "n" * 30)
    try:
        handle = backend.create(SandboxSpec(name=name))
        assert len(handle.endpoint) > 108

        assert backend.exec(handle, "echo reached").stdout == "reached\n"
    finally:
        backend.destroy(name)
        assert_nothing_left(backend, name)
        shutil.rmtree(deep)


def test_bad_names_are_refused(backend):
    for name in ("../escape", ".hidden", "", "a/b", "x" * 64):
        with pytest.raises(SandboxError) as error:
            backend.create(SandboxSpec(name=name))
        assert error.value.permanent
