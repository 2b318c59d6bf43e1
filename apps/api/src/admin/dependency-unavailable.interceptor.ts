import {
  type CallHandler,
  type ExecutionContext,
  HttpException,
  Injectable,
  Logger,
  type NestInterceptor,
} from '@nestjs/common';
import { serviceUnavailable } from '@app/problem';
import { catchError, type Observable, throwError } from 'rxjs';

/**
 * The admin endpoints do nothing but Redis and PostgreSQL I/O, so an error
 * that is not already an HTTP answer is one of them not answering: a 503 with
 * Retry-After, not a 500. The error itself is logged for the operator.
 */
@Injectable()
export class DependencyUnavailableInterceptor implements NestInterceptor {
  private readonly logger = new Logger('AdminController');

  intercept(context: ExecutionContext, next: CallHandler): Observable<unknown> {
    return next.handle().pipe(
      catchError((err: unknown) => {
        if (err instanceof HttpException) return throwError(() => err);
        this.logger.warn(
          { err: err instanceof Error ? err.message : String(err), handler: context.getHandler().name },
          'admin request failed: a store did not answer',
        );
        return throwError(() =>
          serviceUnavailable(
            'Redis or PostgreSQL did not answer',
            'Retry; changes made before the failure, if any, are logged and stay made.',
          ),
        );
      }),
    );
  }
}
