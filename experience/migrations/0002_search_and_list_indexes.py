"""Search and the list pages.

- StepSearch: a step's full-text document (tsvector) with a GIN index (Postgres), filled off the ingest path
  by experience.services.search_index; Trajectory.search_indexed and a partial index on the runs waiting.
- Trajectory tags (Postgres): a GIN index (jsonb_path_ops) serving `tags @> '["x"]'`.
- B-tree indexes for the list filters (source, harness) and the import check (original_blob); Step's own
  trajectory_id index is dropped, since the unique (trajectory, seq) index serves those lookups.

SQLite (the embedded default) gets the B-tree indexes only; search there falls back to substring matching.
"""

import django.db.models.deletion
import experience.models
from django.db import migrations, models

POSTGRES_INDEXES = [
    ("stepsearch_document_gin",
     "CREATE INDEX IF NOT EXISTS stepsearch_document_gin ON experience_stepsearch USING GIN (document)"),
    ("trajectory_tags_gin",
     "CREATE INDEX IF NOT EXISTS trajectory_tags_gin ON experience_trajectory USING GIN (tags jsonb_path_ops)"),
]


def create_postgres_indexes(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    for _, statement in POSTGRES_INDEXES:
        schema_editor.execute(statement)


def drop_postgres_indexes(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    for name, _ in POSTGRES_INDEXES:
        schema_editor.execute(f"DROP INDEX IF EXISTS {name}")


class Migration(migrations.Migration):

    dependencies = [
        ('experience', '0001_initial'),
    ]

    operations = [
        migrations.CreateModel(
            name='StepSearch',
            fields=[
                ('step_id', models.BigIntegerField(primary_key=True, serialize=False)),
                ('document', experience.models.TsVectorField()),
            ],
        ),
        migrations.AddField(
            model_name='trajectory',
            name='search_indexed',
            field=models.BooleanField(default=False),
        ),
        migrations.AlterField(
            model_name='step',
            name='trajectory',
            field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='steps', to='experience.trajectory'),
        ),
        migrations.AddIndex(
            model_name='trajectory',
            index=models.Index(fields=['source', 'source_format'], name='trajectory_source_idx'),
        ),
        migrations.AddIndex(
            model_name='trajectory',
            index=models.Index(fields=['harness'], name='trajectory_harness_idx'),
        ),
        migrations.AddIndex(
            model_name='trajectory',
            index=models.Index(fields=['original_blob'], name='trajectory_original_idx'),
        ),
        migrations.AddIndex(
            model_name='trajectory',
            index=models.Index(condition=models.Q(('search_indexed', False)), fields=['id'], name='trajectory_unindexed_idx'),
        ),
        migrations.AddField(
            model_name='stepsearch',
            name='trajectory',
            field=models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='+', to='experience.trajectory'),
        ),
        migrations.RunPython(create_postgres_indexes, drop_postgres_indexes),
    ]
