#!/usr/bin/env bash
# Runs its arguments under Node 24, the project's Node (package.json engines,
# .nvmrc). With an older Node first on PATH (Node 20 ships on many machines),
# Node 24 comes once from the npm registry (the node-<os>-<arch> package) into
# a cache, ~/.cache/node24 or $NODE24_CACHE, and goes first on PATH for the
# command and everything it starts. A Node you manage yourself (nvm, fnm,
# volta) at 24 is used as it is.
set -euo pipefail

major="$(node -p 'process.versions.node.split(".")[0]')"
if [ "$major" -lt 24 ]; then
  case "$(uname -s)" in
    Linux) os=linux ;;
    Darwin) os=darwin ;;
    *) echo "node $(node --version) is older than 24, and no Node 24 package exists for $(uname -s): install Node 24 (see .nvmrc)" >&2; exit 1 ;;
  esac
  case "$(uname -m)" in
    x86_64 | amd64) arch=x64 ;;
    aarch64 | arm64) arch=arm64 ;;
    *) echo "node $(node --version) is older than 24, and no Node 24 package exists for $(uname -m): install Node 24 (see .nvmrc)" >&2; exit 1 ;;
  esac
  pkg="node-$os-$arch"
  dir="${NODE24_CACHE:-$HOME/.cache/node24}"
  bin="$dir/node_modules/$pkg/bin"
  if [ ! -x "$bin/node" ]; then
    echo "node $(node --version) is older than 24: fetching Node 24 ($pkg) from the npm registry into $dir, once" >&2
    npm install --prefix "$dir" --no-save --no-audit --no-fund --loglevel=error "$pkg@24" >/dev/null
  fi
  export PATH="$bin:$PATH"
  echo "running under node $(node --version) from $dir (the node on PATH is $major)" >&2
fi
exec "$@"
