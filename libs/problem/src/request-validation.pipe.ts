import { ArgumentMetadata, HttpStatus, Injectable, ValidationError, ValidationPipe } from '@nestjs/common';
import type { MetadataStorage as TransformMetadataStorage } from 'class-transformer/types/MetadataStorage';
import {
  getMetadataStorage,
  IS_ARRAY,
  IS_BOOLEAN,
  IS_DATE,
  IS_ENUM,
  IS_INT,
  IS_NUMBER,
  IS_OBJECT,
  IS_STRING,
  ValidationTypes,
} from 'class-validator';
import { ProblemException } from './problem';
import { ProblemTypes } from './problem-types';

/*
 * class-transformer's registry of @Type() decorators, which names the class of
 * a nested DTO. Not part of its typed entry point; @nestjs/mapped-types reads
 * it from the same path.
 */
const transformMetadata =
  // The CommonJS path class-transformer itself uses, so both share one registry.
  // eslint-disable-next-line @typescript-eslint/no-require-imports
  (require('class-transformer/cjs/storage') as { defaultMetadataStorage: TransformMetadataStorage })
    .defaultMetadataStorage;

export interface FieldError {
  readonly field: string;
  readonly messages: readonly string[];
}

/** An error answer lists at most this many problems; `error_count` says how many there were. */
export const MAX_LISTED_ERRORS = 20;
/** Field names come from the client and may be long: each is cut to this many characters in an answer. */
const MAX_FIELD_CHARS = 100;

function shortField(name: string): string {
  return name.length <= MAX_FIELD_CHARS ? name : `${name.slice(0, MAX_FIELD_CHARS)}…`;
}

/*
 * class-validator's type checks (its decorator/typechecker folder), and the
 * check that a nested DTO is an object. When one fails, the property's other
 * constraints fail only as a consequence: `"amount": "1250"` breaks @Min and
 * @Max too, and "must not be less than 1" misleads about a value that is no
 * number at all.
 */
const TYPE_CHECKS: ReadonlySet<string> = new Set([
  IS_ARRAY,
  IS_BOOLEAN,
  IS_DATE,
  IS_ENUM,
  IS_INT,
  IS_NUMBER,
  IS_OBJECT,
  IS_STRING,
  ValidationTypes.NESTED_VALIDATION,
]);

/** A property's messages: only its type's when the value has the wrong type, else every failed constraint's. */
function constraintMessages(constraints: Readonly<Record<string, string>>): string[] {
  const failed = Object.entries(constraints);
  const typeOnly = failed.filter(([name]) => TYPE_CHECKS.has(name));
  return (typeOnly.length > 0 ? typeOnly : failed).map(([, message]) => message);
}

function flatten(errors: readonly ValidationError[], parent = ''): FieldError[] {
  return errors.flatMap((e) => {
    const field = parent ? `${parent}.${e.property}` : e.property;
    const own = e.constraints ? [{ field, messages: constraintMessages(e.constraints) }] : [];
    return [...own, ...flatten(e.children ?? [], field)];
  });
}

/**
 * The 400 for an invalid request: the first MAX_LISTED_ERRORS problems, and
 * how many there are, so the answer stays small whatever the body held.
 */
export function validationProblem(errors: readonly FieldError[], total = errors.length): ProblemException {
  const listed = errors.slice(0, MAX_LISTED_ERRORS);
  const more = total - listed.length;
  const detail = listed.map((e) => `${e.field}: ${e.messages.join(', ')}`).join('; ');
  return new ProblemException({
    type: ProblemTypes.validationFailed,
    title: 'The request is invalid',
    status: HttpStatus.BAD_REQUEST,
    detail: more > 0 ? `${detail}; and ${more} more` : detail,
    extensions: { errors: listed, error_count: total },
  });
}

type Class = abstract new (...args: never[]) => unknown;

const knownByClass = new WeakMap<Class, ReadonlySet<string> | null>();

/** The properties class-validator knows on `type` (its whitelist), or undefined when `type` is no DTO. */
function knownProperties(type: Class): ReadonlySet<string> | undefined {
  let known = knownByClass.get(type);
  if (known === undefined) {
    // The arguments class-validator's own whitelist uses with our options: no groups, `always` off.
    const metadata = getMetadataStorage().getTargetValidationMetadatas(type, '', false, false);
    known = metadata.length === 0 ? null : new Set(metadata.map((m) => m.propertyName));
    knownByClass.set(type, known);
  }
  return known ?? undefined;
}

