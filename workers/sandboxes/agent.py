"""Trove sandbox agent: runs inside a sandbox and executes commands for the host. Stdlib only.

    python3 agent.py --listen stdin --run-as 1000:1000 [--workspace /workspace]   # the local backend
    python3 agent.py --listen tcp:0.0.0.0:7070 --secret-file /var/run/trove/agent/secret  # Kubernetes

Options:
    --listen stdin | unix:PATH | tcp:HOST:PORT
                                         where to serve the wire protocol (see workers/sandboxes/base.py).
                                         `stdin`: fd 0 is a Unix socket over which the host sends the secret
                                         together with an already bound Unix socket (SCM_RIGHTS) to listen
                                         on; its file lives in a host directory the sandbox never sees, so
                                         nothing inside can replace it or plant a symlink in its place
    --secret-file PATH                   read the per-sandbox secret from PATH (`-`: from stdin); without
                                         it (and without `--listen stdin`) the secret comes from env
                                         TROVE_AGENT_SECRET, which is then removed from the environment
                                         commands inherit
    --run-as UID:GID                     run commands, and the file operations, as this user with no
                                         capabilities (the agent itself runs as another uid that keeps only
                                         CAP_SETUID, CAP_SETGID and CAP_KILL): commands cannot signal, ptrace or read the
                                         agent, and the agent never opens a workspace path with its own rights
    --workspace DIR                      commands run here; read_file/write_file(s) are confined to it
                                         (default: the current directory)
    --forward tcp:127.0.0.1:PORT=unix:PATH
                                         also accept TCP on the sandbox loopback and pipe each connection to
                                         the Unix socket PATH (the recording proxy, for network "proxy-only")
    --max-request-bytes N                largest accepted request line (default 64 MiB)

Readiness contract: with `unix:PATH` the socket file appears (atomically, by rename) only once the agent
accepts connections; with `stdin` the handed-over socket refuses connections until the agent listens on it
(and again once the agent is gone: the agent holds the only copy); in every mode the agent prints
`trove-agent ready <endpoint>` on stdout once listening (with `tcp:HOST:0`, the endpoint names the port the
kernel chose).

Behaviour the host relies on:
- Each connection carries one exchange, authenticated both ways with HMAC-SHA256 under the per-sandbox
  secret, which never crosses the wire: the agent greets with a fresh nonce, the request is signed over that
  nonce (a captured request replayed on another connection, or a tampered one, gets {"ok": false, "error":
  "auth"}), and the response is signed over the nonce and the request's signature, so only the holder of the
  secret can answer (an impostor's "exit 0" fails the host's check). See `sign_request`/`sign_response`.
- exec runs `bash -c cmd` in a new session (so its own process group). The hard timeout and the idle
  (no output) timeout SIGKILL that whole process group, never the agent. Background jobs of a command
  that exits on its own are left running (a command may start a server for the next one); the agent stops
  waiting for their output shortly after the command exits.
- Output is capped per stream at `max_output` bytes; the bytes cut are counted in `truncated_bytes`.
- Each connection is served by its own thread, so slow commands do not block pings or other execs.

Startup time is most of a local sandbox's creation cost (the interpreter starts in ~10 ms of CPU; the
usual json, socket, threading, subprocess, hmac imports would add as much again, mostly for re, enum and
OpenSSL). So the agent uses the C modules under them (_json, _socket, _thread, _sha256) through the few
helpers in the "lean stdlib" section below, and starts commands with os.posix_spawn (or, to switch uid,
os.fork). Requires CPython 3.9+ on Linux.
"""

from __future__ import annotations

import _socket
import _thread
import binascii
import os
import select
import sys
import time

# hmac.compare_digest is this very function; importing it from here skips hashlib/OpenSSL at startup.
from _operator import _compare_digest as compare_digest

SIGKILL = 9  # the signal module pulls in enum at import; its value is fixed on Linux
DEFAULT_MAX_REQUEST = 64 * 1024 * 1024
MAX_FILE_READ = 64 * 1024 * 1024
REQUEST_READ_TIMEOUT = 30.0  # a client that connects and says nothing holds a thread at most this long
DRAIN_GRACE = 0.1  # after the command exits, how long to wait for output its background jobs still hold
READ_CHUNK = 65536


# ---------------------------------------------------------------- lean stdlib
# json.loads / json.dumps, socket.accept and threading.Thread, built on the C modules the stdlib
# versions wrap, without importing re, enum, selectors and the rest at startup.


