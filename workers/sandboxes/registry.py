"""Which backend serves a fleet. One instance per backend kind per process (they hold connection pools)."""

from __future__ import annotations

import threading

from django.conf import settings

from workers.sandboxes.base import SandboxBackend

_backends: dict[str, SandboxBackend] = {}
_lock = threading.Lock()


def get_backend(kind: str | None = None) -> SandboxBackend:
    kind = kind or settings.TROVE_SANDBOX_BACKEND
    with _lock:
        if kind not in _backends:
            _backends[kind] = _build(kind)
        return _backends[kind]


def _build(kind: str) -> SandboxBackend:
    if kind == "local":
        from workers.sandboxes.local import LocalBackend

        return LocalBackend(root=settings.TROVE_SANDBOX_ROOT, bundle_dir=settings.TROVE_HARNESS_DIR)
    if kind == "kubernetes":
        from workers.sandboxes.kubernetes import KubernetesBackend

        return KubernetesBackend(namespace=settings.TROVE_KUBE_NAMESPACE or "trove-sandboxes", kubeconfig=settings.TROVE_KUBECONFIG)
    raise ValueError(f"unknown sandbox backend {kind!r}")


def set_backend(kind: str, backend: SandboxBackend) -> None:
    """Install a specific backend instance (tests point the Kubernetes backend at their own API server)."""
    with _lock:
        _backends[kind] = backend


# Backends whose destroy() returns only once everything is gone (local verifies it and raises otherwise).
# Kubernetes accepts the delete and the pod lingers for its grace period: the fleet keeps such a sandbox
# `terminating`, occupying capacity, until the backend no longer lists it.
_FINAL_DESTROY = {"local"}


def destroy_is_final(kind: str) -> bool:
    return kind in _FINAL_DESTROY
