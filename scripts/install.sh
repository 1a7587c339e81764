#!/usr/bin/env bash
# Installs everything the project, its tests and its benchmarks need, from the
# project's own files: Debian packages (nginx and aria2 serve and fetch bytes in
# tests and benchmarks; runc, CNI plugins, busybox and iptables run the node tier),
# the pinned Python distribution with its test extra, Azurite (npm; the
# Azure Blob emulator the az:// tests run against) in build/azurite.
set -euo pipefail
venv=${1:-.venv}

need_apt=()
command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ] || need_apt+=(nginx-light)
command -v aria2c >/dev/null 2>&1 || need_apt+=(aria2)
# The node tier (tests/node): runc and the CNI plugins run its Pods, busybox-static fills its
# test image, iptables is what the CNI bridge plugin and the kubelet program.
command -v runc >/dev/null 2>&1 || [ -x /usr/sbin/runc ] || need_apt+=(runc)
[ -x /usr/lib/cni/bridge ] || need_apt+=(containernetworking-plugins)
[ -x /bin/busybox ] || need_apt+=(busybox-static)
command -v iptables >/dev/null 2>&1 || [ -x /usr/sbin/iptables ] || need_apt+=(iptables)
if [ ${#need_apt[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
  else
    echo "install.sh: please install ${need_apt[*]} (Debian packages); tests that need them will skip" >&2
  fi
fi

[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/python" -m pip install -q --disable-pip-version-check --upgrade pip setuptools wheel 2>&1 | grep -v '^WARNING: Location' || true
"$venv/bin/python" -m pip install -q --disable-pip-version-check -e '.[test]' 2>&1 | grep -v '^WARNING: Location' || true
"$venv/bin/python" -c 'import praesto, praesto.hooks, praesto.agent, praesto.csi' 

# Azurite, project-local (build/ is not committed); skipped when already at this version.
azurite_version=3.37.0
azurite_dir="$(cd "$(dirname "$0")/.." && pwd)/build/azurite"
if ! grep -qs "\"version\": \"$azurite_version\"" "$azurite_dir/node_modules/azurite/package.json"; then
  if command -v npm >/dev/null 2>&1 && command -v node >/dev/null 2>&1; then
    npm install --prefix "$azurite_dir" --no-audit --no-fund --loglevel=error "azurite@$azurite_version" >/dev/null \
      || echo "install.sh: npm could not install azurite@$azurite_version; the Azure emulator tests will skip" >&2
  else
    echo "install.sh: node/npm not found; the Azure (Azurite) emulator tests will skip" >&2
  fi
fi
