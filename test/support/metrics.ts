import request from 'supertest';
import type { Server } from 'node:http';

/** The value of one sample from the app's /metrics (a server, or a URL such as a process's), 0 when it is absent. */
export async function metricValue(
  server: Server | string,
  name: string,
  labels: Record<string, string> = {},
): Promise<number> {
  return (await metricSample(server, name, labels)) ?? 0;
}

/** The value of one sample from the app's /metrics, undefined when there is no such series. */
export async function metricSample(
  server: Server | string,
  name: string,
  labels: Record<string, string> = {},
): Promise<number | undefined> {
  const res = await request(server).get('/metrics').expect(200);
  const wanted = Object.entries(labels).map(([k, v]) => `${k}="${v}"`);
  for (const line of res.text.split('\n')) {
    if (!line.startsWith(name)) continue;
    const match = /^([a-zA-Z_:][\w:]*)(\{([^}]*)\})?\s+(\S+)$/.exec(line);
    if (!match || match[1] !== name) continue;
    const have = (match[3] ?? '').split(',').filter(Boolean);
    if (wanted.every((w) => have.includes(w)) && have.length === wanted.length) return Number(match[4]);
  }
  return undefined;
}
