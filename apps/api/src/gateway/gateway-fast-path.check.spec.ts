import 'reflect-metadata';
import {
  Body,
  type CallHandler,
  type CanActivate,
  Catch,
  Controller,
  HttpCode,
  Injectable,
  type NestInterceptor,
  Post,
  Req,
  Res,
  UseGuards,
  UseFilters,
  UseInterceptors,
  ValidationPipe,
  Version,
} from '@nestjs/common';
import { ApplicationConfig } from '@nestjs/core';
import { type FastPathExpectations, fastPathMismatches } from './gateway-fast-path.check';

@Injectable()
class KeyGuard implements CanActivate {
  canActivate(): boolean {
    return true;
  }
}
@Catch()
class EnvelopeFilter {
  catch(): void {}
}
@Injectable()
class Interceptor implements NestInterceptor {
  intercept(_: unknown, next: CallHandler) {
    return next.handle();
  }
}
class BodyPipe {
  transform(value: unknown): unknown {
    return value;
  }
}

class Parameters {
  create(@Body(BodyPipe) _body: unknown, @Req() _req: unknown): void {}
}

@UseGuards(KeyGuard)
@UseFilters(EnvelopeFilter)
class AsServed {
  @Post()
  @HttpCode(200)
  create(@Body(BodyPipe) body: unknown, @Req() req: unknown): unknown {
    return [body, req];
  }
}

const expected: FastPathExpectations = {
  guards: [KeyGuard],
  filters: [EnvelopeFilter],
  status: 200,
  parameters: { owner: Parameters, method: 'create' },
  globalGuards: [],
  globalInterceptors: [Interceptor],
  globalPipes: [ValidationPipe],
};

function appConfig(): ApplicationConfig {
  const config = new ApplicationConfig();
  config.addGlobalRequestInterceptor({ instance: new Interceptor() } as never);
  config.addGlobalPipe(new ValidationPipe());
  return config;
}

describe('fastPathMismatches', () => {
  it('finds none for a route decorated as the fast path serves it', () => {
    expect(fastPathMismatches(AsServed, expected, appConfig())).toEqual([]);
  });

  it('names an interceptor or a guard the route gained', () => {
    @UseGuards(KeyGuard, KeyGuard)
    @UseFilters(EnvelopeFilter)
    class MoreGuards {
      @Post()
      @HttpCode(200)
      @UseInterceptors(Interceptor)
      create(@Body(BodyPipe) body: unknown, @Req() req: unknown): unknown {
        return [body, req];
      }
    }
    expect(fastPathMismatches(MoreGuards, expected, appConfig())).toEqual([
      'guards: [KeyGuard, KeyGuard], not [KeyGuard]',
      'interceptors of create: [Interceptor], not []',
    ]);
  });

  it('names parameters and a status other than those it gives', () => {
    @UseGuards(KeyGuard)
    @UseFilters(EnvelopeFilter)
    class OtherParameters {
      @Post()
      create(@Body() body: unknown, @Req() req: unknown): unknown {
        return [body, req];
      }
    }
    const found = fastPathMismatches(OtherParameters, expected, appConfig());
    expect(found).toHaveLength(2);
    expect(found[0]).toBe('status of create: undefined, not 200');
    expect(found[1]).toBe(
      'parameters of create: {"parameters":[["3:0",0,null,[],"Object"],["0:1",1,null,[],"Object"]],"passthrough":null}, ' +
        'not {"parameters":[["3:0",0,null,["BodyPipe"],"Object"],["0:1",1,null,[],"Object"]],"passthrough":null}',
    );
  });

  it('names a filter, a version or a host of the route', () => {
    @UseGuards(KeyGuard)
    @UseFilters(EnvelopeFilter, EnvelopeFilter)
    @Controller({ host: 'api.example.com' })
    class Elsewhere {
      @Post()
      @HttpCode(200)
      @Version('2')
      create(@Body(BodyPipe) body: unknown, @Req() req: unknown): unknown {
        return [body, req];
      }
    }
    expect(fastPathMismatches(Elsewhere, expected, appConfig())).toEqual([
      'exception filters: [EnvelopeFilter, EnvelopeFilter], not [EnvelopeFilter]',
      'a version of create',
      'a host',
    ]);
  });

  it('names a response the handler sends itself, and a body of a DTO class', () => {
    class Dto {
      readonly text?: string;
    }
    class PassesThrough {
      create(@Body(BodyPipe) _body: unknown, @Req() _req: unknown, @Res({ passthrough: true }) _res: unknown): void {}
    }
    @UseGuards(KeyGuard)
    @UseFilters(EnvelopeFilter)
    class OwnResponse {
      @Post()
      @HttpCode(200)
      create(@Body(BodyPipe) body: unknown, @Req() req: unknown, @Res() res: unknown): unknown {
        return [body, req, res];
      }
    }
    @UseGuards(KeyGuard)
    @UseFilters(EnvelopeFilter)
    class DtoBody {
      @Post()
      @HttpCode(200)
      create(@Body(BodyPipe) body: Dto, @Req() req: unknown): unknown {
        return [body, req];
      }
    }
    const passingThrough = { ...expected, parameters: { owner: PassesThrough, method: 'create' } };
    expect(fastPathMismatches(OwnResponse, passingThrough, appConfig())).toEqual([
      expect.stringMatching(/^parameters of create: .*"passthrough":null\}, not .*"passthrough":true\}$/),
    ]);
    expect(fastPathMismatches(DtoBody, expected, appConfig())).toEqual([
      expect.stringMatching(/^parameters of create: .*\["BodyPipe"\],"Dto"\].*, not .*\["BodyPipe"\],"Object"\]/),
    ]);
  });

  it('names a global enhancer the app gained', () => {
    const config = appConfig();
    config.addGlobalGuard(new KeyGuard());
    config.addGlobalRequestPipe({ instance: new BodyPipe() } as never);
    expect(fastPathMismatches(AsServed, expected, config)).toEqual([
      'global guards: [KeyGuard], not []',
      'global pipes: [ValidationPipe, BodyPipe], not [ValidationPipe]',
    ]);
  });
});
