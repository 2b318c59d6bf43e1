import { HttpStatus } from '@nestjs/common';
import type { NextFunction, Request, Response } from 'express';
import { PROBLEM_CONTENT_TYPE, ProblemDocument } from './problem';
import { ProblemTypes } from './problem-types';

/** How deeply `value` nests objects and arrays (a scalar is 0, `{}` is 1), counted only up to `limit + 1`. */
export function jsonDepthExceeds(value: unknown, limit: number): boolean {
  // Iterative: the point is to survive bodies deep enough to overflow a recursive walk.
  const stack: [unknown, number][] = [[value, 0]];
  while (stack.length > 0) {
    const [v, depth] = stack.pop()!;
    if (typeof v !== 'object' || v === null) continue;
    if (depth + 1 > limit) return true;
    for (const child of Array.isArray(v) ? v : Object.values(v)) {
      if (typeof child === 'object' && child !== null) stack.push([child, depth + 1]);
    }
  }
  return false;
}

/**
 * Express middleware, mounted right after the JSON body parser: a body that
 * nests objects and arrays more than `maxDepth` levels is a 400 before
 * anything else sees it. Deep nesting is cheap to send (8 KB of brackets is
 * 2,000 levels) and recursive code downstream (class-transformer in the
 * validation pipe) overflows the stack on it, which would be a 500.
 */
export function jsonDepthLimit(maxDepth: number) {
  if (!Number.isSafeInteger(maxDepth) || maxDepth < 1) throw new Error(`jsonDepthLimit: maxDepth must be a positive integer, got ${maxDepth}`);
  return (req: Request, res: Response, next: NextFunction): void => {
    if (!jsonDepthExceeds(req.body, maxDepth)) return next();
    const problem: ProblemDocument = {
      type: ProblemTypes.jsonTooDeep,
      title: 'The request body is nested too deeply',
      status: HttpStatus.BAD_REQUEST,
      detail: `Objects and arrays in the body must not nest more than ${maxDepth} levels.`,
    };
    res.status(problem.status).type(PROBLEM_CONTENT_TYPE).send(JSON.stringify(problem));
  };
}