def _json_codec():
    """(loads, dumps) using the C scanner and encoder exactly as json.JSONDecoder/JSONEncoder set them
    up; falls back to the json module on an interpreter whose _json differs."""
    try:
        import _json

        class Context:  # the attributes json.decoder.JSONDecoder hands to the C scanner
            strict = True
            object_hook = None
            object_pairs_hook = None
            parse_float = float
            parse_int = int
            memo: dict = {}

            @staticmethod
            def parse_constant(name: str) -> float:
                raise ValueError(f"{name} is not allowed")

        scan = _json.make_scanner(Context())
        encode = _json.make_encoder(None, _not_serializable, _json.encode_basestring_ascii, None, ": ", ", ",
                                    False, False, False)
        encode({"probe": [1, 2.5, None, True, "x"]}, 0)
    except (ImportError, AttributeError, TypeError):
        import json

        return json.loads, json.dumps

    def loads(text: str) -> object:
        text = text.strip()
        try:
            value, end = scan(text, 0)
        except (StopIteration, SystemError):
            # The C scanner reports most syntax errors through json.decoder, which it expects to be
            # imported already (SystemError otherwise): let the json module parse it and raise properly.
            import json

            json.loads(text)
            raise ValueError("not valid JSON") from None
        if end != len(text):
            raise ValueError(f"extra data at character {end}")
        return value

    def dumps(value: object) -> str:
        return "".join(encode(value, 0))

    return loads, dumps


def _not_serializable(value: object) -> object:
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


json_loads, json_dumps = _json_codec()


def _sha256_constructor():
    """The C SHA-256 that hashlib wraps (`_sha2` from 3.12, `_sha256` before), without hashlib's OpenSSL."""
    try:
        from _sha2 import sha256  # type: ignore[import-not-found]
    except ImportError:
        try:
            from _sha256 import sha256  # type: ignore[import-not-found,no-redef]
        except ImportError:
            from hashlib import sha256  # type: ignore[assignment]
    return sha256


sha256 = _sha256_constructor()


class HmacSha256:
    """HMAC-SHA256 under one key (RFC 2104: what `hmac.new(key, msg, "sha256")` computes; a test pins that
    they agree). The padded inner and outer states are hashed once and copied for each message."""

    BLOCK = 64

    def __init__(self, key: bytes) -> None:
        if len(key) > self.BLOCK:
            key = sha256(key).digest()
        key = key.ljust(self.BLOCK, b"\0")
        self._inner = sha256(bytes(b ^ 0x36 for b in key))
        self._outer = sha256(bytes(b ^ 0x5C for b in key))

    def hexdigest(self, *parts: bytes) -> bytes:
        inner = self._inner.copy()
        for part in parts:
            inner.update(part)
        outer = self._outer.copy()
        outer.update(inner.digest())
        return outer.hexdigest().encode()


def accept(listener: _socket.socket) -> _socket.socket:
    fd, _ = listener._accept()  # type: ignore[attr-defined]  # the C method socket.accept() wraps
    return _socket.socket(fileno=fd)


def start_thread(target, *args) -> None:
    """Run `target(*args)` on a new (daemon) thread; RuntimeError if none can be started."""
    _thread.start_new_thread(target, args)


def recv_line(conn: _socket.socket, limit: int) -> bytes:
    """Bytes up to and including the first newline (or end of stream), at most `limit` + 1 bytes."""
    chunks = []
    size = 0
    while size <= limit:
        chunk = conn.recv(READ_CHUNK)
        if not chunk:
            break
        newline = chunk.find(b"\n")
        if newline >= 0:
            chunks.append(chunk[: newline + 1])
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


