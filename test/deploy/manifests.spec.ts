import { execFileSync } from 'node:child_process';
import { existsSync, readdirSync, readFileSync, statSync } from 'node:fs';
import { dirname, join, relative, resolve } from 'node:path';
import { parseAllDocuments } from 'yaml';
import { configReferenceVariables } from '@app/config';
import { GATEWAY_MODE_UNUSED_VARIABLES } from '@app/llm';
import { apiDrainMs, apiEnvSchema, loadApiConfig } from '../../apps/api/src/api.config';
import { loadRelayConfig, relayEnvSchema } from '../../apps/relay/src/relay.config';
import { loadWorkerConfig, workerEnvSchema } from '../../apps/worker/src/worker.config';

/*
 * The Kubernetes manifests (deploy/k8s) checked against the apps themselves:
 * their config schemas, the ports they listen on, their drain times and
 * INTERFACE.md. No cluster: each kustomization is rendered by `kubectl
 * kustomize`, as an operator builds it, so the test checks what kubectl would
 * apply. Without kubectl, or with a kustomize older than 5 (kubectl 1.32 ships
 * kustomize 5), the test fails and says so; it never skips.
 *
 * Every check collects all its problems, each naming the rendering, the
 * manifest and its file, the app and the variable, and compares the list to
 * [], so one run shows everything that is wrong.
 */

const REPO_ROOT = resolve(__dirname, '../..');
const K8S_DIR = join(REPO_ROOT, 'deploy/k8s');
/**
 * Outside the repository and read-only to us: the team's public interface,
 * present on a developer's machine, absent in a fresh clone.
 */
const INTERFACE_PATH = resolve(REPO_ROOT, '../shared/INTERFACE.md');
/**
 * INTERFACE.md lets the project add to the interface; the additions (and every
 * variable INTERFACE.md names) are the configuration reference: the apps'
 * schemas, which render the Configuration table of the operators' page,
 * docs/operations.md (scripts/config-reference.mjs; test/docs/config-reference.spec.ts
 * checks the committed table against them).
 */
const CONFIGURATION_DOC = 'the configuration reference';
/** The kustomizations an operator applies or builds on; each is rendered and checked whole. */
const RENDERINGS = ['base', 'overlays/example'] as const;

type App = 'api' | 'worker' | 'relay';
const APPS: readonly App[] = ['api', 'worker', 'relay'];
const COMPONENT_LABEL = 'app.kubernetes.io/component';
const LIVE_PATH = '/health/live';
const READY_PATH = '/health/ready';
const MIGRATE_COMMAND = ['node', 'dist/apps/admin/main.js', 'migrate'];
const appCommand = (app: App): string[] => ['node', `dist/apps/${app}/main.js`];

/**
 * The Secret every environment provides, and every key it may hold, with a
 * value the apps accept. The base references the Secret without shipping it;
 * the example overlay ships a placeholder one, which must have exactly these
 * keys. The values stand in for the secret when the base is checked.
 */
const SECRET_NAME = 'llm-workflows-secrets';
const SECRET_PLACEHOLDERS: Readonly<Record<string, string>> = {
  REDIS_URL: 'redis://:placeholder@redis:6379/0',
  DATABASE_URL: 'postgres://llmwf:placeholder@postgres:5432/llmwf',
  API_KEYS: 'tenant-a:placeholder-key-0123456789',
  ADMIN_API_KEY: 'admin-placeholder-key-0123456789',
  OPENAI_API_KEY: 'sk-placeholder',
  INTERNAL_API_KEY: 'internal-placeholder-0123456789',
  NOTIFY_WEBHOOK_URL: 'https://notify.invalid/hook',
  // KEDA's scaler of the example overlay reads Redis with these (no app does).
  REDIS_ADDRESS: 'redis:6379',
  REDIS_PASSWORD: 'placeholder',
};
/** Every value of the example Secret must contain this, so a real credential cannot slip in. */
const EXAMPLE_SECRET_MARKER = 'CHANGE-ME';

/**
 * INTERFACE.md's environment table, per app, for when ../shared is absent (a
 * fresh clone in CI). When the file is present it is parsed instead, and a
 * separate test fails if this copy has drifted from it.
 */
const INTERFACE_ENV_FALLBACK: Readonly<Record<App, readonly string[]>> = {
  api: [
    'REDIS_URL',
    'DATABASE_URL',
    'LOG_LEVEL',
    'PORT',
    'API_KEYS',
    'IDEMPOTENCY_LOCK_TTL_S',
    'IDEMPOTENCY_RESULT_TTL_S',
  ],
  worker: [
    'REDIS_URL',
    'DATABASE_URL',
    'LOG_LEVEL',
    'HEALTH_PORT',
    'WORKER_CONCURRENCY',
    'CLAIM_IDLE_MS',
    'MAX_DELIVERIES',
    'JOB_BUDGET_S',
    'LLM_PROVIDER',
    'OPENAI_API_KEY',
    'OPENAI_BASE_URL',
    'OPENAI_MODEL',
    'LLM_CALL_TIMEOUT_S',
    'LLM_MAX_ATTEMPTS',
  ],
  relay: [
    'DATABASE_URL',
    'LOG_LEVEL',
    'HEALTH_PORT',
    'NOTIFY_WEBHOOK_URL',
    'NOTIFY_TIMEOUT_S',
    'OUTBOX_BATCH',
    'OUTBOX_MAX_ATTEMPTS',
    'OUTBOX_POLL_MS',
  ],
};

// ---------------------------------------------------------------------------
// The apps: their variables, and what their real configuration says.
// ---------------------------------------------------------------------------

type Env = Record<string, string | undefined>;

interface AppSettings {
  /** The port serving /health and /metrics (and the api's routes). */
  readonly port: number;
  /** The longest SIGTERM-to-exit, in seconds. */
  readonly drainSeconds: number;
  readonly drainWhy: string;
}

interface AppSpec {
  readonly schemaName: string;
  readonly variables: ReadonlySet<string>;
  readonly portVariable: string;
  /** Loads the app's own configuration from the manifests' values; throws naming each bad variable. */
  settings(env: Env): AppSettings;
}

function schemaVariables(schema: Readonly<Record<string, unknown>>, name: string): ReadonlySet<string> {
  const vars = new Set<string>();
  for (const [key, field] of Object.entries(schema)) {
    const variable = isRecord(field) ? field.variable : undefined;
    if (typeof variable !== 'string') throw new Error(`${name}.${key} has no string .variable`);
    vars.add(variable);
  }
  return vars;
}

/** The relay drains the sends in flight (NOTIFY_TIMEOUT_S each), then records them and closes its connections. */
const RELAY_DRAIN_MARGIN_S = 5;

