"""The embedded store's FTS5 step index after every migration: a scratch SQLite database migrated from zero
(as `make demo` makes one) has the index's triggers, and search follows a step inserted, edited and deleted.
A later migration that alters experience_step makes Django remake the table, which drops the triggers; the
post_migrate guard (experience.search_fts_guard) puts them back and refills the index.

Each test runs in a `manage.py` subprocess on its own SQLite file, so it runs in the Postgres suite too."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

PRELUDE = """
import json
from django.db import connection
from experience.models import Step
from experience.records import StepRecord, TrajectoryRecord
from experience.search import filters_from_params, trajectory_search
from experience.search_fts_guard import fts_trigger_names, fts_triggers_missing
from experience.services.ingest import steps_append, trajectories_ingest_many

def found(q):
    return sorted(trajectory_search(filters=filters_from_params({"q": q})).values_list("pk", flat=True))

def store(command):
    record = TrajectoryRecord(source="api", source_format="trove-test", source_ref=command, task_key="t",
                              instruction="Fix it.",
                              steps=[StepRecord(kind="command", command=command, output="ok", exit_code=0)])
    return trajectories_ingest_many(records=[record])[0].trajectory_id

def triggers():
    with connection.cursor() as cursor:
        cursor.execute("SELECT name FROM sqlite_master WHERE type = 'trigger' AND tbl_name = 'experience_step'")
        return sorted(row[0] for row in cursor.fetchall())

out = {}
"""

# Inserted, edited, deleted: search finds each state and nothing stale.
FOLLOWS = PRELUDE + """
out["triggers"], out["expected"], out["vendor"] = triggers(), sorted(fts_trigger_names()), connection.vendor
run = store("pytest tests/test_quokka.py")
out["inserted"] = found("quokka") == [run]
steps_append(trajectory_id=run, steps=[StepRecord(kind="command", command="make wombat", output="ok")])
out["appended"] = found("wombat") == [run]
Step.objects.filter(trajectory_id=run, seq=0).update(preview="pangolin", payload={"command": "pangolin"})
out["edited"] = found("pangolin") == [run] and found("quokka") == []
Step.objects.filter(trajectory_id=run, seq=1).delete()
out["deleted"] = found("wombat") == []
print(json.dumps(out))
"""

# What Django does for a migration that alters a column of experience_step on SQLite: remake the table. A step
# written before the guard runs is not indexed; migrate's post_migrate puts the triggers back and refills.
REMADE = PRELUDE + """
from django.core.management import call_command
before = store("cat capybara.txt")
field = Step._meta.get_field("preview")
wider = field.clone()
wider.set_attributes_from_name("preview")
wider.max_length = (field.max_length or 300) + 1
wider.model = Step
with connection.schema_editor() as editor:
    editor.alter_field(Step, field, wider)
out["after_remake"] = triggers()
gap = store("cat axolotl.txt")
out["gap_unindexed"] = found("axolotl") == []
call_command("migrate", verbosity=0)
out["after_migrate"], out["expected"] = triggers(), sorted(fts_trigger_names())
out["missing"] = fts_triggers_missing()
out["refilled"] = found("axolotl") == [gap] and found("capybara") == [before]
later = store("cat narwhal.txt")
out["inserted"] = found("narwhal") == [later]
Step.objects.filter(trajectory_id=later).update(preview="okapi", payload={"command": "okapi"})
out["edited"] = found("okapi") == [later] and found("narwhal") == []
Step.objects.filter(trajectory_id=gap).delete()
out["deleted"] = found("axolotl") == []
print(json.dumps(out))
"""


@pytest.fixture
def embedded_env(tmp_path) -> dict[str, str]:
    """The embedded default on a scratch var/, migrated from zero."""
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    env.update(TROVE_VAR_DIR=str(tmp_path / "var"), DJANGO_SETTINGS_MODULE="webapp.settings",
               SECRET_KEY="trove-test-secret")
    manage(env, "migrate", "--verbosity", "0")
    return env


def manage(env: dict[str, str], *args: str) -> str:
    result = subprocess.run([sys.executable, "manage.py", *args], cwd=REPO, env=env, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-4000:]
    return result.stdout


def run_script(env: dict[str, str], script: str) -> dict:
    return json.loads(manage(env, "shell", "-c", script).strip().splitlines()[-1])


def test_after_all_migrations_the_triggers_exist_and_search_follows_each_write(embedded_env):
    out = run_script(embedded_env, FOLLOWS)

    assert out["vendor"] == "sqlite" and len(out["expected"]) == 3
    assert out["triggers"] == out["expected"]
    assert (out["inserted"], out["appended"], out["edited"], out["deleted"]) == (True, True, True, True), out


def test_a_migration_that_remakes_the_step_table_gets_its_triggers_back_and_the_index_refilled(embedded_env):
    out = run_script(embedded_env, REMADE)

    assert out["after_remake"] == [], "the remake drops the triggers: the hazard this guards against"
    assert out["gap_unindexed"]
    assert out["after_migrate"] == out["expected"] and out["missing"] == []
    assert (out["refilled"], out["inserted"], out["edited"], out["deleted"]) == (True, True, True, True), out
