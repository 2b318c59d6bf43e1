// npm run pack: builds the libraries other Nest apps install as npm tarballs, under dist/packages/ (PACK_OUT=<dir>
// writes them there instead: the tests pack into a folder of their own):
//   @llm-workflows/nestjs-idempotency  from libs/idempotency (and the files it needs of libs/problem, libs/redis,
//                                      libs/config and libs/persistence's PostgreSQL store)
//   @llm-workflows/client              from libs/client
// Each is its package/tsconfig.json compiled by TypeScript to CommonJS with declarations (CommonJS loads in a Nest 11
// app and, through Node's require(esm), works beside Nest 12's ES modules; an ES module app imports it as well),
// plus its package/package.manifest.json and README.md, then `npm pack`. The monorepo's `@app/...` aliases are
// written as relative paths by the compiler's own transform of import specifiers (each one a `paths` entry of the
// package's tsconfig), so nothing is rewritten as text; the build then refuses a package whose code requires a
// module it does not declare.
import { execFileSync } from 'node:child_process';
import { cpSync, mkdirSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { builtinModules } from 'node:module';
import { dirname, join, relative, resolve, sep } from 'node:path';
import { fileURLToPath } from 'node:url';
import ts from 'typescript';

const root = resolve(dirname(fileURLToPath(import.meta.url)), '..');
const out = process.env.PACK_OUT ? resolve(process.env.PACK_OUT) : join(root, 'dist', 'packages');

const PACKAGES = [
  { dir: 'nestjs-idempotency', source: join(root, 'libs', 'idempotency', 'package') },
  { dir: 'client', source: join(root, 'libs', 'client', 'package') },
];

/** The specifier `spec` as written in `fileName`'s output: `paths` entries become relative paths, the rest stay. */
function specifierFor(spec, fileName, substitutions) {
  const target = substitutions.get(spec);
  if (!target) return spec;
  const path = relative(dirname(fileName), target.replace(/\.ts$/, '')).split(sep).join('/');
  return path.startsWith('.') ? path : `./${path}`;
}

/** A transform (before the module transform and on declarations) that applies specifierFor to every import/export. */
function substituteSpecifiers(substitutions) {
  return (context) => (sourceFile) => {
    const f = context.factory;
    const literal = (node) => {
      if (!node || !ts.isStringLiteral(node)) return undefined;
      const spec = specifierFor(node.text, sourceFile.fileName, substitutions);
      return spec === node.text ? undefined : f.createStringLiteral(spec);
    };
    const visit = (node) => {
      if (ts.isImportDeclaration(node)) {
        const spec = literal(node.moduleSpecifier);
        if (spec) return f.updateImportDeclaration(node, node.modifiers, node.importClause, spec, node.attributes);
      } else if (ts.isExportDeclaration(node)) {
        const spec = literal(node.moduleSpecifier);
        if (spec) {
          return f.updateExportDeclaration(
            node,
            node.modifiers,
            node.isTypeOnly,
            node.exportClause,
            spec,
            node.attributes,
          );
        }
      } else if (ts.isImportTypeNode(node) && ts.isLiteralTypeNode(node.argument)) {
        const spec = literal(node.argument.literal);
        if (spec) {
          return f.updateImportTypeNode(
            node,
            f.updateLiteralTypeNode(node.argument, spec),
            node.attributes,
            node.qualifier,
            node.typeArguments,
            node.isTypeOf,
          );
        }
      }
      return ts.visitEachChild(node, visit, context);
    };
    return ts.visitNode(sourceFile, visit);
  };
}

function compile(tsconfigPath, outDir) {
  const host = { ...ts.sys, onUnRecoverableConfigFileDiagnostic: (d) => fail([d]) };
  const config = ts.getParsedCommandLineOfConfigFile(tsconfigPath, { outDir, noEmit: false, incremental: false }, host);
  if (config.errors.length) fail(config.errors);
  const base = dirname(tsconfigPath);
  const substitutions = new Map(
    Object.entries(config.options.paths ?? {}).map(([spec, [target]]) => [spec, resolve(base, target)]),
  );
  const program = ts.createProgram({ rootNames: config.fileNames, options: config.options });
  const diagnostics = ts.getPreEmitDiagnostics(program);
  if (diagnostics.length) fail(diagnostics);
  const transform = substituteSpecifiers(substitutions);
  const result = program.emit(undefined, undefined, undefined, false, {
    before: [transform],
    afterDeclarations: [transform],
  });
  if (result.diagnostics.length) fail(result.diagnostics);
}

function fail(diagnostics) {
  const format = ts.formatDiagnosticsWithColorAndContext(diagnostics, {
    getCanonicalFileName: (f) => f,
    getCurrentDirectory: () => root,
    getNewLine: () => '\n',
  });
  console.error(format);
  process.exit(1);
}

function filesUnder(dir) {
  return readdirSync(dir, { recursive: true, withFileTypes: true })
    .filter((e) => e.isFile())
    .map((e) => join(e.parentPath, e.name));
}

/** The package a bare specifier names (`@scope/name/sub` → `@scope/name`), or undefined for a relative or node: one. */
function packageOf(spec) {
  if (spec.startsWith('.') || spec.startsWith('node:') || builtinModules.includes(spec.split('/')[0])) return undefined;
  const parts = spec.split('/');
  return spec.startsWith('@') ? parts.slice(0, 2).join('/') : parts[0];
}

/** Every module the built code requires or its declarations import must be the package's own or declared by it. */
function checkImports(packageDir, manifest) {
  const declared = new Set([
    ...Object.keys(manifest.dependencies ?? {}),
    ...Object.keys(manifest.peerDependencies ?? {}),
  ]);
  const problems = [];
  for (const file of filesUnder(join(packageDir, 'lib'))) {
    const text = readFileSync(file, 'utf8');
    const specs = file.endsWith('.d.ts')
      ? [...text.matchAll(/(?:\bfrom\s+|\bimport\s*\(\s*|^import\s+)(["'])([^"'\n]+)\1/gm)].map((m) => m[2])
      : [...text.matchAll(/\brequire\(\s*(["'])([^"'\n]+)\1\s*\)/g)].map((m) => m[2]);
    for (const spec of specs) {
      const pkg = packageOf(spec);
      // Type-only imports of what an app of Express has anyway (@types/express, @types/node) are not dependencies.
      const typesOnly = file.endsWith('.d.ts') && ['express', 'jest'].includes(pkg);
      if (pkg !== undefined && !declared.has(pkg) && !typesOnly) {
        problems.push(`${relative(packageDir, file)}: ${spec}`);
      }
    }
  }
  if (problems.length) {
    console.error(`${manifest.name} imports what it does not declare:\n  ${problems.join('\n  ')}`);
    process.exit(1);
  }
}

mkdirSync(out, { recursive: true });
const license = JSON.parse(readFileSync(join(root, 'package.json'), 'utf8')).license;
for (const { dir, source } of PACKAGES) {
  const packageDir = join(out, dir);
  rmSync(packageDir, { recursive: true, force: true });
  const manifest = { ...JSON.parse(readFileSync(join(source, 'package.manifest.json'), 'utf8')), license };
  compile(join(source, 'tsconfig.json'), join(packageDir, 'lib'));
  checkImports(packageDir, manifest);
  writeFileSync(join(packageDir, 'package.json'), `${JSON.stringify(manifest, null, 2)}\n`);
  cpSync(join(source, 'README.md'), join(packageDir, 'README.md'));
  const [packed] = JSON.parse(
    execFileSync('npm', ['pack', '--json', '--pack-destination', out], { cwd: packageDir, encoding: 'utf8' }),
  );
  console.log(`${relative(root, join(out, packed.filename))}  ${packed.entryCount} files, ${packed.size} bytes`);
}
