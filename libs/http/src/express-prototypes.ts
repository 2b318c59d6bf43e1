import type { NestExpressApplication } from '@nestjs/platform-express';
import { IncomingMessage, type Server, ServerResponse } from 'node:http';

/**
 * The app's server makes its requests and responses with Express's prototypes
 * from the start, as Node's `IncomingMessage` and `ServerResponse` server
 * options do: Express's `app.handle` then finds them in place instead of
 * changing two objects' prototypes on every request, which V8 pays for with a
 * new hidden class each time (about 2% of a gateway replay's CPU, 1% of a
 * keyed call's, by profile). The objects are still Node's, with Express's
 * methods above Node's, as Express would make them a moment later; what
 * sees them before Express does (a server `request` listener of its own, an
 * `upgrade` handler) sees Express's prototype already, whose getters
 * (`req.query`, `req.path`) take no assignment.
 *
 * Nest creates the server without those options, so they are set where Node
 * keeps them. A server that is not Node's own as Nest made it (other classes
 * set already, or a Node that keeps them elsewhere) is left as it is: false.
 */
export function useExpressPrototypes(app: NestExpressApplication): boolean {
  const express = app.getHttpAdapter().getInstance() as { request?: unknown; response?: unknown };
  const server = app.getHttpServer() as Server & Record<symbol, unknown>;
  const { request, response } = express;
  if (!isPrototypeAbove(request, IncomingMessage) || !isPrototypeAbove(response, ServerResponse)) return false;
  const symbols = Object.getOwnPropertySymbols(server);
  const requests = symbols.find((s) => s.description === 'IncomingMessage');
  const responses = symbols.find((s) => s.description === 'ServerResponse');
  if (!requests || !responses || server[requests] !== IncomingMessage || server[responses] !== ServerResponse)
    return false;
  server[requests] = madeWith(IncomingMessage, request);
  server[responses] = madeWith(ServerResponse, response);
  return true;
}

/** Whether `prototype` is an object whose chain reaches `type`'s prototype (Express's request is Node's, extended). */
function isPrototypeAbove(prototype: unknown, type: { readonly prototype: object }): prototype is object {
  return (
    typeof prototype === 'object' &&
    prototype !== null &&
    Object.prototype.isPrototypeOf.call(type.prototype, prototype)
  );
}

/**
 * A constructor that builds what `type` builds, its objects of `prototype`. Called with `new` by Node, it returns
 * the object Reflect.construct made (the receiver `new` made is dropped): Node's constructors are plain functions
 * today, but calling one on a receiver would break the day one is a class.
 */
function madeWith(type: new (...args: never[]) => object, prototype: object): new (...args: unknown[]) => object {
  function Made(...args: unknown[]): object {
    return Reflect.construct(type, args, Made) as object;
  }
  Made.prototype = prototype;
  return Made as unknown as new (...args: unknown[]) => object;
}
