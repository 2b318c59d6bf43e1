// The packed @llm-workflows/client from an ES module (node client.mjs <api url> <api key> <idempotency key>):
// creates a summary, then sends the same call again, and prints both results as JSON.
import { ApiClient, createSummary } from '@llm-workflows/client';

const [baseUrl, apiKey, key] = process.argv.slice(2);
const client = new ApiClient({ baseUrl, apiKey });
const request = { text: 'A document to summarise, from an app outside the monorepo.', notify: 'ops@example.com' };
const first = await createSummary(client, request, key);
const again = await createSummary(client, request, key);
console.log(JSON.stringify({ first, again }));
