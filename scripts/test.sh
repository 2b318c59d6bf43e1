#!/usr/bin/env bash
# npm test [-- <jest arguments>]: the type check, ESLint, Prettier's check,
# then jest (whose global setup builds the apps into dist/).
#
# Each check keeps a cache in node_modules/.cache/llmwf, so a second run
# checks again only what changed since the first: the type check is
# incremental, ESLint and Prettier skip the files whose content they passed.
# With CI set (.ci/run sets it), or on a fresh clone, every check runs in full. ESLint's
# cache knows a file, not the types it reads from others: after a change to a
# shared type, `rm -rf node_modules/.cache/llmwf` checks every file again.
set -euo pipefail
cd "$(dirname "$0")/.."
PATH="$PWD/node_modules/.bin:$PATH"
cache=node_modules/.cache/llmwf
mkdir -p "$cache"
if [ -n "${CI:-}" ]; then
  # CI (.ci/run sets it) checks every file whatever caches a restored node_modules holds: ESLint's type-aware
  # rules read other files' types, which its cache does not key on.
  tsc -p tsconfig.json --noEmit
  eslint . --max-warnings 0
  prettier --check --log-level warn "**/*.{ts,mjs}"
else
  tsc -p tsconfig.json --noEmit --incremental --tsBuildInfoFile "$cache/tsc.tsbuildinfo"
  eslint . --max-warnings 0 --cache --cache-strategy content --cache-location "$cache/eslint/"
  prettier --check --log-level warn --cache --cache-location "$cache/prettier" "**/*.{ts,mjs}"
fi
NODE_OPTIONS=--experimental-vm-modules exec jest "$@"
