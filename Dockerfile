# syntax=docker/dockerfile:1
# One image for the three apps and the admin tool: pick one by its command, e.g.
#   docker run IMAGE node dist/apps/worker/main.js
#   docker run IMAGE node dist/apps/admin/main.js migrate
FROM node:24-bookworm-slim AS build
WORKDIR /app
COPY package.json package-lock.json ./
RUN npm ci --no-audit --no-fund
COPY . .
RUN npm run build

FROM node:24-bookworm-slim AS runtime
ENV NODE_ENV=production
# In a container Node sizes V8's heap from the memory limit, and its young
# generation with it: in a 512 MiB cgroup the api's first requests cost 2x the
# CPU of an unlimited process, the time going to GC. A 32 MiB semi-space took
# it from 1,423-1,657 to 1,816-2,171 req/s (peak RSS 197 -> 244 MiB, well inside
# the limit), measured side by side in two 512 MiB cgroups; see docs/benchmarks.md.
ENV NODE_OPTIONS=--max-semi-space-size=32
WORKDIR /app
COPY package.json package-lock.json ./
RUN npm ci --omit=dev --no-audit --no-fund && npm cache clean --force
COPY --from=build /app/dist ./dist
# Numeric, so Kubernetes can check runAsNonRoot (uid 1000 is the image's `node` user).
USER 1000:1000
EXPOSE 3000 3001 3002
CMD ["node", "dist/apps/api/main.js"]
