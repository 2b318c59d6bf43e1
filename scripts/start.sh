#!/usr/bin/env bash
# npm start: build, migrate, then api, worker and relay in one terminal.
# Logs are pino's JSON lines; on a terminal they go through pino-pretty
# (one readable line each, the app's name first), elsewhere (a pipe, a file,
# CI) they stay JSON for whatever reads them.
set -euo pipefail
cd "$(dirname "$0")/.."
npm run build
npm run migration:run
apps=(--kill-others-on-fail --names api,worker,relay "node dist/apps/api/main.js" "node dist/apps/worker/main.js" "node dist/apps/relay/main.js")
if [ -t 1 ]; then
  npx concurrently --raw "${apps[@]}" | npx pino-pretty --colorize --singleLine --ignore pid,hostname --messageFormat '{app} {msg}'
else
  npx concurrently "${apps[@]}"
fi
