import type { LoggerService } from '@nestjs/common';

const BOOT_CONTEXTS = new Set(['NestFactory', 'InstanceLoader', 'NestApplication']);

/**
 * The CLI's log lines go to stderr as JSON, so stdout carries only the
 * command's result and stays parseable; an operator's action is on record
 * either way.
 */
export class StderrJsonLogger implements LoggerService {
  log(message: unknown, ...rest: unknown[]): void {
    // Nest's own start-up lines say nothing an operator needs here.
    if (BOOT_CONTEXTS.has(String(rest[rest.length - 1]))) return;
    this.write('info', message, rest);
  }
  warn(message: unknown, ...rest: unknown[]): void {
    this.write('warn', message, rest);
  }
  error(message: unknown, ...rest: unknown[]): void {
    this.write('error', message, rest);
  }
  debug(): void {}
  verbose(): void {}

  private write(level: string, message: unknown, rest: unknown[]): void {
    const context = typeof rest[rest.length - 1] === 'string' ? rest[rest.length - 1] : undefined;
    const fields = typeof message === 'object' && message !== null ? message : { msg: String(message) };
    const msg = typeof message === 'object' && typeof rest[0] === 'string' && rest.length > 1 ? rest[0] : undefined;
    process.stderr.write(
      `${JSON.stringify({ level, time: new Date().toISOString(), app: 'admin', context, ...fields, ...(msg ? { msg } : {}) })}\n`,
    );
  }
}
