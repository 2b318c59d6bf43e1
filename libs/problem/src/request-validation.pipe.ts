import { ArgumentMetadata, HttpStatus, Injectable, ValidationError, ValidationPipe } from '@nestjs/common';
import { getMetadataStorage } from 'class-validator';
import { ProblemException } from './problem';
import { ProblemTypes } from './problem-types';

export interface FieldError {
  readonly field: string;
  readonly messages: readonly string[];
}

function flatten(errors: readonly ValidationError[], parent = ''): FieldError[] {
  return errors.flatMap((e) => {
    const field = parent ? `${parent}.${e.property}` : e.property;
    const own = e.constraints ? [{ field, messages: Object.values(e.constraints) }] : [];
    return [...own, ...flatten(e.children ?? [], field)];
  });
}

export function validationProblem(errors: readonly FieldError[]): ProblemException {
  return new ProblemException({
    type: ProblemTypes.validationFailed,
    title: 'The request is invalid',
    status: HttpStatus.BAD_REQUEST,
    detail: errors.map((e) => `${e.field}: ${e.messages.join(', ')}`).join('; '),
    extensions: { errors },
  });
}

type Class = abstract new (...args: never[]) => unknown;

/** The properties class-validator knows on `type` (its whitelist), or undefined when `type` is no DTO. */
function knownProperties(type: Class): ReadonlySet<string> | undefined {
  // The arguments class-validator's own whitelist uses with our options: no groups, `always` off.
  const metadata = getMetadataStorage().getTargetValidationMetadatas(type as unknown as new () => object, '', false, false);
  return metadata.length === 0 ? undefined : new Set(metadata.map((m) => m.propertyName));
}

function unknownField(field: string, property: string): FieldError {
  // class-validator's own message for a field that is not whitelisted
  return { field, messages: [`property ${property} should not exist`] };
}

/**
 * The own keys of every object in `value`, taken before ValidationPipe
 * deletes the keys `__proto__` and `constructor` from it in place.
 */
function ownKeysOfEach(value: object): Map<object, readonly string[]> {
  const keys = new Map<object, readonly string[]>();
  const pending: object[] = [value];
  while (pending.length > 0) {
    const v = pending.pop()!;
    if (keys.has(v)) continue;
    keys.set(v, Object.keys(v));
    for (const child of Array.isArray(v) ? v : Object.values(v)) {
      if (typeof child === 'object' && child !== null) pending.push(child);
    }
  }
  return keys;
}

/**
 * The fields of `raw` (the body as parsed) that its DTO does not declare,
 * at the top and in nested DTOs (found through the transformed `instance`,
 * whose nested values are instances of their DTO classes).
 *
 * class-validator's whitelist cannot see them all: ValidationPipe silently
 * deletes the keys `__proto__` and `constructor` (and class-transformer would
 * skip them), so a body with such an unknown field would pass as if it did
 * not have it. `ownKeys` holds the keys the body really had.
 */
function unknownFields(raw: object, type: Class, ownKeys: Map<object, readonly string[]>, instance?: object): FieldError[] {
  const errors: FieldError[] = [];
  // Iterative: nested DTOs can be recursive types (a tree), nested as deep as the body.
  const pending: { raw: object; type: Class; instance: object | undefined; path: string }[] = [{ raw, type, instance, path: '' }];
  while (pending.length > 0) {
    const item = pending.pop()!;
    const known = knownProperties(item.type);
    if (!known) continue;
    for (const key of ownKeys.get(item.raw) ?? Object.keys(item.raw)) {
      if (!known.has(key)) errors.push(unknownField(item.path ? `${item.path}.${key}` : key, key));
    }
    if (!item.instance) continue;
    for (const key of known) {
      const rawValue = (item.raw as Record<string, unknown>)[key];
      const value = (item.instance as Record<string, unknown>)[key];
      const path = item.path ? `${item.path}.${key}` : key;
      const pairs: [unknown, unknown, string][] = Array.isArray(value) && Array.isArray(rawValue)
        ? value.map((v, i) => [rawValue[i], v, `${path}.${i}`])
        : [[rawValue, value, path]];
      for (const [r, v, p] of pairs) {
        if (typeof r === 'object' && r !== null && typeof v === 'object' && v !== null && !Array.isArray(v)) {
          pending.push({ raw: r, type: v.constructor as Class, instance: v, path: p });
        }
      }
    }
  }
  return errors;
}

/**
 * class-validator with our defaults: unknown fields are rejected, payloads are
 * transformed to their DTO class, failures are a problem+json 400 that lists
 * every field. A body that is not a JSON object is refused before
 * class-validator sees it: arrays and scalars would otherwise slip through.
 */
@Injectable()
export class RequestValidationPipe extends ValidationPipe {
  constructor() {
    super({
      whitelist: true,
      forbidNonWhitelisted: true,
      transform: true,
      stopAtFirstError: false,
      validationError: { target: false, value: false },
      exceptionFactory: (errors) => validationProblem(flatten(errors)),
    });
  }

  override async transform(value: unknown, metadata: ArgumentMetadata): Promise<unknown> {
    const dto = metadata.metatype && this.toValidate(metadata) ? (metadata.metatype as Class) : undefined;
    if (metadata.type === 'body' && dto) {
      if (typeof value !== 'object' || value === null || Array.isArray(value)) {
        throw validationProblem([
          { field: '(body)', messages: ['must be a JSON object sent as application/json'] },
        ]);
      }
    }
    if (!dto || (metadata.type !== 'body' && metadata.type !== 'query') || typeof value !== 'object' || value === null) {
      return super.transform(value, metadata);
    }
    // Unknown top-level fields join class-validator's own list when it fails
    // (without duplicates); nested ones are checked once the instance exists.
    const ownKeys = ownKeysOfEach(value);
    const topLevel = unknownFields(value, dto, ownKeys);
    let result: unknown;
    try {
      result = await super.transform(value, metadata);
    } catch (err) {
      const listed = err instanceof ProblemException ? (err.problem.errors as FieldError[] | undefined) : undefined;
      if (!listed || topLevel.length === 0) throw err;
      const missing = topLevel.filter((u) => !listed.some((e) => e.field === u.field));
      throw missing.length === 0 ? err : validationProblem([...listed, ...missing]);
    }
    const unknown = typeof result === 'object' && result !== null ? unknownFields(value, dto, ownKeys, result) : topLevel;
    if (unknown.length > 0) throw validationProblem(unknown);
    return result;
  }
}
