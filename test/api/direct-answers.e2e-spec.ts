import {
  Body,
  ClassSerializerInterceptor,
  Controller,
  Header,
  HttpCode,
  Module,
  Post,
  Res,
  UseGuards,
} from '@nestjs/common';
import { APP_INTERCEPTOR } from '@nestjs/core';
import { DirectAnswer, Idempotent } from '@app/idempotency';
import type { Response } from 'express';
import { IsString } from 'class-validator';
import { randomUUID } from 'node:crypto';
import request from 'supertest';
import { ApiKeyGuard } from '../../apps/api/src/auth/api-key.guard';
import { type ApiHarness, bearer, startApi, TENANT_A } from '../support/api-harness';

class NoteDto {
  @IsString() text!: string;
}

const runs = { json: 0, text: 0, empty: 0, whole: 0 };

@Controller('test/answers')
@UseGuards(ApiKeyGuard)
class AnswersController {
  @Post('json')
  @HttpCode(201)
  @Idempotent()
  json(@Body() body: NoteDto, @Res({ passthrough: true }) res: Response): object {
    runs.json++;
    const id = randomUUID();
    res.setHeader('Location', `/test/answers/${id}`);
    res.setHeader('Set-Cookie', 'session=never-replayed');
    return { id, text: body.text, unicode: 'Grüße, 世界' };
  }

  @Post('text')
  @HttpCode(200)
  @Header('Content-Type', 'text/plain; charset=iso-8859-1')
  @Idempotent()
  text(@Body() body: NoteDto): string {
    runs.text++;
    return `noted: ${body.text} ${randomUUID()}`;
  }

  @Post('empty')
  @HttpCode(204)
  @Idempotent()
  empty(@Body() _body: NoteDto): void {
    runs.empty++;
  }
}

@Module({ controllers: [AnswersController] })
class AnswersModule {}

/** A handler that answers with the bytes it holds (the gateway's relay does), for the api's adapter only. */
@Controller('test/answers')
@UseGuards(ApiKeyGuard)
class WholeAnswersController {
  @Post('whole')
  @Idempotent()
  whole(@Body() body: NoteDto): DirectAnswer {
    runs.whole++;
    const bytes = Buffer.from(JSON.stringify({ id: randomUUID(), text: body.text }));
    return new DirectAnswer(201, { 'content-type': 'application/json' }, bytes);
  }
}

@Module({ controllers: [WholeAnswersController] })
class WholeAnswersModule {}

/** An app-wide interceptor outside the idempotency one that maps every answer, as many apps have one. */
@Module({ providers: [{ provide: APP_INTERCEPTOR, useClass: ClassSerializerInterceptor }] })
class SerializerModule {}

/*
 * A replay is one end() of the stored bytes with the api's adapter, a web
 * Response with Nest's own: to a client the two are the same answer, and
 * both are the first answer again.
 */
describe.each([
  ['the api adapter (replays written straight to the response)', false, false],
  ["Nest's own Express adapter (replays as web Responses)", true, false],
  ['the api adapter, under ClassSerializerInterceptor', false, true],
  ["Nest's own Express adapter, under ClassSerializerInterceptor", true, true],
])('replays through %s', (_name, nestAdapter, serializer) => {
  let api: ApiHarness;
  beforeAll(async () => {
    api = await startApi({ imports: [AnswersModule], outerImports: serializer ? [SerializerModule] : [], nestAdapter });
  });
  afterAll(() => api.close());

  const post = (path: string, key: string, body: object) =>
    request(api.server)
      .post(`/test/answers/${path}`)
      .set('Authorization', bearer(TENANT_A))
      .set('Idempotency-Key', key)
      .send(body);

  it('a JSON answer comes back with its status, bytes, Location and exact Content-Type, and no cookie', async () => {
    const key = randomUUID();
    const before = runs.json;
    const first = await post('json', key, { text: 'hello' });
    const replay = await post('json', key, { text: 'hello' });
    expect(first.status).toBe(201);
    expect(replay.status).toBe(201);
    expect(replay.text).toBe(first.text);
    expect(Object.keys(first.body as object)).toEqual(['id', 'text', 'unicode']);
    expect(replay.headers['content-type']).toBe(first.headers['content-type']);
    expect(replay.headers['location']).toBe(first.headers['location']);
    expect(replay.headers['content-length']).toBe(String(Buffer.byteLength(first.text)));
    expect(replay.headers['idempotent-replayed']).toBe('true');
    expect(first.headers['idempotent-replayed']).toBeUndefined();
    // The cookie the handler set goes out with its own answer, never with a replay.
    expect(first.headers['set-cookie']).toEqual(['session=never-replayed']);
    expect(replay.headers['set-cookie']).toBeUndefined();
    expect(replay.headers['x-request-id']).toBeTruthy();
    expect(runs.json - before).toBe(1);
  });

  it('a text answer keeps the charset its handler gave it, and its bytes', async () => {
    const key = randomUUID();
    const before = runs.text;
    const first = await post('text', key, { text: 'plain' });
    const replay = await post('text', key, { text: 'plain' });
    expect(first.status).toBe(200);
    expect(replay.status).toBe(200);
    expect(replay.headers['content-type']).toBe(first.headers['content-type']);
    expect(replay.text).toBe(first.text);
    expect(runs.text - before).toBe(1);
  });

  it('a 204 comes back as a 204 with no body', async () => {
    const key = randomUUID();
    const before = runs.empty;
    const first = await post('empty', key, { text: 'nothing' });
    const replay = await post('empty', key, { text: 'nothing' });
    expect(first.status).toBe(204);
    expect(replay.status).toBe(204);
    expect(replay.text).toBe('');
    expect(replay.headers['idempotent-replayed']).toBe('true');
    expect(runs.empty - before).toBe(1);
  });

  it('the same key with another body is still a 422, and nothing runs', async () => {
    const key = randomUUID();
    const before = runs.json;
    await post('json', key, { text: 'one' });
    const other = await post('json', key, { text: 'two' });
    expect(other.status).toBe(422);
    expect(other.headers['content-type']).toMatch(/^application\/problem\+json/);
    expect(runs.json - before).toBe(1);
  });
});

describe.each([
  ['the api adapter (sent as it is)', false],
  ["Nest's own Express adapter (sent as the web Response it stands for)", true],
])("a handler's own DirectAnswer, through %s", (_name, nestAdapter) => {
  let api: ApiHarness;
  beforeAll(async () => {
    api = await startApi({ imports: [WholeAnswersModule], nestAdapter });
  });
  afterAll(() => api.close());

  it('is sent as it is, stored as sent, and replayed byte for byte; the handler runs once', async () => {
    const key = randomUUID();
    const before = runs.whole;
    const post = () =>
      request(api.server)
        .post('/test/answers/whole')
        .set('Authorization', bearer(TENANT_A))
        .set('Idempotency-Key', key)
        .send({ text: 'held' });
    const first = await post();
    const replay = await post();
    expect(first.status).toBe(201);
    expect(first.headers['content-type']).toBe('application/json');
    expect((first.body as { text: string }).text).toBe('held');
    expect(first.headers['idempotent-replayed']).toBeUndefined();
    expect(replay.status).toBe(201);
    expect(replay.text).toBe(first.text);
    expect(replay.headers['content-type']).toBe('application/json');
    expect(replay.headers['idempotent-replayed']).toBe('true');
    expect(runs.whole - before).toBe(1);
  });
});
