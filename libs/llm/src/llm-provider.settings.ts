import { ConfigFieldError, env } from '@app/config';

export type LlmProvider = 'openai' | 'fake';

/**
 * The model provider's variables, shared by every app that calls it (the
 * worker's summaries, the api's gateway): spread into the app's schema.
 */
export const llmProviderEnv = {
  llmProvider: env.custom(
    'LLM_PROVIDER',
    (raw, all): LlmProvider => {
      const value = raw ?? (all.OPENAI_API_KEY?.trim() ? 'openai' : 'fake');
      if (value !== 'openai' && value !== 'fake') throw new ConfigFieldError(`must be openai or fake, got "${value}"`);
      if (value === 'openai' && !all.OPENAI_API_KEY?.trim())
        throw new ConfigFieldError('is openai but OPENAI_API_KEY is unset');
      return value;
    },
    {
      docDefault: '`openai` if `OPENAI_API_KEY` is set, else `fake`',
      describe:
        "the worker's summaries and the api's gateway use the same provider; " +
        '`fake` is a built-in model that answers offline, streams included',
    },
  ),
  openaiApiKey: env.optionalString('OPENAI_API_KEY'),
  openaiBaseUrl: env.optionalUrl('OPENAI_BASE_URL', ['http:', 'https:'], {
    docDefault: '`https://api.openai.com/v1`',
    describe:
      "any OpenAI-compatible API root, called over node:http (not the `openai` SDK): the SDK's own variables " +
      '(`OPENAI_LOG`, `OPENAI_ORG_ID`, `OPENAI_PROJECT_ID`, `OPENAI_CUSTOM_HEADERS`, …) have no effect, nor does ' +
      '`HTTPS_PROXY`; a redirect is not followed (its error names where it points); no request or answer is logged',
  }),
  openaiModel: env.string('OPENAI_MODEL', 'gpt-4.1-mini', {
    describe: "the worker's model; the gateway sends each request's own `model`",
  }),
};
