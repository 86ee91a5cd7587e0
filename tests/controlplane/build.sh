#!/usr/bin/env bash
# Build the test control plane (kube-apiserver, kube-controller-manager, kube-scheduler,
# kubectl from k8s.io/kubernetes, and etcd from go.etcd.io/etcd/server/v3 at the version
# Kubernetes itself requires) into a cache outside the repository, keyed by version, so
# a fresh clone on the same machine reuses it. A no-op when every binary is there.
#
#   tests/controlplane/build.sh          # build what is missing; prints the bin directory
#
# Progress goes to stderr, one line per binary; go's own output goes to a log beside the
# cache. The first build on a machine also downloads the Go modules (into go's cache).
#
# Environment: GPUSCALER_CP_CACHE (default ~/.cache/gpuscaler/controlplane),
# GPUSCALER_CP_JOBS (parallel compiles, default 2: about 1.5 GB each).
# Go only builds test binaries here; the product is Python.
set -euo pipefail
cd "$(dirname "$0")"
version=$(sed -n "s/^[[:space:]]*\(require \)\{0,1\}k8s.io\/kubernetes \(v[0-9.]*\)$/\2/p" go.mod)
[ -n "$version" ] || { echo "build.sh: no k8s.io/kubernetes version in go.mod" >&2; exit 2; }
bin="${GPUSCALER_CP_CACHE:-$HOME/.cache/gpuscaler/controlplane}/$version/bin"
tools=(kube-apiserver kube-controller-manager kube-scheduler kubectl etcd)
missing=()
for t in "${tools[@]}"; do [ -x "$bin/$t" ] || missing+=("$t"); done
if [ ${#missing[@]} -eq 0 ]; then
  echo "$bin"
  exit 0
fi
command -v go >/dev/null || { echo "build.sh: go is not installed (needed to build ${missing[*]})" >&2; exit 1; }
mkdir -p "$bin"
tmp=$(mktemp -d "$bin/../build.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
# go's own output (a line per module it downloads, the first time on a machine) goes to
# this log; its last lines are shown if a build fails.
log="$(dirname "$bin")/build.log"
: >"$log"
echo "build.sh: building ${missing[*]} ($version) into $bin; go's output in $log" >&2
start=$(date +%s)
i=0
for t in "${missing[@]}"; do
  i=$((i + 1))
  if [ "$t" = etcd ]; then pkg=./cmd/etcd; else pkg="k8s.io/kubernetes/cmd/$t"; fi
  echo "build.sh: building $t ($i/${#missing[@]}) ..." >&2
  began=$(date +%s)
  # -mod=mod: go.sum pins every module; nothing is vendored. Packages compiled for one
  # binary are reused from go's build cache by the next.
  if ! CGO_ENABLED=0 go build -mod=mod -buildvcs=false -p "${GPUSCALER_CP_JOBS:-2}" -trimpath \
    -tags providerless -ldflags='-s -w' -o "$tmp/" "$pkg" >>"$log" 2>&1; then
    echo "build.sh: building $t failed; the end of $log:" >&2
    tail -n 40 "$log" >&2
    exit 1
  fi
  mv "$tmp/$t" "$bin/$t"
  echo "build.sh: built $t in $(( $(date +%s) - began )) s" >&2
done
echo "build.sh: built in $(( $(date +%s) - start )) s" >&2
echo "$bin"
