import 'reflect-metadata';
import { Type } from 'class-transformer';
import { IsInt, IsString, ValidateNested } from 'class-validator';
import { ProblemException } from './problem';
import { ProblemTypes } from './problem-types';
import { RequestValidationPipe } from './request-validation.pipe';

class LineDto {
  @IsString()
  sku!: string;

  @IsInt()
  quantity!: number;
}

class OrderDto {
  @IsString()
  customer!: string;

  @ValidateNested()
  @Type(() => LineDto)
  first!: LineDto;

  @ValidateNested({ each: true })
  @Type(() => LineDto)
  lines!: LineDto[];
}

const order = () => ({ customer: 'c-1', first: { sku: 'a', quantity: 1 }, lines: [{ sku: 'b', quantity: 2 }] });

/** The body as express.json() hands it over: JSON.parse keeps `__proto__` as an own key. */
const parsed = (json: string): object => JSON.parse(json) as object;

async function problemOf(value: object): Promise<ProblemException> {
  const pipe = new RequestValidationPipe();
  try {
    await pipe.transform(value, { type: 'body', metatype: OrderDto });
  } catch (err) {
    if (err instanceof ProblemException) return err;
    throw err;
  }
  throw new Error('the pipe accepted the body');
}

describe('RequestValidationPipe', () => {
  it.each(['__proto__', 'constructor'])('rejects an unknown top-level field named %s (Nest strips it silently)', async (name) => {
    const body = parsed(JSON.stringify(order()).replace(/^\{/, `{"${name}":{"isAdmin":true},`));
    const problem = await problemOf(body);
    expect(problem.problem.type).toBe(ProblemTypes.validationFailed);
    expect(problem.problem.errors).toEqual([{ field: name, messages: [`property ${name} should not exist`] }]);
  });

  it.each([
    ['in a nested DTO', (name: string) => `{"customer":"c","first":{"sku":"a","quantity":1,"${name}":{}},"lines":[]}`, 'first'],
    [
      'in an array of nested DTOs',
      (name: string) => `{"customer":"c","first":{"sku":"a","quantity":1},"lines":[{"sku":"b","quantity":2,"${name}":{}}]}`,
      'lines.0',
    ],
  ])('rejects an unknown field %s, named by its path', async (_, json, parent) => {
    // The same body without it is valid.
    const valid = await new RequestValidationPipe().transform(parsed(json('extra').replace(',"extra":{}', '')), { type: 'body', metatype: OrderDto });
    expect((valid as OrderDto).first).toBeInstanceOf(LineDto);
    for (const name of ['__proto__', 'constructor']) {
      const problem = await problemOf(parsed(json(name)));
      expect(problem.problem.errors).toEqual([{ field: `${parent}.${name}`, messages: [`property ${name} should not exist`] }]);
    }
  });

  it('lists such a field next to the errors class-validator finds, each field once', async () => {
    const problem = await problemOf(parsed('{"constructor":{},"priority":"high","customer":5,"first":{"sku":"a","quantity":1},"lines":[]}'));
    const fields = (problem.problem.errors as { field: string }[]).map((e) => e.field);
    expect(fields.sort()).toEqual(['constructor', 'customer', 'priority']);
  });
});
