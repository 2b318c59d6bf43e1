import { Module } from '@nestjs/common';
import { JobsModule } from '@app/jobs';
import { SummariesController } from './summaries.controller';

@Module({
  imports: [JobsModule],
  controllers: [SummariesController],
})
export class SummariesModule {}
