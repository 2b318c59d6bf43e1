import { DynamicModule, Module } from '@nestjs/common';
import { OperationsModule } from '@app/operations';
import { ADMIN_API_KEY, AdminKeyGuard } from './admin-key.guard';
import { AdminController } from './admin.controller';

@Module({})
export class AdminModule {
  static forRoot(adminApiKey: string | undefined): DynamicModule {
    return {
      module: AdminModule,
      imports: [OperationsModule],
      controllers: [AdminController],
      providers: [{ provide: ADMIN_API_KEY, useValue: adminApiKey }, AdminKeyGuard],
    };
  }
}
