import request from 'supertest';
import { type ApiHarness, startApi } from '../support/api-harness';

interface OpenApiDocument {
  components: { securitySchemes: Record<string, Record<string, unknown>> };
  paths: Record<string, Record<string, { security?: Record<string, string[]>[] }>>;
}

/*
 * The OpenAPI document is what client generators and API consoles read: its
 * URL is the README's, and its security schemes say what the keys are. An API
 * key is an opaque string sent as a bearer token; `bearerFormat: JWT` (what
 * @nestjs/swagger's addBearerAuth adds unasked) has tools decode it as a JWT.
 */
describe('the OpenAPI document', () => {
  let api: ApiHarness;
  let doc: OpenApiDocument;

  beforeAll(async () => {
    api = await startApi();
    doc = (await request(api.server).get('/docs/openapi.json').expect(200).expect('content-type', /json/))
      .body as OpenApiDocument;
  });
  afterAll(() => api?.close());

  it('is served as JSON at /docs/openapi.json, and as a page at /docs', async () => {
    expect(Object.keys(doc.paths)).toEqual(expect.arrayContaining(['/v1/summaries', '/v1/refunds']));
    await request(api.server).get('/docs').expect(200).expect('content-type', /html/);
  });

  it('declares both keys as opaque bearer tokens: no bearerFormat, a description of what they are', () => {
    expect(doc.components.securitySchemes).toEqual({
      'tenant-key': { type: 'http', scheme: 'bearer', description: expect.stringContaining('API_KEYS') },
      'admin-key': { type: 'http', scheme: 'bearer', description: expect.stringContaining('ADMIN_API_KEY') },
    });
  });

  it('has every operation that needs a key name a declared scheme: tenant routes the tenant key, /admin the admin key', () => {
    const declared = new Set(Object.keys(doc.components.securitySchemes));
    const used = Object.entries(doc.paths).flatMap(([path, ops]) =>
      Object.values(ops).flatMap((op) =>
        (op.security ?? []).flatMap((s) => Object.keys(s).map((scheme) => ({ path, scheme }))),
      ),
    );
    expect(used.filter((u) => !declared.has(u.scheme))).toEqual([]);
    expect(new Set(used.filter((u) => u.path.startsWith('/admin/')).map((u) => u.scheme))).toEqual(
      new Set(['admin-key']),
    );
    expect(new Set(used.filter((u) => u.path.startsWith('/v1/')).map((u) => u.scheme))).toEqual(
      new Set(['tenant-key']),
    );
  });
});
