"""A run's digest goes stale when its steps change: triggers delete it (Postgres only; on SQLite, the
embedded demo, builds neither keep nor read digests).

Inserts and deletes are statement triggers over the changed rows (one DELETE per statement, however many
steps a COPY or bulk insert writes); an update is a row trigger, fired only when a column the digest is
derived from changes, so writing value estimates back to steps keeps the digests.
"""

from django.db import migrations

DERIVED_FROM = (
    "trajectory_id", "seq", "kind", "started_at", "ended_at", "duration_ms", "tokens_in", "tokens_out",
    "exit_code", "is_error", "call_id", "payload", "blob_refs",
)  # fmt: skip
_CHANGED = " OR ".join(f"OLD.{column} IS DISTINCT FROM NEW.{column}" for column in DERIVED_FROM)

FORWARDS = f"""
CREATE FUNCTION experience_digest_stale_rows() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM experience_trajectorydigest WHERE trajectory_id IN (SELECT DISTINCT trajectory_id FROM changed_steps);
    RETURN NULL;
END $$;
CREATE FUNCTION experience_digest_stale_row() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM experience_trajectorydigest WHERE trajectory_id IN (OLD.trajectory_id, NEW.trajectory_id);
    RETURN NULL;
END $$;
CREATE TRIGGER experience_step_digest_insert AFTER INSERT ON experience_step
    REFERENCING NEW TABLE AS changed_steps FOR EACH STATEMENT EXECUTE FUNCTION experience_digest_stale_rows();
CREATE TRIGGER experience_step_digest_delete AFTER DELETE ON experience_step
    REFERENCING OLD TABLE AS changed_steps FOR EACH STATEMENT EXECUTE FUNCTION experience_digest_stale_rows();
CREATE TRIGGER experience_step_digest_update AFTER UPDATE ON experience_step
    FOR EACH ROW WHEN ({_CHANGED}) EXECUTE FUNCTION experience_digest_stale_row();
"""
BACKWARDS = """
DROP TRIGGER IF EXISTS experience_step_digest_insert ON experience_step;
DROP TRIGGER IF EXISTS experience_step_digest_delete ON experience_step;
DROP TRIGGER IF EXISTS experience_step_digest_update ON experience_step;
DROP FUNCTION IF EXISTS experience_digest_stale_rows();
DROP FUNCTION IF EXISTS experience_digest_stale_row();
"""


def forwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(FORWARDS)


def backwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(BACKWARDS)


class Migration(migrations.Migration):

    dependencies = [
        ("experience", "0006_trajectory_digest"),
    ]

    operations = [migrations.RunPython(forwards, backwards)]
