"""Full-text search on the embedded (SQLite) store: an FTS5 index over each step's searchable text, kept in
sync by triggers (SQLite only; Postgres has StepSearch and its GIN index, migration 0002).

The index is contentless (content=''): it holds the tokens, not a second copy of every step's text, so a
delete or an update must hand FTS5 the old text again ('delete' command), computed by the same expression
from the old row. The text is what Postgres's documents hold (experience.services.search_index): the
preview and the inline texts, each capped. unicode61 splits on every non-alphanumeric character (so paths
and dotted names split as SEPARATORS does on Postgres), folds case and, like Postgres's 'simple'
configuration, keeps diacritics.

Beware: Django remakes a SQLite table to alter one of its columns, and dropping the old table drops these
triggers. experience.search_fts_guard runs TRIGGERS again (and FILL into an emptied index) after every
migrate that left one missing; it reads the statements from this module.
"""

from django.db import migrations


def _body(row: str) -> str:
    fields = [f"substr(coalesce({row}.preview, ''), 1, 1000)"] + [
        f"substr(coalesce(json_extract({row}.payload, '$.{key}'), ''), 1, 20000)"
        for key in ("command", "text", "output", "response_text", "tool_calls")]
    return " || ' ' || ".join(fields)


TABLE = ("CREATE VIRTUAL TABLE experience_step_fts USING fts5("
         "body, content='', tokenize='unicode61 remove_diacritics 0')")
TRIGGERS = [
    f"""CREATE TRIGGER experience_step_fts_insert AFTER INSERT ON experience_step BEGIN
        INSERT INTO experience_step_fts (rowid, body) VALUES (new.id, {_body('new')});
    END""",
    f"""CREATE TRIGGER experience_step_fts_delete AFTER DELETE ON experience_step BEGIN
        INSERT INTO experience_step_fts (experience_step_fts, rowid, body) VALUES ('delete', old.id, {_body('old')});
    END""",
    f"""CREATE TRIGGER experience_step_fts_update AFTER UPDATE OF preview, payload ON experience_step BEGIN
        INSERT INTO experience_step_fts (experience_step_fts, rowid, body) VALUES ('delete', old.id, {_body('old')});
        INSERT INTO experience_step_fts (rowid, body) VALUES (new.id, {_body('new')});
    END""",
]
DROP_TRIGGERS = [f"DROP TRIGGER IF EXISTS experience_step_fts_{event}" for event in ("insert", "delete", "update")]
FILL = f"INSERT INTO experience_step_fts (rowid, body) SELECT s.id, {_body('s')} FROM experience_step s"
FORWARDS = [TABLE, *TRIGGERS, FILL]
BACKWARDS = [*DROP_TRIGGERS, "DROP TABLE IF EXISTS experience_step_fts"]


def forwards(apps, schema_editor):
    if schema_editor.connection.vendor == "sqlite":
        for statement in FORWARDS:
            schema_editor.execute(statement)


def backwards(apps, schema_editor):
    if schema_editor.connection.vendor == "sqlite":
        for statement in BACKWARDS:
            schema_editor.execute(statement)


class Migration(migrations.Migration):

    dependencies = [
        ("experience", "0013_pairwise_preferences"),
    ]

    operations = [migrations.RunPython(forwards, backwards)]