/**
 * The DTO class that `@Type()` gives the property `key` of `parent` (the raw
 * object that holds it), or undefined: no @Type, a discriminated union, or a
 * type function that fails without class-transformer's own arguments. Those
 * subtrees are left to class-validator's whitelist.
 */
function nestedType(type: Class, key: string, parent: object): Class | undefined {
  const metadata = transformMetadata.findTypeMetadata(type, key);
  if (!metadata || metadata.options?.discriminator) return undefined;
  try {
    const nested = metadata.typeFunction({
      newObject: {},
      object: parent as Record<string, unknown>,
      property: key,
    }) as Class | undefined;
    return typeof nested === 'function' ? nested : undefined;
  } catch {
    return undefined;
  }
}

const isObject = (v: unknown): v is Record<string, unknown> => typeof v === 'object' && v !== null && !Array.isArray(v);

/**
 * The fields of `raw` (the body as parsed) that its DTO does not declare, at
 * the top and in nested DTOs, the first MAX_LISTED_ERRORS of them and how many
 * there are. It reads only the parsed body and the decorators' metadata, in
 * one pass over the objects that stand where a DTO does: linear in the body,
 * and before class-transformer, whose handling of an object's keys is
 * quadratic in their number.
 *
 * It also sees what class-validator's whitelist cannot: ValidationPipe
 * silently deletes the keys `__proto__` and `constructor` (JSON.parse keeps
 * them as own keys), so a body with such an unknown field would pass as if it
 * did not have it.
 */
function unknownFields(raw: object, type: Class): { listed: FieldError[]; total: number } {
  const listed: FieldError[] = [];
  let total = 0;
  // Breadth first, so the fields listed are the outermost ones, in body order.
  const queue: { raw: Record<string, unknown>; type: Class; path: string }[] = [
    { raw: raw as Record<string, unknown>, type, path: '' },
  ];
  for (let i = 0; i < queue.length; i++) {
    const item = queue[i];
    const known = knownProperties(item.type);
    if (!known) continue;
    for (const key of Object.keys(item.raw)) {
      if (known.has(key)) continue;
      total++;
      if (listed.length < MAX_LISTED_ERRORS) {
        const name = shortField(key);
        // class-validator's own message for a field that is not whitelisted
        listed.push({
          field: item.path ? `${item.path}.${name}` : name,
          messages: [`property ${name} should not exist`],
        });
      }
    }
    for (const key of known) {
      if (!Object.hasOwn(item.raw, key)) continue;
      const value = item.raw[key];
      if (typeof value !== 'object' || value === null) continue;
      const nested = nestedType(item.type, key, item.raw);
      if (!nested) continue;
      const path = item.path ? `${item.path}.${key}` : key;
      if (Array.isArray(value)) {
        value.forEach((v, n) => isObject(v) && queue.push({ raw: v, type: nested, path: `${path}.${n}` }));
      } else {
        queue.push({ raw: value as Record<string, unknown>, type: nested, path });
      }
    }
  }
  return { listed, total };
}

/** The 400 for the fields of `body` that the DTO `type` does not declare, or undefined when there are none. */
export function unknownFieldsProblem(
  body: object,
  type: abstract new (...args: never[]) => unknown,
): ProblemException | undefined {
  const unknown = unknownFields(body, type);
  return unknown.total > 0 ? validationProblem(unknown.listed, unknown.total) : undefined;
}

/**
 * class-validator with our defaults: unknown fields are rejected, payloads are
 * transformed to their DTO class, failures are a problem+json 400 that lists
 * the first fields at fault and counts them all. A body that is not a JSON
 * object is refused before class-validator sees it: arrays and scalars would
 * otherwise slip through. Unknown fields are refused before anything else
 * runs, so a body made of them costs one linear pass.
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
        throw validationProblem([{ field: '(body)', messages: ['must be a JSON object sent as application/json'] }]);
      }
    }
    if (dto && (metadata.type === 'body' || metadata.type === 'query') && typeof value === 'object' && value !== null) {
      // BodyRejectionGuard has already refused a body with unknown fields; this
      // is for query DTOs, and for apps without the guard.
      const problem = unknownFieldsProblem(value, dto);
      if (problem) throw problem;
    }
    return super.transform(value, metadata);
  }
}
