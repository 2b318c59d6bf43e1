import { ArgumentMetadata, HttpStatus, Injectable, ValidationError, ValidationPipe } from '@nestjs/common';
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
    if (metadata.type === 'body' && metadata.metatype && this.toValidate(metadata)) {
      if (typeof value !== 'object' || value === null || Array.isArray(value)) {
        throw validationProblem([
          { field: '(body)', messages: ['must be a JSON object sent as application/json'] },
        ]);
      }
    }
    return super.transform(value, metadata);
  }
}
