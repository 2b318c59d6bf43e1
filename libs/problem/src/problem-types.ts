/**
 * Stable problem types for failures that are not specific to one library.
 * URNs: stable identifiers that need no web page to stay valid.
 */
export const PROBLEM_TYPE_PREFIX = 'urn:llm-workflows:problem:';

export const ProblemTypes = {
  validationFailed: `${PROBLEM_TYPE_PREFIX}validation-failed`,
  malformedJson: `${PROBLEM_TYPE_PREFIX}malformed-json`,
  jsonTooDeep: `${PROBLEM_TYPE_PREFIX}json-too-deep`,
  jsonTooManyMembers: `${PROBLEM_TYPE_PREFIX}json-too-many-members`,
  jsonTooManyValues: `${PROBLEM_TYPE_PREFIX}json-too-many-values`,
  jsonDuplicateName: `${PROBLEM_TYPE_PREFIX}json-duplicate-name`,
  payloadTooLarge: `${PROBLEM_TYPE_PREFIX}payload-too-large`,
  unsupportedMediaType: `${PROBLEM_TYPE_PREFIX}unsupported-media-type`,
  unauthorized: `${PROBLEM_TYPE_PREFIX}unauthorized`,
  forbidden: `${PROBLEM_TYPE_PREFIX}forbidden`,
  notFound: `${PROBLEM_TYPE_PREFIX}not-found`,
  methodNotAllowed: `${PROBLEM_TYPE_PREFIX}method-not-allowed`,
  serviceUnavailable: `${PROBLEM_TYPE_PREFIX}service-unavailable`,
  internal: `${PROBLEM_TYPE_PREFIX}internal-error`,
  /** An HttpException without a more specific type: `http-<status>`. */
  http: (status: number) => `${PROBLEM_TYPE_PREFIX}http-${status}`,
} as const;
