"""Digest data stored out of line without compression (Postgres only): `RunDigest.encode` already
zstd-compresses it, so Postgres's own attempt (pglz, on every digest over the inline limit, tens of kB a
run) only costs the digest pass CPU and finds nothing to save, as blob data (migration 0005).

Existing rows keep their storage; the setting applies to digests written from now on.
"""

from django.db import migrations

FORWARDS = "ALTER TABLE experience_trajectorydigest ALTER COLUMN data SET STORAGE EXTERNAL"
BACKWARDS = "ALTER TABLE experience_trajectorydigest ALTER COLUMN data SET STORAGE EXTENDED"


def forwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(FORWARDS)


def backwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(BACKWARDS)


class Migration(migrations.Migration):
    dependencies = [
        ("experience", "0015_saved_filters_and_pair_queues"),
    ]

    operations = [migrations.RunPython(forwards, backwards)]
