import { ApiResponse } from '@nestjs/swagger';

type Headers = Record<string, { description: string; schema: { type: 'integer' | 'string' } }>;

/** RFC 9457 problem details, as every error answer of our apps is shaped. */
const PROBLEM_SCHEMA = {
  type: 'object' as const,
  required: ['type', 'title', 'status'],
  properties: {
    type: { type: 'string' as const, description: 'Stable per case: urn:llm-workflows:problem:…' },
    title: { type: 'string' as const },
    status: { type: 'integer' as const },
    detail: { type: 'string' as const },
    errors: {
      type: 'array' as const,
      description: 'On validation-failed: each field and what is wrong with it',
      items: {
        type: 'object' as const,
        properties: {
          field: { type: 'string' as const },
          messages: { type: 'array' as const, items: { type: 'string' as const } },
        },
      },
    },
  },
};

/** An error answer in the OpenAPI document: `application/problem+json` with `description`. */
export function ApiProblemResponse(
  status: number,
  description: string,
  headers?: Headers,
): MethodDecorator & ClassDecorator {
  return ApiResponse({
    status,
    description,
    headers,
    content: { 'application/problem+json': { schema: PROBLEM_SCHEMA } },
  });
}
