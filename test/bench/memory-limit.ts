import { existsSync, mkdirSync, readFileSync, rmdirSync, writeFileSync } from 'node:fs';
import { join, resolve } from 'node:path';

const REPO_ROOT = resolve(__dirname, '../..');

/*
 * A memory limit for a bench process, as a pod has one: a memory cgroup of
 * its own (v1 `memory.limit_in_bytes` or v2 `memory.max`), which is also what
 * Node sizes V8's heap from. Where no cgroup can be made (no permission, no
 * memory controller), the process runs without a limit and the report says
 * so.
 */

export interface MemoryCgroup {
  readonly path: string;
  readonly limitMiB: number;
  /** The cgroup's peak usage (the process's RSS plus the page cache charged to it), MiB; undefined where unknown. */
  peakMiB(): number | undefined;
  /** Processes the kernel's OOM killer killed in it. */
  oomKills(): number;
  /** Removes the cgroup (once its process has exited). */
  remove(): void;
}

const V1 = '/sys/fs/cgroup/memory';
const V2 = '/sys/fs/cgroup';

/** A new memory cgroup limited to `limitMiB`, or undefined when this machine does not let us make one. */
export function memoryCgroup(name: string, limitMiB: number): MemoryCgroup | undefined {
  const v1 = existsSync(join(V1, 'memory.limit_in_bytes'));
  const v2 = !v1 && existsSync(join(V2, 'cgroup.controllers'));
  if (!v1 && !v2) return undefined;
  const path = join(v1 ? V1 : V2, `llmwf-bench-${name.replace(/\W+/g, '-')}-${process.pid}`);
  try {
    mkdirSync(path, { recursive: true });
    writeFileSync(join(path, v1 ? 'memory.limit_in_bytes' : 'memory.max'), String(limitMiB * 2 ** 20));
  } catch {
    try {
      rmdirSync(path);
    } catch {
      // never made
    }
    return undefined;
  }
  const read = (file: string): string | undefined => {
    try {
      return readFileSync(join(path, file), 'utf8');
    } catch {
      return undefined;
    }
  };
  return {
    path,
    limitMiB,
    peakMiB() {
      const raw = read(v1 ? 'memory.max_usage_in_bytes' : 'memory.peak');
      return raw === undefined ? undefined : Math.round(Number(raw) / 2 ** 20);
    },
    oomKills() {
      const m = /^oom_kill (\d+)$/m.exec(read(v1 ? 'memory.oom_control' : 'memory.events') ?? '');
      return m ? Number(m[1]) : 0;
    },
    remove() {
      try {
        rmdirSync(path);
      } catch {
        // still has a process, or gone already
      }
    },
  };
}

/** The memory limit the Kubernetes manifests give `app` (deploy/k8s/base/<app>.yaml, `limits.memory`), in MiB. */
export function kubernetesMemoryLimitMiB(app: 'api' | 'worker' | 'relay'): number {
  const manifest = readFileSync(join(REPO_ROOT, 'deploy/k8s/base', `${app}.yaml`), 'utf8');
  const m = /limits:(?:\n\s+#.*|\n\s+cpu:.*)*\n\s+memory:\s*"?(\d+)(Mi|Gi)"?/.exec(manifest);
  if (!m) throw new Error(`deploy/k8s/base/${app}.yaml: no limits.memory found`);
  return Number(m[1]) * (m[2] === 'Gi' ? 1024 : 1);
}

/** The NODE_OPTIONS the image runs the apps with (the Dockerfile's `ENV NODE_OPTIONS=`), for a process run as a pod. */
export function imageNodeOptions(): string {
  const dockerfile = readFileSync(join(REPO_ROOT, 'Dockerfile'), 'utf8');
  const m = /^ENV NODE_OPTIONS=("?)([^"\n]*)\1\s*$/m.exec(dockerfile);
  if (!m) throw new Error('Dockerfile: no ENV NODE_OPTIONS= line');
  return m[2];
}
