#!/usr/bin/env bash
# Build helm (helm.sh/helm/v3 cmd/helm, at the version go.mod pins) into a cache outside
# the repository, keyed by version, so a fresh clone on the same machine reuses it. A no-op
# when the binary is there. The chart tests (tests/e2e/test_helm_chart.py) run it.
#
#   tests/helm/build.sh          # build it if missing; prints the bin directory
#
# Progress goes to stderr; go's own output goes to a log beside the cache. The first build
# on a machine also downloads the Go modules (into go's cache).
#
# Environment: GPUSCALER_HELM_CACHE (default ~/.cache/gpuscaler/helm),
# GPUSCALER_CP_JOBS (parallel compiles, default 2).
# Go only builds test binaries here; the product is Python.
set -euo pipefail
cd "$(dirname "$0")"
version=$(sed -n "s/^[[:space:]]*\(require \)\{0,1\}helm.sh\/helm\/v3 \(v[0-9.]*\).*$/\2/p" go.mod)
[ -n "$version" ] || { echo "build.sh: no helm.sh/helm/v3 version in go.mod" >&2; exit 2; }
bin="${GPUSCALER_HELM_CACHE:-$HOME/.cache/gpuscaler/helm}/$version/bin"
if [ -x "$bin/helm" ]; then
  echo "$bin"
  exit 0
fi
command -v go >/dev/null || { echo "build.sh: go is not installed (needed to build helm)" >&2; exit 1; }
mkdir -p "$bin"
tmp=$(mktemp -d "$bin/../build.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
# go's own output (a line per module it downloads, the first time on a machine) goes to
# this log; its last lines are shown if the build fails.
log="$(dirname "$bin")/build.log"
: >"$log"
echo "build.sh: building helm $version (1/1) into $bin; go's output in $log ..." >&2
start=$(date +%s)
# -mod=mod: go.sum pins every module; nothing is vendored.
if ! CGO_ENABLED=0 go build -mod=mod -buildvcs=false -p "${GPUSCALER_CP_JOBS:-2}" -trimpath \
  -ldflags="-s -w -X helm.sh/helm/v3/internal/version.version=$version" \
  -o "$tmp/" helm.sh/helm/v3/cmd/helm >>"$log" 2>&1; then
  echo "build.sh: building helm failed; the end of $log:" >&2
  tail -n 40 "$log" >&2
  exit 1
fi
mv "$tmp/helm" "$bin/helm"
echo "build.sh: built in $(( $(date +%s) - start )) s" >&2
echo "$bin"
