"""Indexes for search and the list pages.

- Step full-text search (Postgres): a GIN index on an expression over the step's searchable columns (the
  preview and the inline texts of its payload), so no extra column is stored or written at ingest and COPY
  fills the index as it goes. The expression must stay identical to experience.search.STEP_SEARCH_DOCUMENT,
  or queries stop using the index. Each part is capped so a huge inline command cannot overflow a tsvector.
- Trajectory tags (Postgres): a GIN index (jsonb_path_ops) serving `tags @> '["x"]'`.
- B-tree indexes for the list filters (source, harness); Step's own trajectory_id index is dropped, since the
  unique (trajectory, seq) index serves those lookups.

SQLite (the embedded default) gets the B-tree indexes only; search there falls back to substring matching.
"""

import django.db.models.deletion
from django.db import migrations, models

STEP_SEARCH_DOCUMENT = (
    "to_tsvector('simple'::regconfig, "
    "left(coalesce(preview, ''), 1000) || ' ' || "
    "left(coalesce(payload ->> 'command', ''), 20000) || ' ' || "
    "left(coalesce(payload ->> 'text', ''), 20000) || ' ' || "
    "left(coalesce(payload ->> 'output', ''), 20000) || ' ' || "
    "left(coalesce(payload ->> 'response_text', ''), 20000) || ' ' || "
    "left(coalesce(payload ->> 'tool_calls', ''), 20000))"
)

POSTGRES_INDEXES = [
    ("step_search_gin", f"CREATE INDEX IF NOT EXISTS step_search_gin ON experience_step USING GIN (({STEP_SEARCH_DOCUMENT}))"),
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
        migrations.RunPython(create_postgres_indexes, drop_postgres_indexes),
    ]
