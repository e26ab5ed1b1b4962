#!/usr/bin/env bash
# Start a throwaway etcd + kube-apiserver on loopback for manual work and print two kubeconfigs: an admin
# one and one for the sandbox backend's ServiceAccount user (bound by deploy/sandbox-rbac.yaml once
# applied). Runs in the foreground until Ctrl-C, then stops both processes and keeps the work dir.
#   scripts/kube/start_apiserver.sh [WORKDIR]    (default var/kube; wiped at start)
# Then e.g.: kubectl --kubeconfig var/kube/kubeconfig apply -f deploy/namespaces.yaml -f deploy/sandbox-rbac.yaml
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
"$ROOT/scripts/kube/ensure_apiserver.sh" >/dev/null
cd "$ROOT"
exec "${PYTHON:-$ROOT/.venv/bin/python}" -m tests.kube.cluster --dir "${1:-$ROOT/var/kube}"
