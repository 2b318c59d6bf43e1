import type { EnvSchema } from './env-schema';

/** One app's schema, named as the reference's "apps" column names it. */
export interface AppSchema {
  readonly app: string;
  readonly schema: EnvSchema;
}

/** One row of the reference: a variable, the apps that read it, its default per app and its meaning. */
export interface ConfigReferenceRow {
  readonly variable: string;
  readonly apps: readonly string[];
  readonly defaults: readonly string[];
  readonly describe: string;
}

export const CONFIG_BEGIN = '<!-- config:begin -->';
export const CONFIG_END = '<!-- config:end -->';

/**
 * The variables of `apps`, in order of first appearance; one row per variable.
 * A variable read by several apps must mean the same in each.
 */
export function configReferenceRows(apps: readonly AppSchema[]): ConfigReferenceRow[] {
  const rows = new Map<string, { apps: string[]; defaults: string[]; describe: string }>();
  for (const { app, schema } of apps) {
    for (const [key, field] of Object.entries(schema)) {
      const describe = field.doc?.describe ?? '';
      const dflt = field.doc?.default ?? '—';
      const row = rows.get(field.variable);
      if (!row) {
        rows.set(field.variable, { apps: [app], defaults: [dflt], describe });
        continue;
      }
      if (row.describe !== describe) {
        throw new Error(
          `${field.variable} (${app}'s ${key}) is described differently from the ${row.apps.join(', ')}'s: give every app the same describe`,
        );
      }
      row.apps.push(app);
      row.defaults.push(dflt);
    }
  }
  return [...rows].map(([variable, r]) => ({ variable, ...r }));
}

/** The apps that read each variable, by app. */
export function configReferenceVariables(apps: readonly AppSchema[]): Record<string, string[]> {
  const out: Record<string, string[]> = Object.fromEntries(apps.map((a) => [a.app, []]));
  for (const row of configReferenceRows(apps)) for (const app of row.apps) out[app].push(row.variable);
  return out;
}

const cell = (text: string): string => text.replace(/\|/g, '\\|').replace(/\n/g, ' ');

/** The Markdown table: `all` when every app reads a variable; one default when the apps agree. */
export function renderConfigReference(apps: readonly AppSchema[]): string {
  const lines = ['| variable | apps | default | |', '| --- | --- | --- | --- |'];
  for (const row of configReferenceRows(apps)) {
    const who = row.apps.length === apps.length ? 'all' : row.apps.join(', ');
    const same = row.defaults.every((d) => d === row.defaults[0]);
    const dflt = same ? row.defaults[0] : row.defaults.join(', ');
    lines.push(`| \`${row.variable}\` | ${who} | ${cell(dflt)} | ${cell(row.describe)} |`.replace(/ {2}\|$/, ' |'));
  }
  return lines.join('\n');
}

/** `markdown` with the text between the markers replaced by `table`; throws when the markers are missing. */
export function withConfigReference(markdown: string, table: string, file = 'the document'): string {
  const begin = markdown.indexOf(CONFIG_BEGIN);
  const end = markdown.indexOf(CONFIG_END);
  if (begin < 0 || end < begin) throw new Error(`${file} has no ${CONFIG_BEGIN} … ${CONFIG_END} section`);
  return `${markdown.slice(0, begin + CONFIG_BEGIN.length)}\n${table}\n${markdown.slice(end)}`;
}
