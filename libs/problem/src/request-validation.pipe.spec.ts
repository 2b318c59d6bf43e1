import 'reflect-metadata';
import { Type } from 'class-transformer';
import { IsInt, IsString, Length, Max, Min, ValidateNested } from 'class-validator';
import { ProblemException } from './problem';
import { ProblemTypes } from './problem-types';
import { MAX_LISTED_ERRORS, RequestValidationPipe } from './request-validation.pipe';

class LineDto {
  @IsString()
  sku!: string;

  @IsInt()
  @Min(1)
  @Max(100)
  quantity!: number;
}

class OrderDto {
  @IsString()
  @Length(1, 8)
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
  it.each(['__proto__', 'constructor'])(
    'rejects an unknown top-level field named %s (Nest strips it silently)',
    async (name) => {
      const body = parsed(JSON.stringify(order()).replace(/^\{/, `{"${name}":{"isAdmin":true},`));
      const problem = await problemOf(body);
      expect(problem.problem.type).toBe(ProblemTypes.validationFailed);
      expect(problem.problem.errors).toEqual([{ field: name, messages: [`property ${name} should not exist`] }]);
    },
  );

  it.each([
    [
      'in a nested DTO',
      (name: string) => `{"customer":"c","first":{"sku":"a","quantity":1,"${name}":{}},"lines":[]}`,
      'first',
    ],
    [
      'in an array of nested DTOs',
      (name: string) =>
        `{"customer":"c","first":{"sku":"a","quantity":1},"lines":[{"sku":"b","quantity":2,"${name}":{}}]}`,
      'lines.0',
    ],
  ])('rejects an unknown field %s, named by its path', async (_, json, parent) => {
    // The same body without it is valid.
    const valid = await new RequestValidationPipe().transform(parsed(json('extra').replace(',"extra":{}', '')), {
      type: 'body',
      metatype: OrderDto,
    });
    expect((valid as OrderDto).first).toBeInstanceOf(LineDto);
    for (const name of ['__proto__', 'constructor']) {
      const problem = await problemOf(parsed(json(name)));
      expect(problem.problem.errors).toEqual([
        { field: `${parent}.${name}`, messages: [`property ${name} should not exist`] },
      ]);
    }
  });

  it('refuses unknown fields before class-validator runs: only they are listed', async () => {
    // `customer` is invalid too, but a body with unknown fields gets no further than them.
    const problem = await problemOf(
      parsed('{"constructor":{},"priority":"high","customer":5,"first":{"sku":"a","quantity":1},"lines":[]}'),
    );
    const fields = (problem.problem.errors as { field: string }[]).map((e) => e.field);
    expect(fields.sort()).toEqual(['constructor', 'priority']);
    expect(problem.problem.error_count).toBe(2);
  });

  it("lists class-validator's errors once the fields are all known", async () => {
    const problem = await problemOf(parsed('{"customer":5,"first":{"sku":"a","quantity":"1"},"lines":[]}'));
    expect((problem.problem.errors as { field: string }[]).map((e) => e.field).sort()).toEqual([
      'customer',
      'first.quantity',
    ]);
  });

  it.each([
    [
      'a number as a string',
      '{"customer":"c","first":{"sku":"a","quantity":"1250"},"lines":[]}',
      'first.quantity',
      ['quantity must be an integer number'],
    ],
    [
      'a string as a number',
      '{"customer":5,"first":{"sku":"a","quantity":1},"lines":[]}',
      'customer',
      ['customer must be a string'],
    ],
    ['a missing value', '{"first":{"sku":"a","quantity":1},"lines":[]}', 'customer', ['customer must be a string']],
    [
      'a nested DTO as a string',
      '{"customer":"c","first":"a","lines":[]}',
      'first',
      ['nested property first must be either object or array'],
    ],
  ])(
    'names a type error as one (%s): only the type check, not the range or length checks it fails too',
    async (_, json, field, messages) => {
      const problem = await problemOf(parsed(json));
      expect(problem.problem.errors).toEqual([{ field, messages }]);
      expect(problem.problem.detail).toBe(`${field}: ${messages.join(', ')}`);
    },
  );

  it('lists every failed constraint of a value of the right type', async () => {
    const problem = await problemOf(parsed('{"customer":"far too long","first":{"sku":"a","quantity":0},"lines":[]}'));
    expect(problem.problem.errors).toEqual([
      { field: 'customer', messages: ['customer must be shorter than or equal to 8 characters'] },
      { field: 'first.quantity', messages: ['quantity must not be less than 1'] },
    ]);
  });

  it(`lists the first ${MAX_LISTED_ERRORS} problems, outermost first, and counts them all`, async () => {
    const extra = Array.from({ length: 30 }, (_, i) => `"x${i}":0`).join(',');
    const problem = await problemOf(
      parsed(`{"customer":"c","first":{"sku":"a","quantity":1,"deep":0},"lines":[],${extra}}`),
    );
    const errors = problem.problem.errors as { field: string }[];
    expect(errors).toHaveLength(MAX_LISTED_ERRORS);
    expect(errors.map((e) => e.field)).toEqual(Array.from({ length: MAX_LISTED_ERRORS }, (_, i) => `x${i}`));
    expect(problem.problem.error_count).toBe(31);
    expect(problem.problem.detail).toMatch(/; and 11 more$/);
  });

  it('cuts a long field name short in the answer', async () => {
    const name = 'n'.repeat(100_000);
    const problem = await problemOf(parsed(`{"customer":"c","first":{"sku":"a","quantity":1},"lines":[],"${name}":0}`));
    const [error] = problem.problem.errors as { field: string; messages: string[] }[];
    expect(error.field).toBe(`${'n'.repeat(100)}…`);
    expect(JSON.stringify(problem.problem).length).toBeLessThan(1000);
  });

  it('caps the errors class-validator finds too', async () => {
    const lines = Array.from({ length: 40 }, () => '{"sku":1,"quantity":1}').join(',');
    const problem = await problemOf(parsed(`{"customer":"c","first":{"sku":"a","quantity":1},"lines":[${lines}]}`));
    expect(problem.problem.errors).toHaveLength(MAX_LISTED_ERRORS);
    expect(problem.problem.error_count).toBe(40);
  });
});
