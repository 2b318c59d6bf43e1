// ESLint, type-aware (typescript-eslint's recommendedTypeChecked), with
// Prettier owning the layout (eslint-config-prettier turns the layout rules off).
import js from '@eslint/js';
import prettier from 'eslint-config-prettier';
import tseslint from 'typescript-eslint';

export default tseslint.config(
  {
    ignores: [
      'dist/**',
      'coverage/**',
      'node_modules/**',
      'test/bench/peer/**',
      'test/packages/scratch-app/**',
      '**/*.mjs',
      '**/*.js',
    ],
  },
  js.configs.recommended,
  ...tseslint.configs.recommendedTypeChecked,
  {
    languageOptions: {
      parserOptions: { projectService: true, tsconfigRootDir: import.meta.dirname },
    },
    linterOptions: { reportUnusedDisableDirectives: 'error' },
    rules: {
      // A promise nobody awaits is a lost error; `void` says it is meant.
      '@typescript-eslint/no-floating-promises': 'error',
      // Comparing a status with HttpStatus.X is Nest's idiom, not a mix-up of enums.
      '@typescript-eslint/no-unsafe-enum-comparison': 'off',
      // An async method that does not await still answers with a promise, as its interface says.
      '@typescript-eslint/require-await': 'off',
      '@typescript-eslint/no-unused-vars': [
        'error',
        {
          argsIgnorePattern: '^_',
          varsIgnorePattern: '^_',
          caughtErrors: 'none',
          destructuredArrayIgnorePattern: '^_',
        },
      ],
    },
  },
  {
    // Tests read answers (supertest's body, JSON) as `any` on purpose, and hand
    // jest methods around unbound.
    files: ['test/**/*.ts', '**/*.spec.ts', 'libs/*/src/testing/**/*.ts'],
    rules: {
      '@typescript-eslint/no-unsafe-member-access': 'off',
      '@typescript-eslint/no-unsafe-assignment': 'off',
      '@typescript-eslint/no-unsafe-argument': 'off',
      '@typescript-eslint/no-unsafe-call': 'off',
      '@typescript-eslint/no-unsafe-return': 'off',
      '@typescript-eslint/unbound-method': 'off',
      '@typescript-eslint/require-await': 'off',
    },
  },
  prettier,
  {
    // After eslint-config-prettier, which turns max-len off (a "special rule" it leaves to us).
    rules: {
      // Prettier wraps code at 120 columns, but not comments: this holds them (and anything else) to the same width.
      'max-len': [
        'error',
        { code: 120, ignoreStrings: true, ignoreTemplateLiterals: true, ignoreUrls: true, ignoreRegExpLiterals: true },
      ],
    },
  },
);
