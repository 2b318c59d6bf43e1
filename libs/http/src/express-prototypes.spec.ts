import { Controller, Get, Module, Req, Res } from '@nestjs/common';
import type { NestExpressApplication } from '@nestjs/platform-express';
import type { Request, Response } from 'express';
import { IncomingMessage, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { createHttpApp } from './create-http-app';
import { useExpressPrototypes } from './express-prototypes';

@Controller('echo')
class EchoController {
  @Get()
  echo(@Req() req: Request, @Res() res: Response): void {
    // Express's own methods on both: `req.get`, `res.status().json()`.
    res.status(203).json({ agent: req.get('user-agent') ?? null, path: req.path });
  }
}

@Module({ controllers: [EchoController] })
class EchoModule {}

describe('useExpressPrototypes', () => {
  let app: NestExpressApplication;
  let url: string;

  beforeAll(async () => {
    app = await createHttpApp(EchoModule);
    await app.listen(0, '127.0.0.1');
    url = `http://127.0.0.1:${(app.getHttpServer().address() as AddressInfo).port}`;
  });
  afterAll(() => app.close());

  it("makes each request and response with Express's prototypes before Express sees them, and Express works on", async () => {
    const express = app.getHttpAdapter().getInstance() as { request: object; response: object };
    const seen: { request: boolean; response: boolean; node: boolean }[] = [];
    const server: Server = app.getHttpServer();
    const look = (req: IncomingMessage, res: object): void => {
      seen.push({
        request: Object.getPrototypeOf(req) === express.request,
        response: Object.getPrototypeOf(res) === express.response,
        node: req instanceof IncomingMessage,
      });
    };
    server.prependListener('request', look);
    try {
      const answer = await fetch(`${url}/echo?x=1`, { headers: { 'user-agent': 'spec' } });
      expect({ status: answer.status, body: await answer.json() }).toEqual({
        status: 203,
        body: { agent: 'spec', path: '/echo' },
      });
    } finally {
      server.removeListener('request', look);
    }
    expect(seen).toEqual([{ request: true, response: true, node: true }]);
  });

  it('leaves a server whose classes are set already as it is', () => {
    // Done once by createHttpApp: the classes are Express's now, not Node's defaults.
    expect(useExpressPrototypes(app)).toBe(false);
  });
});
