#!/usr/bin/env bash
# npm test [-- <jest arguments>]: the type check, ESLint, Prettier's check,
# then jest (whose global setup builds the apps into dist/).
#
# Each check keeps a cache in node_modules/.cache/llmwf, so a second run
# checks again only what changed since the first: the type check is
# incremental, ESLint and Prettier skip the files whose content they passed.
# A fresh clone (CI: .ci/run) has no cache, and checks everything. ESLint's
# cache knows a file, not the types it reads from others: after a change to a
# shared type, `rm -rf node_modules/.cache/llmwf` checks every file again.
set -euo pipefail
cd "$(dirname "$0")/.."
PATH="$PWD/node_modules/.bin:$PATH"
cache=node_modules/.cache/llmwf
mkdir -p "$cache"
tsc -p tsconfig.json --noEmit --incremental --tsBuildInfoFile "$cache/tsc.tsbuildinfo"
eslint . --max-warnings 0 --cache --cache-strategy content --cache-location "$cache/eslint/"
prettier --check --log-level warn --cache --cache-location "$cache/prettier" "**/*.{ts,mjs}"
NODE_OPTIONS=--experimental-vm-modules exec jest "$@"