const APP_SPECS: Readonly<Record<App, AppSpec>> = {
  api: {
    schemaName: 'apiEnvSchema',
    variables: schemaVariables(apiEnvSchema, 'apiEnvSchema'),
    portVariable: 'PORT',
    settings: (env) => {
      const c = loadApiConfig(env);
      return {
        port: c.port,
        drainSeconds: apiDrainMs(c) / 1000,
        drainWhy:
          "the gateway's drain (HTTP_REQUEST_TIMEOUT_S + 2 s), then HTTP_REQUEST_TIMEOUT_S + the longest handler (a refund: 3 x PAYMENTS_TIMEOUT_S + PostgreSQL's query timeout)",
      };
    },
  },
  worker: {
    schemaName: 'workerEnvSchema',
    variables: schemaVariables(workerEnvSchema, 'workerEnvSchema'),
    portVariable: 'HEALTH_PORT',
    settings: (env) => {
      const c = loadWorkerConfig(env);
      return { port: c.healthPort, drainSeconds: c.jobBudgetMs / 1000 + 1, drainWhy: 'JOB_BUDGET_S + 1 s' };
    },
  },
  relay: {
    schemaName: 'relayEnvSchema',
    variables: schemaVariables(relayEnvSchema, 'relayEnvSchema'),
    portVariable: 'HEALTH_PORT',
    settings: (env) => {
      const c = loadRelayConfig(env);
      return {
        port: c.healthPort,
        drainSeconds: c.notifyTimeoutMs / 1000 + RELAY_DRAIN_MARGIN_S,
        drainWhy: `NOTIFY_TIMEOUT_S + ${RELAY_DRAIN_MARGIN_S} s`,
      };
    },
  },
};

// ---------------------------------------------------------------------------
// INTERFACE.md
// ---------------------------------------------------------------------------

/**
 * The variable table under `heading` (INTERFACE.md's `## Environment`):
 * variable names per app (`all` means every app).
 * The first two columns are the variables and the apps; the rest is ignored.
 */
function parseEnvTable(markdown: string, heading: string, file: string): Record<App, string[]> {
  const section = new RegExp(`^## ${heading}\\s*$([\\s\\S]*?)(?=^## |(?![\\s\\S]))`, 'm').exec(markdown)?.[1];
  if (!section) throw new Error(`${file}: no "## ${heading}" section`);
  const out: Record<App, string[]> = { api: [], worker: [], relay: [] };
  const rows = section.split('\n').filter((l) => l.trim().startsWith('|'));
  for (const row of rows.slice(2)) {
    const [names = '', apps = ''] = row
      .split('|')
      .slice(1)
      .map((c) => c.trim());
    const variables = [...names.matchAll(/`([A-Z][A-Z0-9_]*)`/g)].map((m) => m[1]);
    if (variables.length === 0) throw new Error(`${file}: no variable name in the row "${row}"`);
    // A note in parentheses ("(the relay uses no Redis)") is for readers; the admin CLI runs in a
    // deployed app's image (kubectl exec), so it has no manifest of its own.
    const listed = apps.replace(/\([^)]*\)/g, '').trim();
    const targets =
      listed === 'all'
        ? APPS
        : listed
            .split(',')
            .map((a) => a.trim())
            .filter((a) => a !== 'admin');
    for (const target of targets) {
      if (!(APPS as readonly string[]).includes(target)) {
        throw new Error(`${file}: the row for ${variables.join(', ')} names an unknown app "${target}"`);
      }
      out[target as App].push(...variables);
    }
  }
  return out;
}

const parseInterfaceEnv = (markdown: string) => parseEnvTable(markdown, 'Environment', INTERFACE_PATH);

const interfaceSource = existsSync(INTERFACE_PATH)
  ? { from: INTERFACE_PATH, env: parseInterfaceEnv(readFileSync(INTERFACE_PATH, 'utf8')) }
  : { from: 'INTERFACE_ENV_FALLBACK in this test (../shared/INTERFACE.md is absent)', env: INTERFACE_ENV_FALLBACK };

/**
 * The configuration reference, per app: the rows docs/operations.md's
 * Configuration table renders from the schemas (INTERFACE.md's variables and
 * the project's additions), read from the schemas rather than the prose.
 */
const docsEnv: Record<App, string[]> = (() => {
  const byApp = configReferenceVariables([
    { app: 'api', schema: apiEnvSchema },
    { app: 'worker', schema: workerEnvSchema },
    { app: 'relay', schema: relayEnvSchema },
  ]);
  return { api: byApp.api, worker: byApp.worker, relay: byApp.relay };
})();

// ---------------------------------------------------------------------------
// Manifests: the shapes read here.
// ---------------------------------------------------------------------------

type Labels = Readonly<Record<string, string>>;

interface Manifest {
  readonly apiVersion: string;
  readonly kind: string;
  readonly metadata: { readonly name: string; readonly labels?: Labels; readonly annotations?: Labels };
  readonly spec?: unknown;
  readonly data?: Readonly<Record<string, string>>;
  readonly stringData?: Readonly<Record<string, string>>;
  /** Where it came from, relative to deploy/k8s, with the patches applied to it. */
  readonly source: string;
}

interface HttpGet {
  readonly path?: string;
  readonly port?: number | string;
  readonly scheme?: string;
}
interface Probe {
  readonly httpGet?: HttpGet;
}
interface EnvVar {
  readonly name: string;
  readonly value?: string;
  readonly valueFrom?: {
    readonly configMapKeyRef?: { readonly name: string; readonly key: string; readonly optional?: boolean };
    readonly secretKeyRef?: { readonly name: string; readonly key: string; readonly optional?: boolean };
  };
}
interface EnvFrom {
  readonly prefix?: string;
  readonly configMapRef?: { readonly name: string; readonly optional?: boolean };
  readonly secretRef?: { readonly name: string; readonly optional?: boolean };
}
interface SecurityContext {
  readonly runAsNonRoot?: boolean;
  readonly runAsUser?: number;
  readonly allowPrivilegeEscalation?: boolean;
  readonly readOnlyRootFilesystem?: boolean;
  readonly privileged?: boolean;
  readonly capabilities?: { readonly drop?: readonly string[]; readonly add?: readonly string[] };
  readonly seccompProfile?: { readonly type?: string };
}
type Quantities = Readonly<Record<string, string | number>>;
interface Container {
  readonly name: string;
  readonly image?: string;
  readonly command?: readonly string[];
  readonly args?: readonly string[];
  readonly ports?: readonly { readonly name?: string; readonly containerPort: number }[];
  readonly env?: readonly EnvVar[];
  readonly envFrom?: readonly EnvFrom[];
  readonly startupProbe?: Probe;
  readonly livenessProbe?: Probe;
  readonly readinessProbe?: Probe;
  readonly lifecycle?: {
    readonly preStop?: {
      readonly exec?: { readonly command?: readonly string[] };
      readonly sleep?: { readonly seconds: number };
    };
  };
  readonly resources?: { readonly requests?: Quantities; readonly limits?: Quantities };
  readonly securityContext?: SecurityContext;
}
interface PodTemplate {
  readonly metadata?: { readonly labels?: Labels; readonly annotations?: Labels };
  readonly spec: {
    readonly containers: readonly Container[];
    readonly initContainers?: readonly Container[];
    readonly terminationGracePeriodSeconds?: number;
    readonly securityContext?: SecurityContext;
  };
}
interface DeploymentSpec {
  readonly replicas?: number;
  readonly selector?: { readonly matchLabels?: Labels };
  readonly template: PodTemplate;
}
interface SelectorSpec {
  readonly selector?: { readonly matchLabels?: Labels };
}
interface ServiceSpec {
  readonly selector?: Labels;
  readonly ports?: readonly { readonly name?: string; readonly port: number; readonly targetPort?: number | string }[];
}
interface HpaSpec {
  readonly scaleTargetRef?: { readonly apiVersion?: string; readonly kind?: string; readonly name?: string };
  readonly minReplicas?: number;
  readonly maxReplicas?: number;
}