class RequestError(Exception):
    """A request that gets {"ok": false, "error": code, "message": str}."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


# ---------------------------------------------------------------- command line


class Options:
    def __init__(self) -> None:
        self.listen = ""
        self.secret_file = ""
        self.workspace = ""
        self.forward = ""
        self.run_as: tuple[int, int] | None = None
        self.max_request = DEFAULT_MAX_REQUEST


def parse_args(argv: list[str]) -> Options:
    """Parse `--name value` pairs; exit with status 2 and a usage line on anything else."""
    opts = Options()
    names = {"--listen": "listen", "--secret-file": "secret_file", "--workspace": "workspace",
             "--forward": "forward", "--max-request-bytes": "max_request", "--run-as": "run_as"}
    args = list(argv)
    while args:
        flag = args.pop(0)
        if flag not in names or not args:
            _die(f"bad argument {flag!r}; usage: agent.py --listen stdin|unix:PATH|tcp:HOST:PORT "
                 "[--secret-file PATH] [--run-as UID:GID] [--workspace DIR] [--forward tcp:127.0.0.1:PORT=unix:PATH]")
        value = args.pop(0)
        setattr(opts, names[flag], _option_value(flag, value))
    if not opts.listen:
        _die("--listen is required")
    return opts


def _option_value(flag: str, value: str) -> object:
    if flag == "--max-request-bytes":
        return int(value)
    if flag == "--run-as":
        uid, sep, gid = value.partition(":")
        if not (sep and uid.isdigit() and gid.isdigit()):
            _die(f"bad --run-as {value!r}: want UID:GID")
        return int(uid), int(gid)
    return value


def _die(message: str) -> None:
    sys.stderr.write(f"trove-agent: {message}\n")
    raise SystemExit(2)


def load_secret(secret_file: str) -> bytes:
    """The secret from the file (`-`: stdin), else from env TROVE_AGENT_SECRET (removed from the
    environment so that commands do not inherit it)."""
    if secret_file == "-":
        # Read fd 0 itself: re-opening it as /dev/stdin is refused when the pipe belongs to another uid.
        with open(0, "rb", closefd=False) as f:
            secret = f.read().strip()
    elif secret_file:
        with open(secret_file, "rb") as f:
            secret = f.read().strip()
    else:
        secret = os.environ.pop("TROVE_AGENT_SECRET", "").strip().encode()
    if not secret:
        _die("no secret: pass --secret-file or set TROVE_AGENT_SECRET")
    return secret


def receive_handoff(fd: int = 0) -> tuple[bytes, _socket.socket]:
    """(secret, listening socket) from the host over the Unix socket `fd` (`--listen stdin`): the secret is
    the message, the bound Unix socket rides along as SCM_RIGHTS. The agent then holds the only copy of it,
    so once the agent is gone a connection is refused at once instead of waiting in a dead backlog."""
    channel = _socket.socket(fileno=os.dup(fd))
    received: list[int] = []
    try:
        data, ancillary, _, _ = channel.recvmsg(4096, _socket.CMSG_SPACE(4 * 4), _socket.MSG_CMSG_CLOEXEC)
        for level, kind, payload in ancillary:
            if level == _socket.SOL_SOCKET and kind == _socket.SCM_RIGHTS:
                received += [int.from_bytes(payload[i:i + 4], sys.byteorder) for i in range(0, len(payload) - 3, 4)]
        while chunk := channel.recv(4096):
            data += chunk
    finally:
        channel.close()
    if len(received) != 1:
        _die(f"--listen stdin: expected one socket from the host, got {len(received)}")
    listener = _socket.socket(fileno=received[0])
    if listener.family != _socket.AF_UNIX or listener.type != _socket.SOCK_STREAM:
        _die("--listen stdin: the host's socket is not a Unix stream socket")
    secret = data.strip()
    if not secret:
        _die("--listen stdin: the host sent no secret")
    listener.listen(128)
    return secret, listener


# ---------------------------------------------------------------- listening


def parse_endpoint(endpoint: str) -> tuple[int, str | tuple[str, int]]:
    """`unix:/path` -> (AF_UNIX, "/path"); `tcp:host:port` -> (AF_INET or AF_INET6, (host, port))."""
    kind, _, rest = endpoint.partition(":")
    if kind == "unix" and rest:
        return _socket.AF_UNIX, rest
    if kind == "tcp":
        host, _, port = rest.rpartition(":")
        host = host.strip("[]")
        family = _socket.AF_INET6 if ":" in host else _socket.AF_INET
        return family, (host, int(port))
    raise ValueError(f"bad endpoint {endpoint!r}: want unix:PATH or tcp:HOST:PORT")


def open_listener(endpoint: str) -> _socket.socket:
    """Listen on `endpoint`. A Unix socket is bound under a temporary name and renamed into place once
    listening, so a client that sees the file can connect."""
    family, address = parse_endpoint(endpoint)
    sock = _socket.socket(family, _socket.SOCK_STREAM)
    if isinstance(address, str):
        temporary = f"{address}.{os.getpid()}.tmp"
        if os.path.exists(temporary):
            os.unlink(temporary)
        sock.bind(temporary)
        sock.listen(128)
        os.rename(temporary, address)
    else:
        sock.setsockopt(_socket.SOL_SOCKET, _socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(128)
    return sock


def serve_forever(listener: _socket.socket, handler) -> None:
    """Accept connections and run `handler(conn)` for each on its own thread. If no thread can be started
    (the pids limit is exhausted by a command), serve that connection inline rather than drop it."""
    while True:
        try:
            conn = accept(listener)
        except InterruptedError:
            continue
        try:
            start_thread(handler, conn)
        except RuntimeError:
            handler(conn)


# ---------------------------------------------------------------- authentication
# One exchange per connection:
#   agent -> host   GREETING <nonce>\n                       32 hex digits, fresh for this connection
#   host -> agent   <request mac> <request JSON>\n            mac = sign_request(nonce, JSON bytes)
#   agent -> host   <response mac> <response JSON>\n          mac = sign_response(nonce, request mac, JSON)
# Macs are 64 hex digits of HMAC-SHA256 under the per-sandbox secret. The request JSON carries a nonce of the
# host's own, so no two requests (and so no two responses) are ever signed alike.

GREETING = b"trove-agent/2 "
REQUEST_CONTEXT = b"trove-agent request\n"
RESPONSE_CONTEXT = b"trove-agent response\n"
MAC_HEX_LENGTH = 64


def sign_request(mac: HmacSha256, nonce: bytes, body: bytes) -> bytes:
    return mac.hexdigest(REQUEST_CONTEXT, nonce, b"\n", body)


def sign_response(mac: HmacSha256, nonce: bytes, request_mac: bytes, body: bytes) -> bytes:
    return mac.hexdigest(RESPONSE_CONTEXT, nonce, b"\n", request_mac, b"\n", body)


def split_signed(line: bytes) -> tuple[bytes, bytes]:
    """`<mac> <body>\n` -> (mac, body); a line without a well-formed mac gives (b"", line)."""
    mac, sep, body = line.rstrip(b"\n").partition(b" ")
    if not sep or len(mac) != MAC_HEX_LENGTH or mac.strip(b"0123456789abcdef"):
        return b"", line.rstrip(b"\n")
    return mac, body


# ---------------------------------------------------------------- requests


class Agent:
    """Answers requests for one sandbox. Thread-safe: holds no mutable state after construction.
    `run_as` (uid, gid): the user commands and file operations run as; None: the agent's own."""

    def __init__(self, *, secret: bytes, workspace: str, max_request: int,
                 run_as: tuple[int, int] | None = None) -> None:
        self.mac = HmacSha256(secret)
        self.workspace = os.path.realpath(workspace)
        self.max_request = max_request
        self.run_as = run_as
        self.bash = find_program("bash")
        # posix_spawn of setpriv costs a fraction of a fork of this process (page tables and all); without
        # setpriv (a rootfs may lack it) commands are forked and dropped here.
        self.setpriv = find_program("setpriv") if run_as is not None else ""

    def handle_connection(self, conn: _socket.socket) -> None:
        """Greet, read one signed request line, answer with one signed response line, close. Never raises."""
        try:
            nonce = binascii.hexlify(os.urandom(16))
            conn.sendall(GREETING + nonce + b"\n")
            conn.settimeout(REQUEST_READ_TIMEOUT)
            line = recv_line(conn, self.max_request + MAC_HEX_LENGTH + 1)
            conn.settimeout(None)
            request_mac, response = self.respond(nonce, line)
            body = json_dumps(response).encode()
            conn.sendall(sign_response(self.mac, nonce, request_mac, body) + b" " + body + b"\n")
        except OSError:
            pass  # the client went away; nothing to answer
        finally:
            conn.close()

    def respond(self, nonce: bytes, line: bytes) -> tuple[bytes, dict]:
        """(the request's mac as sent, the response)."""
        request_mac, body = split_signed(line)
        try:
            if len(body) > self.max_request:
                raise RequestError("bad_request", f"request longer than {self.max_request} bytes")
            if not request_mac or not compare_digest(request_mac, sign_request(self.mac, nonce, body)):
                raise RequestError("auth", "request not signed with this sandbox's secret for this connection")
            request = self.parse(body)
            return request_mac, {"ok": True, **self.dispatch(request)}
        except RequestError as exc:
            return request_mac, {"ok": False, "error": exc.code, "message": str(exc)}
        except Exception as exc:  # a bug or an OS failure (e.g. fork refused by the pids limit)
            return request_mac, {"ok": False, "error": "internal", "message": f"{type(exc).__name__}: {exc}"}

    def parse(self, body: bytes) -> dict:
        try:
            request = json_loads(body.decode("utf-8"))
        except ValueError as exc:
            raise RequestError("bad_request", f"not JSON: {exc}") from None
        if not isinstance(request, dict):
            raise RequestError("bad_request", "request must be a JSON object")
        return request

    def dispatch(self, request: dict) -> dict:
        op = request.get("op")
        if op == "ping":
            return {"pid": os.getpid()}
        if op == "exec":
            return run_command(exec_args(request, self.workspace), self.spawner())
        if op == "read_file":
            return {"content_b64": binascii.b2a_base64(
                self.as_user(read_file, self.workspace, request.get("path")), newline=False).decode()}
        if op == "write_file":
            content = decode_content(request.get("content_b64"))
            self.as_user(write_file, self.workspace, request.get("path"), content)
            return {}
        if op == "write_files":
            files = decode_files(request.get("files"), self.workspace)
            self.as_user(write_files, self.workspace, files)  # one exchange, and one drop to run_as, for all
            return {"written": len(files)}
        raise RequestError("bad_request", f"unknown op {op!r}")

    def spawner(self):
        """How `run_command` starts bash: posix_spawn as ourselves; as `run_as`, posix_spawn through setpriv
        (which switches every uid and gid, drops the inheritable capabilities and sets no_new_privs before it
        execs bash, and refuses to exec it if any of that fails), or fork and drop here."""
        run_as = self.run_as
        if run_as is None:
            return lambda argv, env, out_w, err_w: spawn_command(self.bash, argv, env, out_w, err_w)
        if os.path.isabs(self.setpriv):
            return lambda argv, env, out_w, err_w: spawn_command(
                self.setpriv, setpriv_argv(run_as, self.bash, argv), env, out_w, err_w)
        return lambda argv, env, out_w, err_w: spawn_command_as(run_as, self.bash, argv, env, out_w, err_w)

    def check_user_switch(self) -> None:
        """Fail closed at startup: a command must run with every uid and gid switched to `run_as` and no
        capabilities, or the agent exits (and the sandbox fails to start)."""
        if self.run_as is None:
            return
        uid, gid = self.run_as
        show_status = 'while IFS= read -r line; do printf "%s\\n" "$line"; done < /proc/self/status'  # bash only
        result = run_command(ExecArgs(show_status, 30.0, None, 65536, None, dict(os.environ)), self.spawner())
        status = dict(line.split(":", 1) for line in result["stdout"].splitlines() if ":" in line)
        expected = {"Uid": [str(uid)] * 4, "Gid": [str(gid)] * 4, "CapPrm": ["0" * 16], "CapEff": ["0" * 16],
                    "CapAmb": ["0" * 16], "NoNewPrivs": ["1"]}
        wrong = {k: status.get(k, "").split() for k, v in expected.items() if status.get(k, "").split() != v}
        if wrong:
            _die(f"commands do not run as {uid}:{gid} without capabilities and with no_new_privs: {wrong} "
                 f"{result['stderr'].strip()}")

    def as_user(self, operation, *args):
        """`operation(*args)` as the commands' user (in a child dropped to `run_as`), so a path a command
        planted (a symlink into /proc/<agent>, say) is opened with nothing more than the command's rights."""
        if self.run_as is None:
            return operation(*args)
        return run_as_child(self.run_as, operation, *args)


