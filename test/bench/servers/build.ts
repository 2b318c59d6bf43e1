import { mkdirSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { dirname, join, relative, resolve } from 'node:path';
import * as ts from 'typescript';
import { REPO_ROOT } from '../processes';

/*
 * The bench's servers as JavaScript, so they run the way production runs
 * (plain node, no compiler in the process): ts-node keeps the TypeScript
 * compiler loaded in every process it runs, some 200 MiB of RSS that a built
 * api does not have, and the peer (plain JavaScript) would not have either.
 *
 * Each file is transpiled on its own (ts.transpileModule: what ts-node's
 * TS_NODE_TRANSPILE_ONLY does, ahead of time) with the root tsconfig's
 * options as CommonJS, into node_modules/.cache/llmwf-bench-js/ (ignored by
 * git; under node_modules so the root's packages resolve from it), mirroring
 * the repository's layout, with a tsconfig.json there whose `paths` point at
 * the JavaScript for tsconfig-paths. No type checking: tsc does that.
 */

export const BUILD_DIR = resolve(REPO_ROOT, 'node_modules/.cache/llmwf-bench-js');
/** Where harnessScript puts the bench's own helper processes (the fake model, the receiver, the senders). */
const HARNESS_DIR = resolve(REPO_ROOT, 'node_modules/.cache/llmwf-bench-harness');
const HARNESS_SOURCES = 'test/bench/e2e-servers';
const SOURCES = ['apps', 'libs', 'test/bench/servers'];

function tsFiles(path: string): string[] {
  const full = resolve(REPO_ROOT, path);
  if (full.endsWith('.ts')) return [full];
  return readdirSync(full, { withFileTypes: true }).flatMap((entry) => {
    const child = join(full, entry.name);
    if (entry.isDirectory()) return entry.name === 'node_modules' ? [] : tsFiles(child);
    return /\.ts$/.test(entry.name) && !/\.(spec|e2e-spec)\.ts$/.test(entry.name) && !entry.name.endsWith('.d.ts')
      ? [child]
      : [];
  });
}

export interface BuiltServers {
  readonly dir: string;
  /** The path of the JavaScript for a .ts file of the repository (relative to its root, or absolute). */
  jsOf(tsPath: string): string;
  /** What node needs to run them: tsconfig-paths, told of the built tsconfig. */
  readonly nodeArgs: readonly string[];
  readonly env: Readonly<Record<string, string>>;
}

/**
 * The JavaScript of one of the bench's helper processes (test/bench/e2e-servers/<name>.ts: the fake
 * model, the webhook receiver, the load senders). They stand for the outside world, and under
 * ts-node each would carry the TypeScript compiler's heap, whose major GCs (15-30 ms, measured) land
 * in the latencies they time. They import only each other and Node's modules, so each is transpiled
 * alone, once per bench process.
 */
export function harnessScript(name: string): string {
  if (!harnessBuilt) {
    rmSync(HARNESS_DIR, { recursive: true, force: true });
    mkdirSync(HARNESS_DIR, { recursive: true });
    const compilerOptions = commonJsOptions();
    for (const file of tsFiles(HARNESS_SOURCES)) {
      const { outputText } = ts.transpileModule(readFileSync(file, 'utf8'), { compilerOptions, fileName: file });
      writeFileSync(
        resolve(HARNESS_DIR, relative(resolve(REPO_ROOT, HARNESS_SOURCES), file).replace(/\.ts$/, '.js')),
        outputText,
      );
    }
    harnessBuilt = true;
  }
  return resolve(HARNESS_DIR, name.replace(/\.ts$/, '.js'));
}
let harnessBuilt = false;

/** The root tsconfig's options, emitting CommonJS without maps or declarations. */
function commonJsOptions(): ts.CompilerOptions {
  const parsed = ts.getParsedCommandLineOfConfigFile(
    resolve(REPO_ROOT, 'tsconfig.json'),
    {},
    {
      ...ts.sys,
      onUnRecoverableConfigFileDiagnostic: (d) => {
        throw new Error(ts.flattenDiagnosticMessageText(d.messageText, '\n'));
      },
    },
  );
  if (!parsed) throw new Error('tsconfig.json could not be read');
  return {
    ...parsed.options,
    module: ts.ModuleKind.CommonJS,
    moduleResolution: undefined,
    resolvePackageJsonExports: undefined,
    sourceMap: false,
    inlineSourceMap: false,
    declaration: false,
    noEmit: false,
  };
}

/** Transpiles apps/, libs/ and the bench's servers afresh into BUILD_DIR. */
export function buildServers(): BuiltServers {
  const compilerOptions = commonJsOptions();
  rmSync(BUILD_DIR, { recursive: true, force: true });
  for (const file of SOURCES.flatMap(tsFiles)) {
    const out = resolve(BUILD_DIR, relative(REPO_ROOT, file)).replace(/\.ts$/, '.js');
    const { outputText } = ts.transpileModule(readFileSync(file, 'utf8'), { compilerOptions, fileName: file });
    mkdirSync(dirname(out), { recursive: true });
    writeFileSync(out, outputText);
  }
  const paths = (compilerOptions.paths ?? {}) as Record<string, string[]>;
  writeFileSync(
    resolve(BUILD_DIR, 'tsconfig.json'),
    JSON.stringify({ compilerOptions: { baseUrl: '.', paths } }, null, 2),
  );
  return {
    dir: BUILD_DIR,
    jsOf: (tsPath) => resolve(BUILD_DIR, relative(REPO_ROOT, resolve(REPO_ROOT, tsPath))).replace(/\.ts$/, '.js'),
    nodeArgs: ['-r', require.resolve('tsconfig-paths/register')],
    env: { TS_NODE_PROJECT: resolve(BUILD_DIR, 'tsconfig.json'), TS_NODE_BASEURL: BUILD_DIR },
  };
}