/** A KEDA ScaledObject's spec: it makes the HorizontalPodAutoscaler itself. */
interface ScaledObjectSpec {
  readonly scaleTargetRef?: { readonly apiVersion?: string; readonly kind?: string; readonly name?: string };
  readonly minReplicaCount?: number;
  readonly maxReplicaCount?: number;
  readonly triggers?: readonly {
    readonly type?: string;
    readonly metadata?: Readonly<Record<string, string>>;
    readonly authenticationRef?: { readonly name?: string };
  }[];
}

interface TriggerAuthenticationSpec {
  readonly secretTargetRef?: readonly { readonly parameter?: string; readonly name?: string; readonly key?: string }[];
}

interface ImageOverride {
  readonly name: string;
  readonly newName?: string;
  readonly newTag?: string;
  readonly digest?: string;
}

interface Rendering {
  readonly name: string;
  readonly manifests: Manifest[];
  readonly images: ImageOverride[];
}

function isRecord(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

const rel = (file: string): string => relative(K8S_DIR, file);

function yamlFiles(dir: string): string[] {
  return readdirSync(dir).flatMap((entry) => {
    const full = join(dir, entry);
    if (statSync(full).isDirectory()) return yamlFiles(full);
    return /\.ya?ml$/.test(entry) ? [full] : [];
  });
}

/** The documents of a YAML stream; `what` names it in the errors. */
function parseYaml(text: string, what: string): unknown[] {
  const docs = parseAllDocuments(text);
  if (!Array.isArray(docs)) throw new Error(`${what}: not a YAML stream`);
  const errors = docs.flatMap((d) => d.errors.map((e) => e.message));
  if (errors.length > 0) throw new Error(`${what} does not parse: ${errors.join('; ')}`);
  return docs.map((d) => d.toJS() as unknown).filter((d) => d !== null && d !== undefined);
}

const parseYamlFile = (file: string): unknown[] => parseYaml(readFileSync(file, 'utf8'), rel(file));

function asManifest(doc: unknown, source: string): Manifest {
  if (!isRecord(doc) || typeof doc.kind !== 'string' || typeof doc.apiVersion !== 'string') {
    throw new Error(`${source}: not a Kubernetes object (no apiVersion or kind)`);
  }
  if (!isRecord(doc.metadata) || typeof doc.metadata.name !== 'string')
    throw new Error(`${source}: ${doc.kind} without metadata.name`);
  return { ...(doc as unknown as Omit<Manifest, 'source'>), source };
}

function readKustomization(dir: string): Record<string, unknown> {
  const file = join(dir, 'kustomization.yaml');
  if (!existsSync(file)) throw new Error(`${rel(dir)}: no kustomization.yaml`);
  const [doc] = parseYamlFile(file);
  if (!isRecord(doc)) throw new Error(`${rel(file)}: empty`);
  return doc;
}

function stringList(v: unknown, what: string): string[] {
  if (v === undefined) return [];
  if (!Array.isArray(v) || !v.every((x): x is string => typeof x === 'string'))
    throw new Error(`${what} must be a list of strings`);
  return v;
}

function recordList(v: unknown, what: string): Record<string, unknown>[] {
  if (v === undefined) return [];
  if (!Array.isArray(v) || !v.every(isRecord)) throw new Error(`${what} must be a list of objects`);
  return v;
}

// ---------------------------------------------------------------------------
// Manifests: rendered by kubectl kustomize, as an operator builds them.
// ---------------------------------------------------------------------------

const KUBECTL_WANTED =
  'kubectl with kustomize 5 or later (kubectl 1.32 has kustomize 5; `kubectl version --client` shows both)';

function kubectl(args: readonly string[]): string {
  try {
    return execFileSync('kubectl', args, {
      cwd: REPO_ROOT,
      encoding: 'utf8',
      stdio: ['ignore', 'pipe', 'pipe'],
      maxBuffer: 64 << 20,
    });
  } catch (err) {
    const e = err as NodeJS.ErrnoException & { status?: number | null; stderr?: string };
    if (e.code === 'ENOENT') {
      throw new Error(
        `kubectl is not installed (not on PATH): this test renders deploy/k8s with \`kubectl kustomize\`; install ${KUBECTL_WANTED}`,
        { cause: err },
      );
    }
    throw new Error(`kubectl ${args.join(' ')} failed (exit ${String(e.status)}): ${(e.stderr || e.message).trim()}`, {
      cause: err,
    });
  }
}

let kustomizeChecked = false;
function checkKustomize(): void {
  if (kustomizeChecked) return;
  const { kustomizeVersion } = JSON.parse(kubectl(['version', '--client', '--output=json'])) as {
    kustomizeVersion?: string;
  };
  const major = Number(/^v?(\d+)\./.exec(kustomizeVersion ?? '')?.[1]);
  if (!(major >= 5))
    throw new Error(`kubectl's kustomize is ${kustomizeVersion ?? 'unknown'}; this test needs ${KUBECTL_WANTED}`);
  kustomizeChecked = true;
}

/** The kustomization directories a rendering is built from, its bases first. */
function kustomizationTree(dir: string): string[] {
  const resources = stringList(readKustomization(dir).resources, `${rel(dir)}/kustomization.yaml resources`).map((e) =>
    resolve(dir, e),
  );
  return [...resources.filter((p) => existsSync(p) && statSync(p).isDirectory()).flatMap(kustomizationTree), dir];
}

/** For the messages: the files that declare or patch an object, and the configMapGenerator entries that make it. */
function sourceOf(kind: string, name: string, tree: readonly string[]): string[] {
  const unhashed = name.replace(/-[a-z0-9]{10}$/, ''); // kustomize's suffix on a generated name
  return tree.flatMap((dir) => {
    const kustomization = join(dir, 'kustomization.yaml');
    const generators =
      kind === 'ConfigMap'
        ? recordList(readKustomization(dir).configMapGenerator, `${rel(kustomization)} configMapGenerator`)
        : [];
    const files = readdirSync(dir)
      .filter((f) => /\.ya?ml$/.test(f))
      .map((f) => join(dir, f))
      .filter((f) => f !== kustomization);
    return [
      ...generators
        .filter((g) => g.name === name || g.name === unhashed)
        .map((g) => `${rel(kustomization)} configMapGenerator ${String(g.name)}`),
      ...files.flatMap((file) =>
        parseYamlFile(file).flatMap((doc, i) =>
          isRecord(doc) && doc.kind === kind && isRecord(doc.metadata) && doc.metadata.name === name
            ? [`${rel(file)}#${i + 1}`]
            : [],
        ),
      ),
    ];
  });
}

/** What `kubectl kustomize deploy/k8s/<dirName>` prints, as an operator would apply it. */
function render(dirName: string): Rendering {
  checkKustomize();
  const path = relative(REPO_ROOT, join(K8S_DIR, dirName));
  const command = `kubectl kustomize ${path}`;
  const tree = kustomizationTree(join(K8S_DIR, dirName));
  const manifests = parseYaml(kubectl(['kustomize', path]), `the output of ${command}`).map((doc, i) => {
    const m = asManifest(doc, `${command}, document ${i + 1}`);
    return { ...m, source: sourceOf(m.kind, m.metadata.name, tree).join(' + ') || command };
  });
  const images = tree.flatMap(
    (d) => recordList(readKustomization(d).images, `${rel(d)}/kustomization.yaml images`) as unknown as ImageOverride[],
  );
  return { name: dirName, manifests, images };
}

// ---------------------------------------------------------------------------
// Reading the rendered manifests.
// ---------------------------------------------------------------------------

function podTemplateOf(m: Manifest): PodTemplate | undefined {
  if (['Deployment', 'StatefulSet', 'DaemonSet', 'Job', 'ReplicaSet'].includes(m.kind)) {
    return (m.spec as { template?: PodTemplate } | undefined)?.template;
  }
  if (m.kind === 'CronJob')
    return (m.spec as { jobTemplate?: { spec?: { template?: PodTemplate } } } | undefined)?.jobTemplate?.spec?.template;
  return undefined;
}

const describeManifest = (r: Rendering, m: Manifest): string =>
  `[${r.name}] ${m.kind}/${m.metadata.name} (${m.source})`;

const containersOf = (t: PodTemplate): Container[] => [...(t.spec.initContainers ?? []), ...t.spec.containers];

const fullCommand = (c: Container): string[] => [...(c.command ?? []), ...(c.args ?? [])];

const selects = (selector: Labels | undefined, labels: Labels | undefined): boolean =>
  selector !== undefined &&
  Object.keys(selector).length > 0 &&
  Object.entries(selector).every(([k, v]) => labels?.[k] === v);

interface ResolvedVar {
  readonly value: string | undefined;
  /** For the messages: where the variable comes from. */
  readonly from: string;
}

/** The example Secret of a rendering, if it ships one. */
const shippedSecret = (r: Rendering): Manifest | undefined =>
  r.manifests.find((m) => m.kind === 'Secret' && m.metadata.name === SECRET_NAME);

function secretData(secret: Manifest): Record<string, string> {
  const decoded = Object.fromEntries(
    Object.entries(secret.data ?? {}).map(([k, v]) => [k, Buffer.from(v, 'base64').toString('utf8')]),
  );
  return { ...decoded, ...secret.stringData };
}

/** The value of a Secret key: the example Secret's when the rendering ships one, else the test's placeholder. */
function secretValue(r: Rendering, name: string, key: string, where: string, problems: string[]): string | undefined {
  if (name !== SECRET_NAME) {
    problems.push(`${where}: references Secret ${name}; the apps' secrets live in ${SECRET_NAME}`);
    return undefined;
  }
  if (!(key in SECRET_PLACEHOLDERS)) {
    problems.push(
      `${where}: references key ${key} of Secret ${SECRET_NAME}, which is not in SECRET_PLACEHOLDERS (the keys the Secret holds)`,
    );
    return undefined;
  }
  const shipped = shippedSecret(r);
  if (!shipped) return SECRET_PLACEHOLDERS[key];
  const data = secretData(shipped);
  if (!(key in data))
    problems.push(`${where}: references key ${key}, which the example Secret (${shipped.source}) does not have`);
  return data[key];
}

/** A container's environment as the kubelet builds it: envFrom in order, then env, which wins. */
function resolveEnv(r: Rendering, c: Container, where: string, problems: string[]): Map<string, ResolvedVar> {
  const out = new Map<string, ResolvedVar>();
  const configMap = (name: string): Manifest | undefined =>
    r.manifests.find((m) => m.kind === 'ConfigMap' && m.metadata.name === name);
  for (const from of c.envFrom ?? []) {
    const prefix = from.prefix ?? '';
    if (from.configMapRef) {
      const cm = configMap(from.configMapRef.name);
      if (!cm) {
        if (!from.configMapRef.optional)
          problems.push(`${where}: envFrom ConfigMap ${from.configMapRef.name}, which the rendering does not have`);
        continue;
      }
      for (const [k, v] of Object.entries(cm.data ?? {}))
        out.set(prefix + k, { value: String(v), from: `ConfigMap ${cm.metadata.name} (${cm.source})` });
    }
    if (from.secretRef) {
      const shipped = shippedSecret(r);
      const keys = shipped ? Object.keys(secretData(shipped)) : Object.keys(SECRET_PLACEHOLDERS);
      for (const k of keys) {
        out.set(prefix + k, {
          value: secretValue(r, from.secretRef.name, k, where, problems),
          from: `envFrom Secret ${from.secretRef.name}`,
        });
      }
    }
  }
  for (const e of c.env ?? []) {
    const cmRef = e.valueFrom?.configMapKeyRef;
    const secretRef = e.valueFrom?.secretKeyRef;
    if (cmRef) {
      const cm = configMap(cmRef.name);
      const value = cm?.data?.[cmRef.key];
      if (value === undefined && !cmRef.optional)
        problems.push(
          `${where}: ${e.name} refers to key ${cmRef.key} of ConfigMap ${cmRef.name}, which does not exist`,
        );
      out.set(e.name, { value, from: `ConfigMap ${cmRef.name} key ${cmRef.key}` });
    } else if (secretRef) {
      out.set(e.name, {
        value: secretValue(r, secretRef.name, secretRef.key, `${where}: ${e.name}`, problems),
        from: `Secret ${secretRef.name} key ${secretRef.key}`,
      });
    } else if (e.value !== undefined) {
      out.set(e.name, { value: e.value, from: 'a literal env value' });
    } else {
      out.set(e.name, { value: undefined, from: 'a fieldRef or resourceFieldRef' });
    }
  }
  return out;
}

interface AppView {
  readonly deployment: Manifest;
  readonly template: PodTemplate;
  readonly container: Container;
  readonly env: Map<string, ResolvedVar>;
  readonly where: string;
  /** Problems met while resolving the environment (missing ConfigMaps, unknown Secret keys). */
  readonly envProblems: string[];
}

/** The app's Deployment (by its component label) and the container that runs the app; throws naming what is missing. */
function appView(r: Rendering, app: App): AppView {
  const deployments = r.manifests.filter(
    (m) => m.kind === 'Deployment' && m.metadata.labels?.[COMPONENT_LABEL] === app,
  );
  if (deployments.length !== 1) {
    const all = r.manifests
      .filter((m) => m.kind === 'Deployment')
      .map((m) => `${m.metadata.name} (${COMPONENT_LABEL}=${m.metadata.labels?.[COMPONENT_LABEL] ?? 'unset'})`);
    throw new Error(
      `[${r.name}] expected one Deployment labelled ${COMPONENT_LABEL}=${app}, found ${deployments.length}; Deployments: ${all.join(', ') || 'none'}`,
    );
  }
  const deployment = deployments[0];
  const template = podTemplateOf(deployment);
  if (!template) throw new Error(`${describeManifest(r, deployment)}: no pod template`);
  const wanted = appCommand(app);
  const running = template.spec.containers.filter((c) => fullCommand(c).join(' ') === wanted.join(' '));
  if (running.length !== 1) {
    const found = template.spec.containers.map((c) => `${c.name}: ${JSON.stringify(fullCommand(c))}`).join('; ');
    throw new Error(
      `${describeManifest(r, deployment)}: expected one container running ${JSON.stringify(wanted)}, found ${running.length} (${found})`,
    );
  }
  const container = running[0];
  const where = `${describeManifest(r, deployment)} container ${container.name} (${app})`;
  const envProblems: string[] = [];
  const env = resolveEnv(r, container, where, envProblems);
  return { deployment, template, container, env, where, envProblems };
}

/**
 * The variables an app's manifest need not give it although INTERFACE.md or
 * the reference list them: the worker's provider settings when it is in
 * gateway mode (LLM_GATEWAY_URL set), which it then does not read. They stay
 * in INTERFACE.md for the direct mode; the manifests deploy gateway mode.
 */
function unusedIn(view: AppView, app: App): ReadonlySet<string> {
  const gatewayMode = app === 'worker' && Boolean(view.env.get('LLM_GATEWAY_URL')?.value);
  return new Set<string>(gatewayMode ? GATEWAY_MODE_UNUSED_VARIABLES : []);
}

function appSettings(view: AppView, app: App): AppSettings {
  const values: Env = Object.fromEntries([...view.env].map(([k, v]) => [k, v.value]));
  try {
    return APP_SPECS[app].settings(values);
  } catch (err) {
    throw new Error(`${view.where}: the ${app} would not start with this configuration: ${(err as Error).message}`, {
      cause: err,
    });
  }
}

/** A probe or Service port (number or name) as the container port number it lands on. */
function portNumber(c: Container, port: number | string | undefined): number | undefined {
  if (typeof port === 'number') return c.ports?.some((p) => p.containerPort === port) ? port : undefined;
  return c.ports?.find((p) => p.name === port)?.containerPort;
}

/** How long preStop holds the container before SIGTERM, when that can be told. */
function preStopSeconds(c: Container): number | 'unknown' {
  const preStop = c.lifecycle?.preStop;
  if (!preStop) return 0;
  if (preStop.sleep) return preStop.sleep.seconds;
  const cmd = preStop.exec?.command ?? [];
  if (cmd.length === 2 && /(^|\/)sleep$/.test(cmd[0]) && /^\d+(\.\d+)?$/.test(cmd[1])) return Number(cmd[1]);
  return 'unknown';
}

const UNITS: Readonly<Record<string, number>> = {
  '': 1,
  m: 1e-3,
  k: 1e3,
  M: 1e6,
  G: 1e9,
  T: 1e12,
  Ki: 2 ** 10,
  Mi: 2 ** 20,
  Gi: 2 ** 30,
  Ti: 2 ** 40,
};

function quantity(q: string | number): number {
  if (typeof q === 'number') return q;
  const m = /^(\d+(?:\.\d+)?)([a-zA-Z]*)$/.exec(q);
  if (!m || !(m[2] in UNITS)) return Number.NaN;
  return Number(m[1]) * UNITS[m[2]];
}

// ---------------------------------------------------------------------------
// The checks.
// ---------------------------------------------------------------------------

describe('deploy/k8s manifests', () => {
  it('every YAML file parses and is used by the kustomization of its directory', () => {
    const problems: string[] = [];
    for (const file of yamlFiles(K8S_DIR)) {
      try {
        parseYamlFile(file);
      } catch (err) {
        problems.push((err as Error).message);
        continue;
      }
      if (/kustomization\.ya?ml$/.test(file)) continue;
      const kustomizationFile = join(dirname(file), 'kustomization.yaml');
      if (!existsSync(kustomizationFile)) {
        problems.push(`${rel(file)}: no kustomization.yaml beside it, so nothing applies it`);
        continue;
      }
      let k: Record<string, unknown>;
      try {
        k = readKustomization(dirname(file));
      } catch (err) {
        problems.push((err as Error).message);
        continue;
      }
      const used = [
        ...stringList(k.resources, 'resources'),
        ...recordList(k.patches, 'patches').map((p) => String(p.path)),
      ].map((e) => resolve(dirname(file), e));
      if (!used.includes(file))
        problems.push(
          `${rel(file)}: not listed in ${rel(kustomizationFile)} (resources or patches), so it is never applied`,
        );
    }
    expect(problems).toEqual([]);
  });

  // Never skipped: with INTERFACE.md at hand the copy must match it; without
  // it (a fresh clone), the copy must at least name only variables the apps read.
  it(`INTERFACE_ENV_FALLBACK is current (checked against ${existsSync(INTERFACE_PATH) ? 'INTERFACE.md' : "the apps' schemas"})`, () => {
    for (const app of APPS) {
      if (existsSync(INTERFACE_PATH)) {
        const parsed = parseInterfaceEnv(readFileSync(INTERFACE_PATH, 'utf8'));
        expect({ app, variables: [...parsed[app]].sort() }).toEqual({
          app,
          variables: [...INTERFACE_ENV_FALLBACK[app]].sort(),
        });
      }
      const unknown = INTERFACE_ENV_FALLBACK[app].filter((v) => !APP_SPECS[app].variables.has(v));
      expect({ app, unknown }).toEqual({ app, unknown: [] });
    }
  });

  it(`${CONFIGURATION_DOC} has every variable ${interfaceSource.from === INTERFACE_PATH ? 'INTERFACE.md' : 'INTERFACE_ENV_FALLBACK'} names, and every variable the apps read`, () => {
    const problems: string[] = [];
    for (const app of APPS) {
      for (const name of interfaceSource.env[app]) {
        if (!docsEnv[app].includes(name))
          problems.push(
            `${CONFIGURATION_DOC} has no row giving ${name} to the ${app}, which ${interfaceSource.from} lists`,
          );
      }
      for (const name of APP_SPECS[app].variables) {
        if (!docsEnv[app].includes(name))
          problems.push(
            `${CONFIGURATION_DOC}: the ${app} reads ${name} (${APP_SPECS[app].schemaName}), but the reference does not say so`,
          );
      }
      for (const name of docsEnv[app]) {
        if (!APP_SPECS[app].variables.has(name))
          problems.push(
            `${CONFIGURATION_DOC} gives ${name} to the ${app}, but ${APP_SPECS[app].schemaName} has no such variable`,
          );
      }
    }
    expect(problems).toEqual([]);
  });

  describe.each(RENDERINGS)('%s', (dirName) => {
    let r: Rendering;
    beforeAll(() => {
      r = render(dirName);
    });

    describe.each(APPS)('%s', (app) => {
      const spec = APP_SPECS[app];

      it(`has a Deployment whose container runs node dist/apps/${app}/main.js`, () => {
        expect(appView(r, app).container.name).toBeTruthy();
      });

      it(`gets only variables in ${spec.schemaName}, and its configuration loads`, () => {
        const view = appView(r, app);
        const problems = [...view.envProblems];
        for (const [name, v] of view.env) {
          if (!spec.variables.has(name))
            problems.push(`${view.where}: gets ${name} from ${v.from}, but ${spec.schemaName} has no such variable`);
        }
        expect(problems).toEqual([]);
        expect(() => appSettings(view, app)).not.toThrow();
      });

      it(`gets every variable INTERFACE.md and ${CONFIGURATION_DOC} list for the ${app} (but what gateway mode leaves unused), and NODE_ENV=production`, () => {
        const view = appView(r, app);
        const problems: string[] = [];
        const unused = unusedIn(view, app);
        for (const name of interfaceSource.env[app]) {
          if (!view.env.has(name) && !unused.has(name))
            problems.push(
              `${view.where}: ${interfaceSource.from} lists ${name} for the ${app}, but neither env nor envFrom provides it`,
            );
        }
        for (const name of docsEnv[app]) {
          if (!view.env.has(name) && !unused.has(name))
            problems.push(
              `${view.where}: ${CONFIGURATION_DOC} lists ${name} for the ${app}, but neither env nor envFrom provides it`,
            );
        }
        const nodeEnv = view.env.get('NODE_ENV');
        if (nodeEnv?.value !== 'production')
          problems.push(
            `${view.where}: NODE_ENV is ${nodeEnv ? `"${nodeEnv.value}" from ${nodeEnv.from}` : 'unset'}, not production`,
          );
        expect(problems).toEqual([]);
      });

      it(`probes GET ${LIVE_PATH} (liveness, startup) and ${READY_PATH} (readiness) on the port it listens on`, () => {
        const view = appView(r, app);
        const { port } = appSettings(view, app);
        const portFrom = view.env.get(spec.portVariable)?.from ?? `${spec.schemaName}'s default`;
        const problems: string[] = [];
        const probes: [string, Probe | undefined, readonly string[]][] = [
          ['livenessProbe', view.container.livenessProbe, [LIVE_PATH]],
          ['readinessProbe', view.container.readinessProbe, [READY_PATH]],
          ['startupProbe', view.container.startupProbe, [LIVE_PATH, READY_PATH]],
        ];
        for (const [kind, probe, paths] of probes) {
          const get = probe?.httpGet;
          if (!get) {
            problems.push(`${view.where}: no ${kind} with httpGet`);
            continue;
          }
          if (!paths.includes(get.path ?? ''))
            problems.push(`${view.where}: ${kind} gets ${get.path ?? '(no path)'}, expected ${paths.join(' or ')}`);
          if (get.scheme !== undefined && get.scheme !== 'HTTP')
            problems.push(`${view.where}: ${kind} uses ${get.scheme}; the apps serve plain HTTP`);
          const target = portNumber(view.container, get.port);
          if (target === undefined) {
            problems.push(
              `${view.where}: ${kind} port ${String(get.port)} is not a declared containerPort (${JSON.stringify(view.container.ports ?? [])})`,
            );
          } else if (target !== port) {
            problems.push(
              `${view.where}: ${kind} probes port ${target}, but the ${app} listens on ${spec.portVariable}=${port} (from ${portFrom})`,
            );
          }
        }
        expect(problems).toEqual([]);
      });

      it('has terminationGracePeriodSeconds longer than preStop plus its drain', () => {
        const view = appView(r, app);
        const { drainSeconds, drainWhy } = appSettings(view, app);
        const preStop = preStopSeconds(view.container);
        if (preStop === 'unknown')
          throw new Error(
            `${view.where}: cannot tell how long its preStop hook takes; use exec ["sleep", "N"] or sleep.seconds`,
          );
        const grace = view.template.spec.terminationGracePeriodSeconds ?? 30;
        const needed = preStop + drainSeconds;
        if (!(grace > needed)) {
          throw new Error(
            `${view.where}: terminationGracePeriodSeconds is ${grace}, not more than preStop ${preStop} s + drain ${drainSeconds} s (${drainWhy}) = ${needed} s`,
          );
        }
      });

      it('is scraped by Prometheus (if annotated) on the port it serves /metrics on', () => {
        const view = appView(r, app);
        const annotations = view.template.metadata?.annotations ?? {};
        if (annotations['prometheus.io/scrape'] !== 'true') return;
        const { port } = appSettings(view, app);
        const problems: string[] = [];
        if (annotations['prometheus.io/port'] !== String(port)) {
          problems.push(
            `${view.where}: prometheus.io/port is ${annotations['prometheus.io/port'] ?? 'unset'}, but the ${app} serves /metrics on ${port}`,
          );
        }
        const path = annotations['prometheus.io/path'];
        if (path !== undefined && path !== '/metrics')
          problems.push(`${view.where}: prometheus.io/path is ${path}, not /metrics`);
        expect(problems).toEqual([]);
      });

      it('has a Deployment selector matching its pods and a PodDisruptionBudget selecting them', () => {
        const view = appView(r, app);
        const labels = view.template.metadata?.labels;
        const problems: string[] = [];
        if (!selects((view.deployment.spec as DeploymentSpec).selector?.matchLabels, labels)) {
          problems.push(`${view.where}: spec.selector.matchLabels does not match the pod template's labels`);
        }
        const pdbs = r.manifests.filter(
          (m) => m.kind === 'PodDisruptionBudget' && selects((m.spec as SelectorSpec).selector?.matchLabels, labels),
        );
        if (pdbs.length !== 1)
          problems.push(`${view.where}: ${pdbs.length} PodDisruptionBudgets select its pods, expected 1`);
        expect(problems).toEqual([]);
      });
    });

    it('the api Service targets the port the api listens on, and selects only api pods', () => {
      const view = appView(r, 'api');
      const { port } = appSettings(view, 'api');
      // Another app's broken Deployment is reported by its own tests, not here.
      const others = APPS.filter((a) => a !== 'api').flatMap((a) => {
        try {
          return [appView(r, a)];
        } catch {
          return [];
        }
      });
      const services = r.manifests.filter(
        (m) => m.kind === 'Service' && selects((m.spec as ServiceSpec).selector, view.template.metadata?.labels),
      );
      const problems: string[] = [];
      if (services.length === 0)
        problems.push(
          `[${r.name}] no Service selects the api's pods (${JSON.stringify(view.template.metadata?.labels)})`,
        );
      for (const svc of services) {
        const s = svc.spec as ServiceSpec;
        for (const other of others) {
          if (selects(s.selector, other.template.metadata?.labels))
            problems.push(`${describeManifest(r, svc)}: also selects ${other.where}`);
        }
        if (!s.ports?.length) problems.push(`${describeManifest(r, svc)}: no ports`);
        for (const p of s.ports ?? []) {
          const target = portNumber(view.container, p.targetPort ?? p.port);
          if (target !== port) {
            problems.push(
              `${describeManifest(r, svc)}: port ${p.port} targets ${String(p.targetPort ?? p.port)} (container port ${String(target)}), but the api listens on ${port}`,
            );
          }
        }
      }
      expect(problems).toEqual([]);
    });

    it("the worker calls the model through the api's Service (LLM_GATEWAY_URL), both apps with INTERNAL_API_KEY from the Secret", () => {
      const api = appView(r, 'api');
      const worker = appView(r, 'worker');
      const problems: string[] = [];
      // Both apps read the same key, each by a secretKeyRef that is not optional: a pod without it must not start.
      for (const view of [api, worker]) {
        const entry = view.container.env?.find((e) => e.name === 'INTERNAL_API_KEY');
        const ref = entry?.valueFrom?.secretKeyRef;
        if (ref?.name !== SECRET_NAME || ref.key !== 'INTERNAL_API_KEY')
          problems.push(
            `${view.where}: INTERNAL_API_KEY is ${view.env.get('INTERNAL_API_KEY')?.from ?? 'unset'}, not a secretKeyRef to ${SECRET_NAME} key INTERNAL_API_KEY`,
          );
        else if (ref.optional) problems.push(`${view.where}: INTERNAL_API_KEY's secretKeyRef is optional`);
      }
      // (The same Secret key for both is what makes it the same value: the check above is the one that can fail.)

      // LLM_GATEWAY_URL names a Service that selects the api's pods, by a port it serves (that lands on the api's).
      const gateway = worker.env.get('LLM_GATEWAY_URL');
      let url: URL | undefined;
      try {
        url = new URL(gateway?.value ?? '');
      } catch {
        problems.push(
          `${worker.where}: LLM_GATEWAY_URL is ${JSON.stringify(gateway?.value)} (${gateway?.from ?? 'unset'}), not a URL`,
        );
      }
      if (url) {
        const namespace = r.manifests.find((m) => m.kind === 'Namespace')?.metadata.name;
        const [serviceName, ns, ...rest] = url.hostname.split('.');
        const domain = rest.join('.');
        if (ns !== undefined && (ns !== namespace || !['', 'svc', 'svc.cluster.local'].includes(domain)))
          problems.push(
            `${worker.where}: LLM_GATEWAY_URL's host ${url.hostname} is not a Service of this rendering's namespace (${namespace ?? 'none'})`,
          );
        const service = r.manifests.find((m) => m.kind === 'Service' && m.metadata.name === serviceName);
        const spec = service?.spec as ServiceSpec | undefined;
        const port = Number(url.port || (url.protocol === 'https:' ? 443 : 80));
        const { port: apiPort } = appSettings(api, 'api');
        if (url.protocol !== 'http:')
          problems.push(`${worker.where}: LLM_GATEWAY_URL uses ${url.protocol}; the api serves plain HTTP`);
        if (url.pathname !== '/' && url.pathname !== '')
          problems.push(
            `${worker.where}: LLM_GATEWAY_URL has the path ${url.pathname}; it is the api's base URL (the client adds /v1)`,
          );
        if (!service)
          problems.push(`${worker.where}: LLM_GATEWAY_URL names ${serviceName}, which is no Service of the rendering`);
        else if (!selects(spec?.selector, api.template.metadata?.labels))
          problems.push(
            `${describeManifest(r, service)}: named by the worker's LLM_GATEWAY_URL, but does not select the api's pods`,
          );
        else {
          const servicePort = spec?.ports?.find((p) => p.port === port);
          const target = servicePort && portNumber(api.container, servicePort.targetPort ?? servicePort.port);
          if (target !== apiPort)
            problems.push(
              `${worker.where}: LLM_GATEWAY_URL's port ${port} ${servicePort ? `lands on container port ${String(target)}` : 'is not a port of the Service'}, but the api listens on ${apiPort}`,
            );
        }
      }
      expect(problems).toEqual([]);
    });

    it("gives the worker in gateway mode no provider settings: no OPENAI_API_KEY (the api's secret), LLM_PROVIDER or OPENAI_BASE_URL", () => {
      const worker = appView(r, 'worker');
      const problems: string[] = [];
      if (!worker.env.get('LLM_GATEWAY_URL')?.value) problems.push(`${worker.where}: not in gateway mode`);
      for (const name of GATEWAY_MODE_UNUSED_VARIABLES) {
        const given = worker.env.get(name);
        if (given) problems.push(`${worker.where}: gets ${name} from ${given.from}, which gateway mode never reads`);
      }
      // The api, which calls the provider for both, still gets its key.
      const apiKey = appView(r, 'api').container.env?.find((e) => e.name === 'OPENAI_API_KEY')?.valueFrom?.secretKeyRef;
      if (apiKey?.name !== SECRET_NAME || apiKey.key !== 'OPENAI_API_KEY' || apiKey.optional)
        problems.push(`[${r.name}] the api does not get OPENAI_API_KEY from ${SECRET_NAME} (not optional)`);
      expect(problems).toEqual([]);
    });

    it('one autoscaler (an autoscaling/v2 HorizontalPodAutoscaler or a KEDA ScaledObject) targets the worker Deployment, which leaves replicas to it', () => {
      const worker = appView(r, 'worker');
      const hpas = r.manifests.filter((m) => m.kind === 'HorizontalPodAutoscaler');
      const problems: string[] = [];
      const scaledObjects = r.manifests.filter((m) => m.kind === 'ScaledObject');
      const targeting = [...hpas, ...scaledObjects].filter((m) => {
        const ref = (m.spec as HpaSpec).scaleTargetRef;
        return ref?.kind === 'Deployment' && ref.name === worker.deployment.metadata.name;
      });
      if (targeting.length !== 1) {
        problems.push(
          `[${r.name}] ${targeting.length} autoscalers target Deployment ${worker.deployment.metadata.name}, expected 1 (found: ${[...hpas, ...scaledObjects].map((h) => `${h.kind}/${h.metadata.name}`).join(', ') || 'none'})`,
        );
      }
      for (const so of scaledObjects) {
        const s = so.spec as ScaledObjectSpec;
        const ref = s.scaleTargetRef;
        if (
          ref?.apiVersion !== 'apps/v1' ||
          !r.manifests.some((m) => m.kind === ref?.kind && m.metadata.name === ref?.name)
        )
          problems.push(
            `${describeManifest(r, so)}: targets ${String(ref?.kind)}/${String(ref?.name)}, which does not exist`,
          );
        if (!(
          s.minReplicaCount !== undefined &&
          s.maxReplicaCount !== undefined &&
          s.minReplicaCount >= 1 &&
          s.minReplicaCount <= s.maxReplicaCount
        ))
          problems.push(
            `${describeManifest(r, so)}: needs 1 <= minReplicaCount <= maxReplicaCount (a worker must always run)`,
          );
        const streams = (s.triggers ?? []).filter(
          (t) => t.type === 'redis-streams' || t.type === 'redis-cluster-streams',
        );
        if (!streams.some((t) => t.metadata?.stream === '{summaries}:jobs'))
          problems.push(`${describeManifest(r, so)}: no redis-streams trigger on {summaries}:jobs`);
        for (const t of streams) {
          // With a consumerGroup KEDA scales on the group's pending entries (in flight), not the stream's length.
          if (t.metadata?.consumerGroup !== undefined || !(Number(t.metadata?.streamLength) > 0))
            problems.push(
              `${describeManifest(r, so)}: trigger on ${t.metadata?.stream} must scale on streamLength (the backlog), without consumerGroup`,
            );
          const auth = r.manifests.find(
            (m) => m.kind === 'TriggerAuthentication' && m.metadata.name === t.authenticationRef?.name,
          );
          if (!auth) {
            problems.push(
              `${describeManifest(r, so)}: TriggerAuthentication ${String(t.authenticationRef?.name)} does not exist`,
            );
            continue;
          }
          for (const ref of (auth.spec as TriggerAuthenticationSpec).secretTargetRef ?? [])
            if (ref.name !== SECRET_NAME || !(String(ref.key) in SECRET_PLACEHOLDERS))
              problems.push(
                `${describeManifest(r, auth)}: ${ref.parameter} from ${ref.name}/${ref.key}, not a key of ${SECRET_NAME}`,
              );
        }
      }
      for (const hpa of hpas) {
        const s = hpa.spec as HpaSpec;
        const ref = s.scaleTargetRef;
        if (hpa.apiVersion !== 'autoscaling/v2')
          problems.push(`${describeManifest(r, hpa)}: apiVersion ${hpa.apiVersion}, expected autoscaling/v2`);
        if (ref?.apiVersion !== 'apps/v1')
          problems.push(
            `${describeManifest(r, hpa)}: scaleTargetRef.apiVersion ${String(ref?.apiVersion)}, expected apps/v1`,
          );
        if (!r.manifests.some((m) => m.kind === ref?.kind && m.metadata.name === ref?.name)) {
          problems.push(
            `${describeManifest(r, hpa)}: targets ${String(ref?.kind)}/${String(ref?.name)}, which does not exist`,
          );
        }
        if (!(
          s.minReplicas !== undefined &&
          s.maxReplicas !== undefined &&
          s.minReplicas >= 1 &&
          s.minReplicas <= s.maxReplicas
        )) {
          problems.push(
            `${describeManifest(r, hpa)}: needs 1 <= minReplicas (${String(s.minReplicas)}) <= maxReplicas (${String(s.maxReplicas)})`,
          );
        }
      }
      if ((worker.deployment.spec as DeploymentSpec).replicas !== undefined) {
        problems.push(
          `${worker.where}: sets spec.replicas, which every apply would reset under the HorizontalPodAutoscaler`,
        );
      }
      expect(problems).toEqual([]);
    });

    it(`one Job runs ${MIGRATE_COMMAND.join(' ')} with the apps' image and the database URL`, () => {
      const jobs = r.manifests.filter((m) => m.kind === 'Job');
      const migrate = jobs.flatMap((job) => {
        const t = podTemplateOf(job);
        return (t?.spec.containers ?? [])
          .filter((c) => fullCommand(c).join(' ') === MIGRATE_COMMAND.join(' '))
          .map((c) => ({ job, c }));
      });
      if (migrate.length !== 1) {
        const found = jobs.map(
          (j) => `${j.metadata.name}: ${JSON.stringify(podTemplateOf(j)?.spec.containers.map(fullCommand))}`,
        );
        throw new Error(
          `[${r.name}] expected one Job container running ${JSON.stringify(MIGRATE_COMMAND)}, found ${migrate.length} (${found.join('; ') || 'no Jobs'})`,
        );
      }
      const [{ job, c }] = migrate;
      const problems: string[] = [];
      const where = `${describeManifest(r, job)} container ${c.name}`;
      const env = resolveEnv(r, c, where, problems);
      if (!env.has('DATABASE_URL')) problems.push(`${where}: no DATABASE_URL`);
      const apiImage = appView(r, 'api').container.image;
      if (c.image !== apiImage)
        problems.push(`${where}: image ${String(c.image)}, but the apps run ${String(apiImage)}`);
      expect(problems).toEqual([]);
    });

    it('every container has CPU and memory requests and limits, requests within limits', () => {
      const problems: string[] = [];
      for (const m of r.manifests) {
        const t = podTemplateOf(m);
        for (const c of t ? containersOf(t) : []) {
          const where = `${describeManifest(r, m)} container ${c.name}`;
          for (const resource of ['cpu', 'memory']) {
            const request = c.resources?.requests?.[resource];
            const limit = c.resources?.limits?.[resource];
            if (request === undefined) problems.push(`${where}: no ${resource} request`);
            if (limit === undefined) problems.push(`${where}: no ${resource} limit`);
            if (request === undefined || limit === undefined) continue;
            const [q, l] = [quantity(request), quantity(limit)];
            if (Number.isNaN(q) || Number.isNaN(l))
              problems.push(`${where}: ${resource} request ${request} or limit ${limit} is not a quantity`);
            else if (q > l) problems.push(`${where}: ${resource} request ${request} exceeds its limit ${limit}`);
          }
        }
      }
      expect(problems).toEqual([]);
    });

    it('every pod runs as a numeric non-root user, read-only, without privileges, under RuntimeDefault seccomp', () => {
      const problems: string[] = [];
      for (const m of r.manifests) {
        const t = podTemplateOf(m);
        if (!t) continue;
        const pod = t.spec.securityContext ?? {};
        for (const c of containersOf(t)) {
          const where = `${describeManifest(r, m)} container ${c.name}`;
          const sc = c.securityContext ?? {};
          if ((sc.runAsNonRoot ?? pod.runAsNonRoot) !== true) problems.push(`${where}: runAsNonRoot is not true`);
          // The image's USER is a name (node); the kubelet can verify runAsNonRoot only against a number.
          const uid = sc.runAsUser ?? pod.runAsUser;
          if (!(typeof uid === 'number' && uid > 0))
            problems.push(`${where}: runAsUser is ${String(uid)}, expected a numeric non-root uid`);
          if (sc.readOnlyRootFilesystem !== true) problems.push(`${where}: readOnlyRootFilesystem is not true`);
          if (sc.allowPrivilegeEscalation !== false) problems.push(`${where}: allowPrivilegeEscalation is not false`);
          if (sc.privileged === true) problems.push(`${where}: privileged`);
          if (!sc.capabilities?.drop?.includes('ALL'))
            problems.push(`${where}: capabilities.drop does not include ALL`);
          if (sc.capabilities?.add?.length)
            problems.push(`${where}: adds capabilities ${sc.capabilities.add.join(', ')}`);
          const seccomp = sc.seccompProfile?.type ?? pod.seccompProfile?.type;
          if (seccomp !== 'RuntimeDefault' && seccomp !== 'Localhost')
            problems.push(`${where}: seccompProfile is ${String(seccomp)}, expected RuntimeDefault`);
        }
      }
      expect(problems).toEqual([]);
    });

    it('every container runs the same image, the one the overlay names', () => {
      const images = new Map<string, string[]>();
      for (const m of r.manifests) {
        const t = podTemplateOf(m);
        for (const c of t ? containersOf(t) : []) {
          const image = c.image ?? '(none)';
          images.set(image, [...(images.get(image) ?? []), `${m.kind}/${m.metadata.name}:${c.name}`]);
        }
      }
      expect({ rendering: r.name, images: [...images.keys()] }).toEqual({
        rendering: r.name,
        images: [expect.any(String)],
      });
      if (r.name.startsWith('overlays/')) {
        const [image] = [...images.keys()];
        const problems: string[] = [];
        if (!r.images.some((i) => i.newName !== undefined || i.newTag !== undefined || i.digest !== undefined)) {
          problems.push(`[${r.name}] kustomization images does not set the registry name and release tag`);
        }
        if (!/[:@]/.test(image) || image.endsWith(':latest'))
          problems.push(`[${r.name}] image ${image} has no pinned tag or digest`);
        expect(problems).toEqual([]);
      }
    });

    it(`secrets come only from ${SECRET_NAME}; only the example overlay ships it, with placeholders`, () => {
      const problems: string[] = [];
      const secrets = r.manifests.filter((m) => m.kind === 'Secret');
      if (r.name === 'base' && secrets.length > 0)
        problems.push(
          `[base] ships Secrets (${secrets.map((s) => s.source).join(', ')}); secrets belong to an environment`,
        );
      for (const s of secrets) {
        if (s.metadata.name !== SECRET_NAME)
          problems.push(`${describeManifest(r, s)}: only ${SECRET_NAME} is expected`);
        const data = secretData(s);
        const keys = Object.keys(data).sort();
        const expected = Object.keys(SECRET_PLACEHOLDERS).sort();
        if (keys.join() !== expected.join())
          problems.push(`${describeManifest(r, s)}: keys ${keys.join(', ')}, expected ${expected.join(', ')}`);
        for (const [k, v] of Object.entries(data)) {
          if (!v.includes(EXAMPLE_SECRET_MARKER))
            problems.push(
              `${describeManifest(r, s)}: ${k} does not look like a placeholder (no ${EXAMPLE_SECRET_MARKER}); never commit a real secret`,
            );
        }
      }
      if (r.name.startsWith('overlays/') && secrets.length === 0)
        problems.push(`[${r.name}] ships no example ${SECRET_NAME}`);
      expect(problems).toEqual([]);
    });

    it('every ConfigMap is read by some container', () => {
      const read = new Set<string>();
      for (const m of r.manifests) {
        const t = podTemplateOf(m);
        for (const c of t ? containersOf(t) : []) {
          for (const f of c.envFrom ?? []) if (f.configMapRef) read.add(f.configMapRef.name);
          for (const e of c.env ?? []) if (e.valueFrom?.configMapKeyRef) read.add(e.valueFrom.configMapKeyRef.name);
        }
      }
      const unread = r.manifests
        .filter((m) => m.kind === 'ConfigMap' && !read.has(m.metadata.name))
        .map((m) => describeManifest(r, m));
      expect(unread).toEqual([]);
    });
  });
});
