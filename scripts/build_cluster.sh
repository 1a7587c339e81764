#!/usr/bin/env bash
# Builds the upstream binaries a real test tier runs from one Go module of ours, once per
# content of that module: build/cluster/<key>/, where <key> hashes go.mod, go.sum, the
# command sources, the module's build.env and this script. Prints that directory.
#   tests/cluster              etcd, kube-apiserver, kube-controller-manager, kube-scheduler
#   tests/cluster/compat-1.30  the oldest kube-apiserver the chart claims (etcd + apiserver)
#   tests/node                 kubelet (same k8s.io/kubernetes release), containerd, its runc shim, ctr
#   tests/registry             the CNCF distribution registry and the ORAS CLI (the OCI source tests)
#   tests/tools                helm (v4) and promtool: the chart and alert checks
#   tests/actionlint           actionlint: the release workflows' check
# A cold build takes ~10 minutes per module on 2 cores; later runs reuse it (and the Go
# build cache makes a rebuild after a small change quick).
# A module may hold a build.env that sets CGO_ENABLED and TAGS (containerd: no cgo, no btrfs), and
# PACKAGES: upstream main packages built as they are, beside ./cmd/... (promtool).
# Usage: build_cluster.sh [module dir, default tests/cluster]. build/cluster/<link> points at the
# newest build: `current` for tests/cluster, the module folder's name otherwise.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
module="$root/${1:-tests/cluster}"
if ! command -v go >/dev/null 2>&1; then
  echo "build_cluster.sh: the Go toolchain is needed to build the test tiers (go 1.26+)" >&2
  exit 3
fi
CGO_ENABLED="$(go env CGO_ENABLED)"
TAGS=""
PACKAGES=""
[ -f "$module/build.env" ] && . "$module/build.env"
key="$(cd "$module" && cat go.mod go.sum $(find cmd -name '*.go' | sort) $(ls build.env 2>/dev/null) \
  "$root/scripts/build_cluster.sh" | sha256sum | cut -c1-16)"
out="$root/build/cluster/$key"
mkdir -p "$root/build/cluster"
# One build at a time: concurrent pytest sessions (and developers) share build/cluster.
exec 9>"$root/build/cluster/.lock-$(basename "$module")"
flock 9
binaries=()
for dir in "$module"/cmd/*/; do binaries+=("$(basename "$dir")"); done
for pkg in $PACKAGES; do binaries+=("$(basename "$pkg")"); done
complete=1
for b in "${binaries[@]}"; do [ -x "$out/$b" ] || complete=0; done
if [ "$complete" = 0 ]; then
  mkdir -p "$out.tmp"
  echo "build_cluster.sh: building ${binaries[*]} into $out (first time: ~10 min)" >&2
  ldflags="-s -w"
  # Stamp the release the way Kubernetes' hack/lib/version.sh (and containerd's Makefile) do,
  # so /version, the Node's nodeInfo and `containerd --version` say the release, not a dev build.
  version="$(cd "$module" && go list -m -f '{{.Version}}' k8s.io/kubernetes 2>/dev/null || true)"
  if [ -n "$version" ]; then
    major="${version#v}"; major="${major%%.*}"
    minor="${version#v*.}"; minor="${minor%%.*}"
    for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
      ldflags+=" -X $pkg.gitVersion=$version -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor"
      ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
    done
  fi
  containerd="$(cd "$module" && go list -m -f '{{.Version}}' github.com/containerd/containerd/v2 2>/dev/null || true)"
  if [ -n "$containerd" ]; then
    ldflags+=" -X github.com/containerd/containerd/v2/version.Version=$containerd"
  fi
  helm="$(cd "$module" && go list -m -f '{{.Version}}' helm.sh/helm/v4 2>/dev/null || true)"
  if [ -n "$helm" ]; then
    # As helm's Makefile stamps a release build, so `helm version` says the release.
    ldflags+=" -X helm.sh/helm/v4/internal/version.version=$helm -X helm.sh/helm/v4/internal/version.metadata="
    ldflags+=" -X helm.sh/helm/v4/internal/version.gitTreeState=clean"
  fi
  (cd "$module" && CGO_ENABLED="$CGO_ENABLED" go build -buildvcs=false -trimpath -tags "$TAGS" \
    -ldflags "$ldflags" -o "$out.tmp/" ./cmd/... $PACKAGES)
  rm -rf "$out" && mv "$out.tmp" "$out"
fi
link=current
[ "${1:-tests/cluster}" = tests/cluster ] || link="$(basename "$module")"
ln -sfn "$key" "$root/build/cluster/$link"
echo "$out"
