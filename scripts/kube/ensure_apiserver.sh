#!/usr/bin/env bash
# Put a kube-apiserver binary at var/cache/kube/kube-apiserver (ignored, never committed) and print its path.
#
# Source, in order:
#   1. already unpacked and its sha256 matches          -> nothing to do
#   2. $TROVE_KUBE_APISERVER_XZ, default the shared prebuilt
#      $TROVE_SHARED_DIR (default ../shared beside the checkout)/tools/kubernetes/kube-apiserver-v1.20.2-linux-amd64.xz (sha256 checked before and after unpacking)
#   3. scripts/kube/build_apiserver_from_source.sh (Debian source package; about 16 minutes, 1.8 GB scratch)
# Exit status is non-zero, with the reason on stderr, when no binary can be provided.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
CACHE="${TROVE_KUBE_CACHE:-$ROOT/var/cache/kube}"
OUT="$CACHE/kube-apiserver"
SHARED="${TROVE_SHARED_DIR:-$ROOT/../shared}"
XZ="${TROVE_KUBE_APISERVER_XZ:-$SHARED/tools/kubernetes/kube-apiserver-v1.20.2-linux-amd64.xz}"
XZ_SHA256="e9aeb7c6f5551a90b66f1279e24d1eee1967cd9f7713f602144f82584d4c5e49"
BIN_SHA256="045d51af2b97bf642036f7ba186e957e60501aacf7e769962a280e5e2eea916b"

sha_of() { sha256sum "$1" | cut -d' ' -f1; }

mkdir -p "$CACHE"

if [[ -x "$OUT" && "$(sha_of "$OUT")" == "$BIN_SHA256" ]]; then
  echo "$OUT"
  exit 0
fi

if [[ -f "$XZ" ]]; then
  got="$(sha_of "$XZ")"
  if [[ "$got" != "$XZ_SHA256" ]]; then
    echo "ensure_apiserver: $XZ has sha256 $got, expected $XZ_SHA256; refusing it" >&2
    exit 1
  fi
  # Unpack beside the target and rename, so a concurrent reader never sees a half-written binary.
  tmp="$(mktemp "$CACHE/kube-apiserver.XXXXXX")"
  trap 'rm -f "$tmp"' EXIT
  xz -dc "$XZ" >"$tmp"
  got="$(sha_of "$tmp")"
  if [[ "$got" != "$BIN_SHA256" ]]; then
    echo "ensure_apiserver: unpacked binary has sha256 $got, expected $BIN_SHA256" >&2
    exit 1
  fi
  chmod 0755 "$tmp"
  mv -f "$tmp" "$OUT"
  trap - EXIT
  echo "$OUT"
  exit 0
fi

echo "ensure_apiserver: $XZ not found; building kube-apiserver from the Debian source package" >&2
"$ROOT/scripts/kube/build_apiserver_from_source.sh" "$OUT" >&2
echo "$OUT"
