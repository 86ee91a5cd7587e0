#!/usr/bin/env bash
# Try to build the real KEDA operator and metrics adapter (github.com/kedacore/keda/v2,
# cmd/operator and cmd/adapter) from the Go module proxy into a cache outside the
# repository, keyed by version, for the end-to-end test of the external scaler
# (tests/e2e_keda, `make test-keda`). A no-op when both binaries are there (but for making
# sure KEDA's module source, whose CRDs the test installs, is in the Go module cache).
# Go only builds test binaries here; the product is Python.
#
#   tests/keda/build.sh            # prints the bin directory; exit 1 when it does not build
#
# Environment: GPUSCALER_KEDA_VERSION (default below), GPUSCALER_KEDA_CACHE
# (default ~/.cache/gpuscaler/keda), GPUSCALER_CP_JOBS (parallel compiles, default 2).
set -euo pipefail
version="${GPUSCALER_KEDA_VERSION:-v2.21.0}"
bin="${GPUSCALER_KEDA_CACHE:-$HOME/.cache/gpuscaler/keda}/$version/bin"
if [ -x "$bin/keda-operator" ] && [ -x "$bin/keda-adapter" ]; then
  # The end-to-end test (tests/e2e_keda) also reads KEDA's CRDs from its module source
  # (config/crd/bases): fetched into the Go module cache if it was cleaned since the build.
  if command -v go >/dev/null; then
    GOFLAGS=-mod=mod go mod download "github.com/kedacore/keda/v2@$version" >&2 || true
  fi
  echo "$bin"
  exit 0
fi
command -v go >/dev/null || { echo "build.sh: go is not installed" >&2; exit 1; }
mkdir -p "$bin"
work=$(mktemp -d "$bin/../build.XXXXXX")
trap 'rm -rf "$work"' EXIT
cd "$work"
go mod init gpuscaler.test/keda >/dev/null 2>&1
echo "build.sh: resolving github.com/kedacore/keda/v2@$version" >&2
start=$(date +%s)
go get "github.com/kedacore/keda/v2@$version" >&2
CGO_ENABLED=0 go build -mod=mod -buildvcs=false -p "${GPUSCALER_CP_JOBS:-2}" -trimpath \
  -ldflags='-s -w' -o "$work/keda-operator" github.com/kedacore/keda/v2/cmd/operator
CGO_ENABLED=0 go build -mod=mod -buildvcs=false -p "${GPUSCALER_CP_JOBS:-2}" -trimpath \
  -ldflags='-s -w' -o "$work/keda-adapter" github.com/kedacore/keda/v2/cmd/adapter
mv "$work/keda-operator" "$work/keda-adapter" "$bin/"
echo "build.sh: built in $(( $(date +%s) - start )) s" >&2
echo "$bin"
