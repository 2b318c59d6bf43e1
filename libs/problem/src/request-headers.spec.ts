import { createServer, type IncomingMessage, type Server } from 'node:http';
import { connect, type AddressInfo } from 'node:net';
import { headerValues } from './request-headers';

describe('headerValues', () => {
  let server: Server;
  let received: Promise<IncomingMessage>;
  let receive: (req: IncomingMessage) => void;

  beforeAll(async () => {
    server = createServer((req, res) => {
      receive(req);
      res.end();
    });
    await new Promise<void>((done) => server.listen(0, '127.0.0.1', done));
  });
  afterAll(() => new Promise<void>((done) => server.close(() => done())));

  /** Sends `head` as written (names in any case, repeated lines) and resolves with the request Node parsed. */
  const send = (head: string): Promise<IncomingMessage> => {
    received = new Promise((r) => (receive = r));
    const socket = connect((server.address() as AddressInfo).port, '127.0.0.1');
    socket.end(`POST /x HTTP/1.1\r\nHost: local\r\nContent-Length: 0\r\n${head}\r\n`);
    socket.resume();
    return received;
  };

  it("gives each header's values as headersDistinct does: every line, in order, whatever the case of its name", async () => {
    const req = await send(
      'Authorization: Bearer a\r\n' +
        'X-Tenant: one\r\n' +
        'authorization: Bearer b\r\n' +
        'IDEMPOTENCY-KEY: k\r\n' +
        'x-tenant:  two \r\n' +
        'X-Empty:\r\n',
    );
    for (const name of ['authorization', 'x-tenant', 'idempotency-key', 'x-empty', 'host', 'content-length']) {
      expect([name, headerValues(req, name)]).toEqual([name, req.headersDistinct[name]]);
    }
    expect(headerValues(req, 'authorization')).toEqual(['Bearer a', 'Bearer b']);
    expect(headerValues(req, 'x-tenant')).toEqual(['one', 'two']);
    expect(headerValues(req, 'X-Tenant')).toEqual(['one', 'two']);
  });

  it('gives undefined for a header the request does not have', async () => {
    const req = await send('X-Other: 1\r\n');
    expect(headerValues(req, 'authorization')).toBeUndefined();
    expect(req.headersDistinct.authorization).toBeUndefined();
  });
});
