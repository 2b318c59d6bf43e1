import { Global, Injectable, Module, type OnApplicationShutdown } from '@nestjs/common';
import { shutdownTracing } from './start-tracing';

/** At shutdown, after the drain (beforeApplicationShutdown): the spans still buffered are exported before exit. */
@Injectable()
export class TracingShutdown implements OnApplicationShutdown {
  onApplicationShutdown(): Promise<void> {
    return shutdownTracing();
  }
}

/** Imported by each traced app's root module; nothing to configure (startTracing read the variables). */
@Global()
@Module({ providers: [TracingShutdown] })
export class TracingModule {}