# ---------------------------------------------------------------- users


def find_program(name: str) -> str:
    """`name` on our PATH (posix_spawnp's search, done once: a forked child execs the full path)."""
    for directory in os.environ.get("PATH", "/usr/bin:/bin").split(":"):
        candidate = os.path.join(directory or ".", name)
        if os.access(candidate, os.X_OK):
            return candidate
    return name


def drop_to(run_as: tuple[int, int]) -> None:
    """Become `run_as` for good in this (forked) process: no supplementary groups, real, effective and saved
    ids all switched, which clears every capability. no_new_privs (set on the whole sandbox by bubblewrap, or
    by Kubernetes' allowPrivilegeEscalation: false) keeps a setuid or file-capability binary from giving any
    back. Raises if the switch did not happen."""
    uid, gid = run_as
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)
    if os.getresuid() != (uid, uid, uid) or os.getresgid() != (gid, gid, gid):
        raise OSError(f"could not switch to {uid}:{gid}")


def fork_as(run_as: tuple[int, int], child, *, before_report=None) -> tuple[int, bytes]:
    """Fork; the child drops to `run_as` and runs `child()` (which execs, or returns to exit 0). Returns
    (pid, what the child reported on its error pipe: empty when it exec'd or returned cleanly). A child that
    fails, the drop included, never runs anything: it reports and exits 127. `before_report()` runs in the
    parent right after the fork (it must drain whatever the child writes, or the child could block on it)."""
    err_r, err_w = os.pipe()  # close-on-exec: an exec that works closes it with nothing written
    pid = os.fork()
    if pid == 0:  # the child: only raw system calls and small objects from here to exec or _exit
        code = 0
        try:
            os.close(err_r)
            drop_to(run_as)
            child()
        except BaseException as exc:
            code = 127
            try:
                os.write(err_w, _child_error(exc).encode()[:4000])
            except BaseException:
                pass
        os._exit(code)
    os.close(err_w)
    try:
        if before_report is not None:
            before_report()
        report = b""
        while chunk := os.read(err_r, 4096):
            report += chunk
    finally:
        os.close(err_r)
    return pid, report


