"""How Postgres stores the large columns of the bulk tables (Postgres only; SQLite has no such settings).

- Step payload and blob_refs: lz4 instead of the default pglz when a row outgrows a page's inline limit. A
  long run's model calls carry long blob_refs lists, and pglz was a large part of writing such rows; lz4
  compresses about as well at a fraction of the CPU.
- Blob data: stored out of line without compression (STORAGE EXTERNAL). Blobs over 512 bytes are already
  zstd-compressed by the store (experience.services.blobs), so a second compression attempt is pure cost.

Existing rows keep their storage; the settings apply to rows written from now on.
"""

from django.db import migrations

STATEMENTS = [
    ("ALTER TABLE experience_step ALTER COLUMN payload SET COMPRESSION lz4, "
     "ALTER COLUMN blob_refs SET COMPRESSION lz4",
     "ALTER TABLE experience_step ALTER COLUMN payload SET COMPRESSION default, "
     "ALTER COLUMN blob_refs SET COMPRESSION default"),
    ("ALTER TABLE experience_blob ALTER COLUMN data SET STORAGE EXTERNAL",
     "ALTER TABLE experience_blob ALTER COLUMN data SET STORAGE EXTENDED"),
]


def forwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        for statement, _ in STATEMENTS:
            schema_editor.execute(statement)


def backwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        for _, statement in STATEMENTS:
            schema_editor.execute(statement)


class Migration(migrations.Migration):

    dependencies = [
        ('experience', '0004_trajectory_verbose_name'),
    ]

    operations = [
        migrations.RunPython(forwards, backwards),
    ]
