import { ArgumentsHost, Catch, ExceptionFilter, HttpException, Logger } from '@nestjs/common';
import type { Response } from 'express';
import { PROBLEM_CONTENT_TYPE } from './problem';
import { toProblem } from './to-problem';

/** Renders every error that reaches the HTTP layer as application/problem+json. */
@Catch()
export class ProblemDetailsFilter implements ExceptionFilter {
  private readonly logger = new Logger(ProblemDetailsFilter.name);

  catch(exception: unknown, host: ArgumentsHost): void {
    if (host.getType() !== 'http') throw exception;
    const res = host.switchToHttp().getResponse<Response>();
    const { status, body, headers } = toProblem(exception);
    if (!(exception instanceof HttpException)) {
      // A bug or an unexpected failure: the stack matters.
      this.logger.error(exception instanceof Error ? exception : String(exception));
    } else if (status >= 500) {
      // A 5xx the code chose (a dependency is down): what, not where.
      this.logger.warn(`${status} ${body.type}: ${body.detail ?? body.title}`);
    }
    if (res.headersSent) {
      // The answer is already on its way (a streamed body failed midway):
      // nothing can be said to the client any more.
      res.destroy();
      return;
    }
    res.status(status).set(headers).type(PROBLEM_CONTENT_TYPE).send(JSON.stringify(body));
  }
}
