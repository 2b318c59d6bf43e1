import type { PipeTransform, Type } from '@nestjs/common';
import {
  EXCEPTION_FILTERS_METADATA,
  GUARDS_METADATA,
  HEADERS_METADATA,
  HOST_METADATA,
  HTTP_CODE_METADATA,
  INTERCEPTORS_METADATA,
  PIPES_METADATA,
  REDIRECT_METADATA,
  RENDER_METADATA,
  RESPONSE_PASSTHROUGH_METADATA,
  ROUTE_ARGS_METADATA,
  SSE_METADATA,
  VERSION_METADATA,
} from '@nestjs/common/constants';
import type { ApplicationConfig } from '@nestjs/core';

/**
 * What GatewayFastPath runs for a route in place of Nest: its own parts are
 * fixed in code, so a route (or the app) given another guard, interceptor,
 * pipe, filter, parameter or status would be served without it. Checked at
 * start against the route's metadata and the app's global enhancers.
 */
export interface FastPathExpectations {
  /** The controller's guards and filters, in order; none on the handler. */
  readonly guards: readonly Type[];
  readonly filters: readonly Type[];
  /** `@HttpCode()` of the handler. */
  readonly status: number;
  /** A method whose parameters' decorators are the ones the fast path gives the handler, in order. */
  readonly parameters: { readonly owner: Type; readonly method: string };
  /** The app's global guards (useGlobalGuards), and APP_INTERCEPTOR and APP_PIPE providers, in order. */
  readonly globalGuards: readonly Type[];
  readonly globalInterceptors: readonly Type[];
  readonly globalPipes: readonly Type<PipeTransform>[];
}

const names = (values: readonly unknown[] | undefined): string[] =>
  (values ?? []).map((v) => (typeof v === 'function' ? v.name : ((v as object | null)?.constructor.name ?? String(v))));

/**
 * Each parameter's decorator key, index, pipes and declared type, and whether `@Res()` passes through: equal for
 * two methods decorated alike.
 */
function parametersOf(owner: Type, method: string): string {
  const args = (Reflect.getMetadata(ROUTE_ARGS_METADATA, owner, method) ?? {}) as Record<
    string,
    { index: number; data?: unknown; pipes?: unknown[] }
  >;
  const prototype = owner.prototype as object;
  const types = names(Reflect.getMetadata('design:paramtypes', prototype, method) as unknown[] | undefined);
  const passthrough = Reflect.getMetadata(RESPONSE_PASSTHROUGH_METADATA, owner, method) as unknown;
  return JSON.stringify({
    parameters: Object.entries(args)
      .map(([key, arg]) => [key, arg.index, arg.data ?? null, names(arg.pipes), types[arg.index] ?? null] as const)
      .sort((a, b) => a[1] - b[1]),
    passthrough: passthrough ?? null,
  });
}

/** Where `controller.create` would be served otherwise by Nest than by the fast path: empty when alike. */
export function fastPathMismatches(
  controller: Type,
  expected: FastPathExpectations,
  config: Pick<
    ApplicationConfig,
    | 'getGlobalGuards'
    | 'getGlobalRequestGuards'
    | 'getGlobalInterceptors'
    | 'getGlobalRequestInterceptors'
    | 'getGlobalPipes'
    | 'getGlobalRequestPipes'
  >,
): string[] {
  const handler = (controller.prototype as Record<string, unknown>).create as object;
  const found: string[] = [];
  const compare = (what: string, have: readonly string[], want: readonly string[]): void => {
    if (JSON.stringify(have) !== JSON.stringify(want))
      found.push(`${what}: [${have.join(', ')}], not [${want.join(', ')}]`);
  };
  const metadata = (key: string, target: object) => Reflect.getMetadata(key, target) as unknown[] | undefined;
  compare('guards', names(metadata(GUARDS_METADATA, controller)), names(expected.guards));
  compare('exception filters', names(metadata(EXCEPTION_FILTERS_METADATA, controller)), names(expected.filters));
  for (const [what, key] of [
    ['interceptors', INTERCEPTORS_METADATA],
    ['pipes', PIPES_METADATA],
  ] as const)
    compare(what, names(metadata(key, controller)), []);
  for (const [what, key] of [
    ['guards of create', GUARDS_METADATA],
    ['exception filters of create', EXCEPTION_FILTERS_METADATA],
    ['interceptors of create', INTERCEPTORS_METADATA],
    ['pipes of create', PIPES_METADATA],
    ['headers of create', HEADERS_METADATA],
  ] as const)
    compare(what, names(metadata(key, handler)), []);
  for (const [what, key, target] of [
    ['a redirect of create', REDIRECT_METADATA, handler],
    ['SSE of create', SSE_METADATA, handler],
    ['a view of create', RENDER_METADATA, handler],
    ['a version of create', VERSION_METADATA, handler],
    ['a version', VERSION_METADATA, controller],
    ['a host', HOST_METADATA, controller],
  ] as const)
    if (Reflect.getMetadata(key, target) !== undefined) found.push(what);
  const status = Reflect.getMetadata(HTTP_CODE_METADATA, handler) as unknown;
  if (status !== expected.status) found.push(`status of create: ${String(status)}, not ${expected.status}`);
  const parameters = parametersOf(controller, 'create');
  const wanted = parametersOf(expected.parameters.owner, expected.parameters.method);
  if (parameters !== wanted) found.push(`parameters of create: ${parameters}, not ${wanted}`);
  const instances = (wrappers: readonly { instance: unknown }[]) => wrappers.map((w) => w.instance);
  compare(
    'global guards',
    names([...config.getGlobalGuards(), ...instances(config.getGlobalRequestGuards())]),
    names(expected.globalGuards),
  );
  compare(
    'global interceptors',
    names([...config.getGlobalInterceptors(), ...instances(config.getGlobalRequestInterceptors())]),
    names(expected.globalInterceptors),
  );
  compare(
    'global pipes',
    names([...config.getGlobalPipes(), ...instances(config.getGlobalRequestPipes())]),
    names(expected.globalPipes),
  );
  return found;
}
