import { Column, CreateDateColumn, Entity, PrimaryColumn } from 'typeorm';

@Entity({ name: 'summaries' })
export class Summary {
  @PrimaryColumn({ name: 'job_id', type: 'uuid' })
  jobId!: string;

  @Column({ type: 'text' })
  tenant!: string;

  @Column({ type: 'text' })
  summary!: string;

  @CreateDateColumn({ name: 'created_at', type: 'timestamptz' })
  createdAt!: Date;
}
