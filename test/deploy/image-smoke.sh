#!/usr/bin/env bash
# The Dockerfile's runtime stage, reproduced without a Docker engine, then the
# whole chain through it: production dependencies only (npm ci --omit=dev),
# NODE_ENV=production, the built dist/, the migration Job's command, the three
# apps by their commands, one job from POST to webhook delivery.
#
# What it proves that npm test cannot: nothing at run time needs a
# devDependency, and the production configuration rules let the apps start.
# What it cannot prove: the base image, the user, the layers (no engine here).
#
#   bash test/deploy/image-smoke.sh      # after npm ci; needs the npm registry
#
# Uses Redis database 15, a PostgreSQL database llmwf_image_smoke (both
# emptied afterwards) and the ports 18000-18003.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
REDIS_BASE=${REDIS_URL:-redis://127.0.0.1:6379}
PG_BASE=${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/postgres}
REDIS_URL_SMOKE="${REDIS_BASE%/*}/15"
[[ "$REDIS_BASE" =~ ^redis://[^/]+$ ]] && REDIS_URL_SMOKE="$REDIS_BASE/15"
DB=llmwf_image_smoke
DATABASE_URL_SMOKE="${PG_BASE%/*}/$DB"
API_PORT=18000 WORKER_PORT=18001 RELAY_PORT=18002 HOOK_PORT=18003
API_KEY=smoke-tenant-key-0123456789
IMG=$(mktemp -d /tmp/llmwf-image.XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$IMG"
  PGOPTIONS="-c client_min_messages=warning" psql "$PG_BASE" -q -c "DROP DATABASE IF EXISTS $DB" || true
  redis-cli -u "$REDIS_URL_SMOKE" flushdb >/dev/null 2>&1 || true
}
trap cleanup EXIT

step() { printf '\n== %s\n' "$*"; }

step "build (the image's build stage)"
npm run build >/dev/null

step "runtime stage: package files, npm ci --omit=dev, dist/"
cp package.json package-lock.json "$IMG/"
(cd "$IMG" && npm ci --omit=dev --no-audit --no-fund --loglevel=error >/dev/null)
cp -r dist "$IMG/dist"
# (typescript and ts-node stay: npm keeps them as optional peers of @nestjs/swagger and typeorm.)
for dev in jest @nestjs/cli @nestjs/testing supertest concurrently @rspack/core; do
  [ ! -d "$IMG/node_modules/$dev" ] || { echo "the devDependency $dev is in the runtime stage" >&2; exit 1; }
done
echo "node_modules: $(du -sh "$IMG/node_modules" | cut -f1)"

step "a fresh database, and the migration Job's command"
PGOPTIONS="-c client_min_messages=warning" psql "$PG_BASE" -q -v ON_ERROR_STOP=1 -c "DROP DATABASE IF EXISTS $DB" -c "CREATE DATABASE $DB"
redis-cli -u "$REDIS_URL_SMOKE" flushdb >/dev/null
cd "$IMG"
export NODE_ENV=production NODE_OPTIONS=--max-semi-space-size=32 REDIS_URL="$REDIS_URL_SMOKE" DATABASE_URL="$DATABASE_URL_SMOKE" LOG_LEVEL=warn
node dist/apps/admin/main.js migrate

step "a webhook receiver that counts deliveries per Idempotency-Key"
node -e '
  const seen = {};
  require("node:http").createServer((req, res) => {
    let body = ""; req.on("data", (c) => (body += c)); req.on("end", () => {
      if (req.url === "/count") { res.end(JSON.stringify(seen)); return; }
      const k = req.headers["idempotency-key"]; seen[k] = (seen[k] || 0) + 1; res.statusCode = 204; res.end();
    });
  }).listen(Number(process.argv[1]), "127.0.0.1");
' "$HOOK_PORT" &
pids+=($!)

step "the three apps, by their commands"
PORT=$API_PORT API_KEYS="smoke:$API_KEY" ADMIN_API_KEY=smoke-admin-key-0123456789abcdef node dist/apps/api/main.js &
pids+=($!)
HEALTH_PORT=$WORKER_PORT node dist/apps/worker/main.js &
pids+=($!)
HEALTH_PORT=$RELAY_PORT NOTIFY_WEBHOOK_URL="http://127.0.0.1:$HOOK_PORT/hook" node dist/apps/relay/main.js &
pids+=($!)

ready() { curl -fsS -o /dev/null "http://127.0.0.1:$1/health/ready" 2>/dev/null; }
for port in $API_PORT $WORKER_PORT $RELAY_PORT; do
  for _ in $(seq 1 100); do ready "$port" && break; sleep 0.2; done
  ready "$port" || { echo "port $port never became ready" >&2; exit 1; }
  echo "ready: $port"
done

step "one job: POST, its retry, GET until done, one delivery"
post() {
  curl -sS -o "$IMG/answer.json" -w '%{http_code}' -X POST "http://127.0.0.1:$API_PORT/v1/summaries" \
    -H "Authorization: Bearer $API_KEY" -H 'Content-Type: application/json' \
    -H 'Idempotency-Key: image-smoke-key-0001' \
    -d '{"text":"The image runs every app from one build.","notify":"ops@example.com"}'
}
first=$(post); again=$(post)
[ "$first" = 202 ] && [ "$again" = 202 ] || { echo "POST answered $first, then $again" >&2; exit 1; }
job=$(node -p 'JSON.parse(require("node:fs").readFileSync(process.argv[1], "utf8")).job_id' "$IMG/answer.json")
status=
for _ in $(seq 1 100); do
  status=$(curl -fsS "http://127.0.0.1:$API_PORT/v1/summaries/$job" -H "Authorization: Bearer $API_KEY")
  [[ "$status" == *'"done"'* ]] && break
  sleep 0.1
done
echo "$status"
[[ "$status" == *'"done"'* ]] || { echo "the job never finished" >&2; exit 1; }
deliveries=
for _ in $(seq 1 100); do
  deliveries=$(curl -fsS "http://127.0.0.1:$HOOK_PORT/count")
  [ "$deliveries" != '{}' ] && break
  sleep 0.1
done
echo "deliveries: $deliveries"
[ "$deliveries" = "{\"summary_ready:$job\":1}" ] || { echo "expected one delivery for summary_ready:$job" >&2; exit 1; }
pending=$(redis-cli -u "$REDIS_URL_SMOKE" xpending '{summaries}:jobs' summarizers | head -1)
[ "$pending" = 0 ] || { echo "$pending entries still pending" >&2; exit 1; }
echo "pending entries: 0"

step "SIGTERM: each app drains and exits 0"
for i in 1 2 3; do
  kill -TERM "${pids[$i]}"
  code=0; wait "${pids[$i]}" || code=$?
  [ "$code" = 0 ] || { echo "app ${i} exited $code" >&2; exit 1; }
done
echo "all three exited 0"
cd "$ROOT"
echo "image smoke: ok"
