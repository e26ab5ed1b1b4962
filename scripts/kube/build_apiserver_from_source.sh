#!/usr/bin/env bash
# Build the stock kube-apiserver from Debian bookworm's `kubernetes` source package (1.20.5+really1.20.2,
# every Go dependency vendored in the orig tarball) and copy it to $1 (default var/cache/kube/kube-apiserver).
# Fallback for ensure_apiserver.sh when no prebuilt binary is at hand. Needs root for apt, about 16 minutes
# on two cores, and 1.8 GB of scratch space, which is removed afterwards. No network beyond the Debian mirror:
# GOPROXY=off and -mod=vendor.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
OUT="${1:-$ROOT/var/cache/kube/kube-apiserver}"
SUDO=""
if [[ "$(id -u)" != 0 ]]; then SUDO="sudo"; fi

$SUDO apt-get install -y --no-install-recommends golang-go rsync openssl dpkg-dev

# deb-src entries for the same suites as the binary ones (deb822 sources format on bookworm).
if ! grep -rqs '^Types:.*deb-src' /etc/apt/sources.list.d/ 2>/dev/null; then
  sed 's/^Types: deb$/Types: deb-src/' /etc/apt/sources.list.d/debian.sources |
    $SUDO tee /etc/apt/sources.list.d/debian-src.sources >/dev/null
fi
$SUDO apt-get update

WORK="$(mktemp -d "${TMPDIR:-/tmp}/kube-src.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
cd "$WORK"
apt-get source --download-only kubernetes
tar xzf kubernetes_1.20.5+really1.20.2.orig.tar.gz
cd kubernetes-1.20.2
mkdir -p .go/src/k8s.io
ln -sfn ../../.. .go/src/k8s.io/kubernetes
env GOPATH="$PWD/.go" CGO_ENABLED=0 GOPROXY=off GOFLAGS=-mod=vendor HOME="$(mktemp -d)" \
  make WHAT=cmd/kube-apiserver

mkdir -p "$(dirname "$OUT")"
install -m 0755 _output/bin/kube-apiserver "$OUT.tmp"
mv -f "$OUT.tmp" "$OUT"
echo "built $OUT" >&2
