#!/usr/bin/env bash
# npm start: build, migrate, then api, worker and relay in one terminal.
# Logs are pino's JSON lines; on a terminal they go through pino-pretty
# (one readable line each, the app's name first), elsewhere (a pipe, a file,
# CI) they stay JSON for whatever reads them.
#
# Ctrl-C reaches every process of the terminal's foreground group at once.
# Each app drains and exits 0 on it; so that nothing between them and npm dies
# of the signal instead (and npm answers 130, concurrently "exited with code
# SIGINT"), every shell in the chain execs its command (`sh -c` waits for its
# child but dies of SIGINT itself), the tools run from node_modules/.bin, not
# through npx (an npm process and a shell more), and pino-pretty outlives the
# signal to print the shutdown (it ignores SIGINT when it reads a pipe).
set -euo pipefail
cd "$(dirname "$0")/.."
PATH="$PWD/node_modules/.bin:$PATH"
npm run --silent build
npm run --silent migration:run
apps=(--kill-others-on-fail --names api,worker,relay
  "exec node dist/apps/api/main.js" "exec node dist/apps/worker/main.js" "exec node dist/apps/relay/main.js")
if [ -t 1 ]; then
  concurrently --raw "${apps[@]}" | pino-pretty --colorize --singleLine --ignore pid,hostname --messageFormat '{app} {msg}'
else
  exec concurrently "${apps[@]}"
fi
