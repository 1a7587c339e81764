#!/usr/bin/env bash
# Builds the upstream control plane the real-cluster test tier runs (etcd,
# kube-apiserver, kube-controller-manager, kube-scheduler) from the Go module in
# tests/cluster, once per content of that module: build/cluster/<key>/, where
# <key> hashes go.mod, go.sum and the command sources. Prints that directory.
# A cold build takes ~10 minutes on 2 cores; later runs reuse it (and the Go
# build cache makes a rebuild after a small change quick).
# Usage: build_cluster.sh [module dir, default tests/cluster]; tests/cluster/compat-1.30
# builds the oldest release the chart claims (etcd and kube-apiserver only).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
module="$root/${1:-tests/cluster}"
if ! command -v go >/dev/null 2>&1; then
  echo "build_cluster.sh: the Go toolchain is needed to build the control-plane test tier (go 1.26+)" >&2
  exit 3
fi
key="$(cd "$module" && cat go.mod go.sum $(find cmd -name '*.go' | sort) "$root/scripts/build_cluster.sh" | sha256sum | cut -c1-16)"
out="$root/build/cluster/$key"
binaries=()
for dir in "$module"/cmd/*/; do binaries+=("$(basename "$dir")"); done
complete=1
for b in "${binaries[@]}"; do [ -x "$out/$b" ] || complete=0; done
if [ "$complete" = 0 ]; then
  mkdir -p "$out.tmp"
  echo "build_cluster.sh: building ${binaries[*]} into $out (first time: ~10 min)" >&2
  # Stamp the release the way Kubernetes' hack/lib/version.sh does, so /version and
  # the components' emulation version say v1.x.y instead of a development build.
  version="$(cd "$module" && go list -m -f '{{.Version}}' k8s.io/kubernetes)"
  major="${version#v}"; major="${major%%.*}"
  minor="${version#v*.}"; minor="${minor%%.*}"
  ldflags="-s -w"
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldflags+=" -X $pkg.gitVersion=$version -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor"
    ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
  done
  (cd "$module" && go build -buildvcs=false -trimpath -ldflags "$ldflags" -o "$out.tmp/" ./cmd/...)
  rm -rf "$out" && mv "$out.tmp" "$out"
fi
link=current
[ "${1:-tests/cluster}" = tests/cluster ] || link="$(basename "$module")"
ln -sfn "$key" "$root/build/cluster/$link"
echo "$out"
