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
WORKDIR /app
COPY package.json package-lock.json ./
RUN npm ci --omit=dev --no-audit --no-fund && npm cache clean --force
COPY --from=build /app/dist ./dist
# Numeric, so Kubernetes can check runAsNonRoot (uid 1000 is the image's `node` user).
USER 1000:1000
EXPOSE 3000 3001 3002
CMD ["node", "dist/apps/api/main.js"]