def _child_error(exc: BaseException) -> str:
    if isinstance(exc, RequestError):
        return f"{exc.code}\t{exc}"
    return f"internal\t{type(exc).__name__}: {exc}"


def run_as_child(run_as: tuple[int, int], operation, *args) -> bytes:
    """`operation(*args)` in a child dropped to `run_as`; its return value (bytes, or None) comes back
    through a pipe (read while the child writes it), a RequestError it raises is raised here."""
    out_r, out_w = os.pipe()
    chunks: list[bytes] = []

    def child() -> None:
        os.close(out_r)
        view = memoryview(operation(*args) or b"")
        while view:
            view = view[os.write(out_w, view):]

    open_ends = [out_w]

    def drain() -> None:
        os.close(open_ends.pop())  # our write end: end of stream comes when the child exits
        while chunk := os.read(out_r, READ_CHUNK):
            chunks.append(chunk)

    try:
        pid, report = fork_as(run_as, child, before_report=drain)
    finally:
        for fd in (out_r, *open_ends):  # the write end is still ours if the fork failed
            os.close(fd)
    os.waitpid(pid, 0)
    if report:
        code, _, message = report.decode("utf-8", "replace").partition("\t")
        raise RequestError(code, message)
    return b"".join(chunks)


def spawn_command(program: str, argv: list[str], env: dict[str, str], out_w: int, err_w: int) -> int:
    actions = [(os.POSIX_SPAWN_OPEN, 0, "/dev/null", os.O_RDONLY, 0),
               (os.POSIX_SPAWN_DUP2, out_w, 1), (os.POSIX_SPAWN_DUP2, err_w, 2)]
    return os.posix_spawn(program, argv, env, file_actions=actions, setsid=True)


def setpriv_argv(run_as: tuple[int, int], bash: str, argv: list[str]) -> list[str]:
    uid, gid = run_as
    return ["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups", "--inh-caps=-all", "--no-new-privs",
            "--", bash, *argv[1:]]


def spawn_command_as(run_as: tuple[int, int], bash: str, argv: list[str], env: dict[str, str], out_w: int,
                     err_w: int) -> int:
    def child() -> None:
        os.setsid()
        null = os.open("/dev/null", os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(out_w, 1)
        os.dup2(err_w, 2)
        os.execve(bash, argv, env)

    pid, report = fork_as(run_as, child)
    if report:
        os.waitpid(pid, 0)
        raise OSError(f"cannot start the command as {run_as[0]}:{run_as[1]}: {report.decode('utf-8', 'replace')}")
    return pid


# ---------------------------------------------------------------- files


def confined_path(workspace: str, path: object) -> str:
    """The absolute path of `path` inside `workspace`. Raises RequestError("path") for absolute paths, `..`,
    NUL bytes and anything (symlinks included) that resolves outside the workspace."""
    if not isinstance(path, str) or not path or "\0" in path:
        raise RequestError("path", "path must be a non-empty string")
    if path.startswith("/") or ".." in path.split("/"):
        raise RequestError("path", f"{path!r} must be relative to the workspace, without '..'")
    full = os.path.join(workspace, path)
    resolved = os.path.realpath(full)
    if resolved != workspace and not resolved.startswith(workspace + "/"):
        raise RequestError("path", f"{path!r} leaves the workspace")
    return resolved


def read_file(workspace: str, path: object) -> bytes:
    target = confined_path(workspace, path)
    try:
        # Non-blocking open: a FIFO planted in the file's place must not hang the agent. Regular files only.
        fd = os.open(target, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        with open(fd, "rb") as f:
            if not stat_is_regular(os.fstat(fd).st_mode):
                raise RequestError("path", f"{path!r} is not a regular file")
            os.set_blocking(fd, True)
            content = f.read(MAX_FILE_READ + 1)
    except OSError as exc:
        raise RequestError("path", f"{path!r}: {exc.strerror}") from None
    if len(content) > MAX_FILE_READ:
        raise RequestError("bad_request", f"{path!r} is larger than {MAX_FILE_READ} bytes")
    return content


def stat_is_regular(mode: int) -> bool:
    return mode & 0o170000 == 0o100000  # stat.S_ISREG, without importing stat


def decode_content(content_b64: object) -> bytes:
    if not isinstance(content_b64, str):
        raise RequestError("bad_request", "content_b64 must be a string")
    try:
        return binascii.a2b_base64(content_b64)
    except binascii.Error as exc:
        raise RequestError("bad_request", f"content_b64: {exc}") from None


def decode_files(files: object, workspace: str) -> list[tuple[str, bytes]]:
    """A write_files request's [{"path", "content_b64"}, ...] as (path, content) pairs, every path checked
    first, so a batch naming a path outside the workspace writes nothing."""
    if not isinstance(files, list) or not all(isinstance(entry, dict) for entry in files):
        raise RequestError("bad_request", "files must be a list of {path, content_b64} objects")
    for entry in files:
        confined_path(workspace, entry.get("path"))
    return [(entry["path"], decode_content(entry.get("content_b64"))) for entry in files]


def write_files(workspace: str, files: list[tuple[str, bytes]]) -> None:
    """write_file for each, in order (each path checked again as it is written)."""
    for path, content in files:
        write_file(workspace, path, content)


def write_file(workspace: str, path: object, content: bytes) -> None:
    """Write (create or replace) a workspace file, creating parent directories."""
    target = confined_path(workspace, path)
    try:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        # Re-check after creating parents: a parent could be a symlink created since confined_path ran.
        target = confined_path(workspace, path)
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
        with open(fd, "wb") as f:
            f.write(content)
    except OSError as exc:
        raise RequestError("path", f"{path!r}: {exc.strerror}") from None


# ---------------------------------------------------------------- exec


class ExecArgs:
    def __init__(self, cmd: str, timeout: float, idle_timeout: float | None, max_output: int,
                 cwd: str | None, env: dict[str, str]) -> None:
        self.cmd, self.timeout, self.idle_timeout = cmd, timeout, idle_timeout
        self.max_output, self.cwd, self.env = max_output, cwd, env


def exec_args(request: dict, workspace: str) -> ExecArgs:
    """Validate an exec request. `cwd` is relative to the workspace (or absolute inside the sandbox)."""
    cmd = request.get("cmd")
    timeout = request.get("timeout", 60.0)
    idle = request.get("idle_timeout")
    max_output = request.get("max_output", 64 * 1024)
    cwd = request.get("cwd")
    env = request.get("env") or {}
    if not isinstance(cmd, str):
        raise RequestError("bad_request", "cmd must be a string")
    if not _positive_number(timeout) or (idle is not None and not _positive_number(idle)):
        raise RequestError("bad_request", "timeout and idle_timeout must be positive numbers")
    if not isinstance(max_output, int) or isinstance(max_output, bool) or max_output < 0:
        raise RequestError("bad_request", "max_output must be a non-negative integer")
    if cwd is not None and not isinstance(cwd, str):
        raise RequestError("bad_request", "cwd must be a string or null")
    if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise RequestError("bad_request", "env must map strings to strings")
    full_cwd = os.path.join(workspace, cwd) if cwd else None
    return ExecArgs(cmd, float(timeout), None if idle is None else float(idle), max_output, full_cwd,
                    {**os.environ, **env})


def _positive_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value > 0


def bash_argv(cmd: str, cwd: str | None) -> list[str]:
    """posix_spawn cannot change directory, so a command with its own cwd gets a `cd` in a first bash,
    which then execs the real `bash -c cmd` (the command sees the same $0 and arguments either way)."""
    if cwd is None:
        return ["bash", "-c", cmd]
    return ["bash", "-c", 'cd -- "$1" || exit 126; exec bash -c "$2"', "bash", cwd, cmd]


class Capture:
    """Keeps the first `cap` bytes of a stream and counts the rest."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.data = bytearray()
        self.dropped = 0

    def add(self, chunk: bytes) -> None:
        room = self.cap - len(self.data)
        self.data += chunk[: max(room, 0)]
        self.dropped += max(len(chunk) - max(room, 0), 0)

    def text(self) -> str:
        return self.data.decode("utf-8", "replace")


def run_command(args: ExecArgs, spawn) -> dict:
    """Run one command to completion or timeout; see the module docstring for the contract.
    `spawn(argv, env, stdout_fd, stderr_fd)` starts bash in its own session and returns its pid."""
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    started = time.monotonic()
    try:
        pid = spawn(bash_argv(args.cmd, args.cwd), args.env, out_w, err_w)
    except OSError:
        os.close(out_r)
        os.close(err_r)
        raise
    finally:
        os.close(out_w)
        os.close(err_w)
    run = CommandRun(pid, {out_r: Capture(args.max_output), err_r: Capture(args.max_output)})
    run.wait(started, args.timeout, args.idle_timeout)
    return run.result(started)


class CommandRun:
    """Waits on a spawned command's pipes and exit, enforcing the deadlines. One per exec request."""

    def __init__(self, pid: int, captures: dict[int, Capture]) -> None:
        self.pid = pid
        self.captures = captures
        self.stdout, self.stderr = captures.values()
        self.exit_code: int | None = None
        self.exited = False
        self.timed_out = False
        self.idle_timed_out = False
        self.deadline = self.drain_until = float("inf")
        self.idle_timeout: float | None = None
        self.last_output = 0.0

    def wait(self, started: float, timeout: float, idle_timeout: float | None) -> None:
        """Collect output until the command has exited and its pipes are closed (or DRAIN_GRACE has passed
        since the exit), killing the process group at the hard or idle deadline."""
        pidfd = _pidfd_open(self.pid)
        poller = select.poll()
        for fd in self.captures:
            poller.register(fd, select.POLLIN)
        if pidfd is not None:
            poller.register(pidfd, select.POLLIN)
        open_fds = set(self.captures)
        self.deadline = started + timeout
        self.idle_timeout = idle_timeout
        self.last_output = started
        self.drain_until = float("inf")
        try:
            while not (self.exited and (not open_fds or time.monotonic() >= self.drain_until)):
                self.enforce_deadlines(time.monotonic())
                for fd, _ in poller.poll(self.poll_ms(time.monotonic(), pidfd is None)):
                    if fd == pidfd:
                        poller.unregister(pidfd)
                        self.reap()
                    elif self.read_chunk(fd):
                        self.last_output = time.monotonic()
                    else:
                        poller.unregister(fd)
                        open_fds.discard(fd)
                if pidfd is None and not self.exited:
                    self.reap(block=False)
                if self.exited and self.drain_until == float("inf"):
                    self.drain_until = time.monotonic() + DRAIN_GRACE
        finally:
            for fd in self.captures:
                os.close(fd)
            if pidfd is not None:
                os.close(pidfd)

    def enforce_deadlines(self, now: float) -> None:
        if self.exited or self.timed_out or self.idle_timed_out:
            return
        if now >= self.deadline:
            self.kill(idle=False)
        elif self.idle_timeout is not None and now - self.last_output >= self.idle_timeout:
            self.kill(idle=True)

    def poll_ms(self, now: float, without_pidfd: bool) -> float:
        """How long poll() may sleep: until the next deadline. Without a pidfd (kernel older than 5.3) the
        exit is noticed by calling waitpid every 50 ms."""
        wake = self.drain_until
        if not (self.exited or self.timed_out or self.idle_timed_out):
            wake = min(wake, self.deadline)
            if self.idle_timeout is not None:
                wake = min(wake, self.last_output + self.idle_timeout)
        if without_pidfd:
            wake = min(wake, now + 0.05)
        return max(0.0, min(wake - now, 3600.0)) * 1000

    def read_chunk(self, fd: int) -> bool:
        """Read what is available; False at end of stream."""
        chunk = os.read(fd, READ_CHUNK)
        if chunk:
            self.captures[fd].add(chunk)
        return bool(chunk)

    def kill(self, *, idle: bool) -> None:
        """SIGKILL the command's whole process group (the command ran in its own session)."""
        self.timed_out = not idle
        self.idle_timed_out = idle
        try:
            os.killpg(self.pid, SIGKILL)
        except ProcessLookupError:
            pass

    def reap(self, *, block: bool = True) -> None:
        pid, status = os.waitpid(self.pid, 0 if block else os.WNOHANG)
        if pid:
            self.exited = True
            self.exit_code = os.waitstatus_to_exitcode(status)

    def result(self, started: float) -> dict:
        killed = self.timed_out or self.idle_timed_out
        return {
            "exit_code": None if killed else self.exit_code,
            "stdout": self.stdout.text(),
            "stderr": self.stderr.text(),
            "duration_ms": round((time.monotonic() - started) * 1000, 3),
            "timed_out": self.timed_out,
            "idle_timed_out": self.idle_timed_out,
            "truncated_bytes": self.stdout.dropped + self.stderr.dropped,
        }


def _pidfd_open(pid: int) -> int | None:
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


# ---------------------------------------------------------------- proxy forwarding


def parse_forward(spec: str) -> tuple[str, str]:
    """`tcp:127.0.0.1:PORT=unix:PATH` -> ("tcp:127.0.0.1:PORT", "/PATH")."""
    listen, sep, target = spec.partition("=")
    if not sep or not listen.startswith("tcp:") or not target.startswith("unix:"):
        raise ValueError(f"bad --forward {spec!r}: want tcp:127.0.0.1:PORT=unix:PATH")
    return listen, target[len("unix:"):]


def forward_connection(client: _socket.socket, target_path: str) -> None:
    """Pipe bytes both ways between `client` and a new connection to the Unix socket `target_path`."""
    upstream = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        upstream.connect(target_path)
        back_done = _thread.allocate_lock()
        back_done.acquire()
        start_thread(_pump, upstream, client, back_done)
        _pump(client, upstream, None)
        back_done.acquire()  # released when the other direction has finished too
    except (OSError, RuntimeError):
        pass
    finally:
        upstream.close()
        client.close()


def _pump(source: _socket.socket, sink: _socket.socket, done) -> None:
    """Copy until end of stream, then pass the half-close on; release `done` (a lock) when finished."""
    try:
        while chunk := source.recv(READ_CHUNK):
            sink.sendall(chunk)
    except OSError:
        pass
    try:
        sink.shutdown(_socket.SHUT_WR)
    except OSError:
        pass
    if done is not None:
        done.release()


# ---------------------------------------------------------------- main


def main(argv: list[str]) -> None:
    opts = parse_args(argv)
    if opts.listen == "stdin":
        secret, listener = receive_handoff(0)
    else:
        secret, listener = load_secret(opts.secret_file), None
    _detach_stdin()
    if opts.run_as is not None and os.getuid() == opts.run_as[0]:
        _die(f"--run-as {opts.run_as[0]} is the agent's own uid: commands could signal and trace the agent")
    workspace = opts.workspace or os.getcwd()
    os.chdir(workspace)  # commands are spawned with the agent's own working directory
    agent = Agent(secret=secret, workspace=workspace, max_request=opts.max_request, run_as=opts.run_as)
    agent.check_user_switch()
    if opts.run_as is None:
        _make_undumpable()
    if opts.forward:
        listen, target = parse_forward(opts.forward)
        forward_listener = open_listener(listen)
        start_thread(serve_forever, forward_listener, lambda conn: forward_connection(conn, target))
    if listener is None:
        listener = open_listener(opts.listen)
    announce_ready(bound_endpoint(listener, opts.listen))
    serve_forever(listener, agent.handle_connection)


def bound_endpoint(listener: _socket.socket, requested: str) -> str:
    """The endpoint actually listened on: `tcp:HOST:0` gets its real port."""
    if listener.family == _socket.AF_UNIX:
        return requested if requested != "stdin" else f"unix:{listener.getsockname()}"
    host, port = listener.getsockname()[:2]
    return f"tcp:{host}:{port}"


def announce_ready(endpoint: str) -> None:
    """Print the ready line, then point stdout at /dev/null: whoever waited on it (the local backend reads
    it through a pipe) stops reading, and a later write must not fail or block on that pipe."""
    try:
        sys.stdout.write(f"trove-agent ready {endpoint}\n")
        sys.stdout.flush()
    except OSError:
        pass  # nobody is reading: fine, the Unix socket file is the other readiness signal
    _redirect(1, "/dev/null", os.O_WRONLY)


def _make_undumpable() -> None:
    """Without a user of its own (Trove not run as root), commands share the agent's uid: refuse them what
    that uid would allow, reading or writing the agent's memory through /proc/<pid>/mem (and its environ, fds,
    ptrace), by clearing the dumpable flag (the kernel then makes /proc/<pid> root's). They can still kill it:
    the host then gets refused connections, never an answer. ctypes costs a few ms, in this mode only."""
    try:
        import ctypes

        if ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0) != 0:  # PR_SET_DUMPABLE, 0
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE) failed")
    except (ImportError, OSError) as exc:
        _die(f"cannot protect the agent from commands of its own uid: {exc}")


def _detach_stdin() -> None:
    """Commands get /dev/null as stdin anyway; drop ours too (it may have carried the secret)."""
    _redirect(0, "/dev/null", os.O_RDONLY)


def _redirect(fd: int, path: str, flags: int) -> None:
    target = os.open(path, flags)
    os.dup2(target, fd)
    os.close(target)


if __name__ == "__main__":
    try:
        main(sys.argv[1:])
    except KeyboardInterrupt:
        pass
