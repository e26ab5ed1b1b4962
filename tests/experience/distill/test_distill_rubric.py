from pathlib import Path

import pytest
from distill_factories import SWE_AGENT_FIXTURES, broken_fix, careful_fix, command, message, record

from experience.distill.rubric import (
    LABELS,
    NO_EVENTS,
    RubricState,
    StepEvents,
    Write,
    per_step_labels,
    rubric,
    run_labels,
)
from experience.distill.rubric import TestRun as Run  # not `Test*`: pytest would collect it
from experience.importers.swe_agent import parse
from experience.records import StepRecord


def true_labels(labels):
    return {name for name, value in labels.items() if value}


def test_a_careful_run_earns_every_good_label():
    labels = run_labels(record(careful_fix()))

    assert true_labels(labels) == {
        "wrote_repro_test",
        "ran_repro_before_fix",
        "edited_source",
        "reran_tests_after_edit",
        "verified_fix",
        "ran_wider_suite",
    }


def test_labels_are_cumulative_and_never_look_ahead():
    steps = per_step_labels(record(careful_fix()))

    # 0 create repro, 1 write it, 2 run it (fails), 3 open, 4 edit source, 5 repro passes, 6 pytest
    assert [s["wrote_repro_test"] for s in steps] == [True] * 7
    assert [s["ran_repro_before_fix"] for s in steps] == [False, False, True, True, True, True, True]
    assert [s["edited_source"] for s in steps] == [False] * 4 + [True] * 3
    assert [s["verified_fix"] for s in steps] == [False] * 5 + [True] * 2
    assert [s["ran_wider_suite"] for s in steps] == [False] * 6 + [True]


def test_a_fix_is_unverified_again_after_a_later_edit_until_tests_pass():
    steps = per_step_labels(record(broken_fix()))

    # 2 edit, 3 repro passes, 4 edit again, 5 tests fail
    assert [s["verified_fix"] for s in steps] == [False, False, False, True, False, False, False]
    assert steps[-1]["reran_tests_after_edit"] and not steps[-1]["ran_wider_suite"]


def test_editing_before_running_anything_misses_ran_repro_before_fix():
    labels = run_labels(
        record(
            [
                command("sed -i 's/a/b/' src/dates.py"),
                command("pytest tests/test_dates.py", "4 passed", 0),
            ]
        )
    )

    assert not labels["ran_repro_before_fix"]
    assert labels["verified_fix"]


def test_a_run_that_only_touches_tests_is_flagged():
    labels = run_labels(
        record(
            [
                command("sed -i 's/assert x == 2/assert x == 3/' tests/test_dates.py"),
                command("python -m pytest tests/test_dates.py", "1 passed", 0),
            ]
        )
    )

    assert labels["edited_only_tests"]
    assert not labels["edited_source"] and not labels["verified_fix"]


def test_refused_interface_edits_do_not_count_as_edits():
    refused = "Your proposed edit has introduced new syntax error(s). Please understand the fixes and retry"
    labels = run_labels(
        record(
            [
                command("open src/dates.py", "[File: /r/src/dates.py (9 lines total)]"),
                command("edit 1:1\n)\nend_of_edit", refused),
            ]
        )
    )

    assert not labels["edited_source"]


def test_running_a_project_file_is_not_a_test_run_but_running_a_created_reproduction_is():
    created = run_labels(
        record(
            [
                command("cat > reproduce_dates.py <<'EOF'\nimport dates\nEOF"),
                command("python reproduce_dates.py", "ok"),
            ]
        )
    )
    scratch = run_labels(
        record([command("cat > solve.py <<'EOF'\nprint(1)\nEOF"), command("python solve.py", "1")])
    )
    project = run_labels(record([command("python setup.py develop", "ok")]))

    assert created["wrote_repro_test"] and created["ran_repro_before_fix"]
    assert not any(scratch.values())  # a new file named like neither a test nor a repro: scratch
    assert not project["ran_repro_before_fix"]


def test_structured_tool_calls_and_their_observations_are_read():
    call = {
        "id": "c1",
        "type": "function",
        "function": {"name": "execute_bash", "arguments": '{"command": "pytest"}'},
    }
    edit = {
        "id": "c0",
        "type": "function",
        "function": {
            "name": "str_replace_editor",
            "arguments": '{"command": "str_replace", "path": "/w/src/a.py"}',
        },
    }
    labels = run_labels(
        record(
            [
                StepRecord(
                    kind="tool_call", tool_calls=[edit], output="The file /w/src/a.py has been edited."
                ),
                StepRecord(kind="tool_call", tool_calls=[call]),
                StepRecord(kind="observation", text="=== 40 passed in 2.0s ==="),
            ]
        )
    )

    assert labels["edited_source"] and labels["verified_fix"] and labels["ran_wider_suite"]


def test_errors_and_test_runs_are_counted_in_the_state():
    state = rubric(record(broken_fix())).final_state

    assert (state.test_runs, state.passed_test_runs, state.source_edits) == (3, 1, 2)
    assert state.errors == 2


def pytest_call() -> dict:
    return {
        "id": "c1",
        "type": "function",
        "function": {"name": "bash", "arguments": '{"command": "pytest"}'},
    }


@pytest.mark.parametrize(
    ("steps", "test_runs"),
    [
        # The call's action step records the run: its tool calls are not a second one.
        ([StepRecord(kind="model_call", tool_calls=[pytest_call()]), command("pytest", "1 passed")], 1),
        # No action step (a proxy-only recording): the call's tool calls are the action.
        ([StepRecord(kind="model_call", tool_calls=[pytest_call()])], 1),
        (
            [
                StepRecord(kind="model_call", tool_calls=[pytest_call()]),
                StepRecord(kind="observation", text="1 passed"),
                StepRecord(kind="model_call", response_text="done"),
            ],
            1,
        ),
        (
            [
                StepRecord(kind="model_call", tool_calls=[pytest_call()]),
                message("user", "go on"),
                command("ls"),
            ],
            0,
        ),
        # A failed call decided nothing, whatever it carries.
        ([StepRecord(kind="model_call", tool_calls=[pytest_call()], is_error=True)], 0),
    ],
)
def test_a_model_calls_tool_calls_are_its_action_only_when_no_action_step_follows(steps, test_runs):
    assert rubric(record(steps)).final_state.test_runs == test_runs


def test_steps_that_change_nothing_share_the_empty_events_and_the_state_before_them():
    scored = rubric(record([command("ls", "a.py"), command("pytest", "1 passed"), command("cat a.py", "x")]))

    assert scored.events[0] is NO_EVENTS and scored.events[2] is NO_EVENTS
    assert scored.states[0] == RubricState()
    assert scored.states[2] is scored.states[1] and scored.states[1].test_runs == 1


def test_a_step_folds_its_writes_before_its_test_runs():
    state = RubricState().fold(
        StepEvents(
            writes=(
                Write("src/a.py", "source"),
                Write("tests/test_a.py", "test"),
                Write("src/b.py", "source"),
            ),
            test_runs=(Run("pytest", wide=False, passed=False), Run("pytest", wide=True, passed=True)),
            error=True,
        )
    )

    assert state == RubricState(
        wrote_test_or_repro=True,
        test_file_writes=1,
        source_edits=2,
        test_runs=2,
        passed_test_runs=1,
        errors=1,
        tested_before_first_edit=False,
        tested_since_first_edit=True,
        passed_since_last_edit=True,
        wide_run=True,
    )
    # A later source edit unverifies the fix; a run before any edit counts as a reproduction.
    assert not state.fold(StepEvents(writes=(Write("src/c.py", "source"),))).passed_since_last_edit
    assert RubricState().fold(StepEvents(test_runs=(Run("script", False, None),))).tested_before_first_edit


def label_changes_step_by_step(scored):
    """The reference: each label's final value and the last step whose labels before and after differ."""
    changes = []
    for name in LABELS:
        changed = [
            i
            for i in range(len(scored.states))
            if scored.labels_before(i)[name] != scored.labels_after(i)[name]
        ]
        changes.append((name, scored.run_labels[name], changed[-1] if changed else None))
    return changes


@pytest.mark.parametrize("steps", [careful_fix(), broken_fix(), [], [command("ls")]])
def test_label_changes_give_each_labels_final_value_and_the_step_it_last_changed_at(steps):
    scored = rubric(record(steps))

    assert scored.label_changes() == label_changes_step_by_step(scored)


def test_label_changes_on_a_fix_that_is_verified_then_broken():
    changes = {name: (value, at) for name, value, at in rubric(record(broken_fix())).label_changes()}

    # 2 edit, 3 repro passes (verified), 4 edit again (unverified), 5 tests fail
    assert changes["verified_fix"] == (False, 4)
    assert changes["edited_source"] == (True, 2)
    assert changes["ran_repro_before_fix"] == (True, 1)
    assert changes["ran_wider_suite"] == (False, None)


# --- the real SWE-agent runs --------------------------------------------------------------------------

FIX_AND_VERIFY = {
    "wrote_repro_test",
    "ran_repro_before_fix",
    "edited_source",
    "reran_tests_after_edit",
    "verified_fix",
}
# CTF solvers (decrypt.py, solve.py, exploit.py) are scratch files: neither reproductions nor source.
SCRIPTS: set[str] = set()
# The test repo keeps its buggy code in tests/missing_colon.py, which the issue names: the edit is a
# source edit, and running the script (under tests/) after it is the passing rerun.
TEST_FILE_ONLY = {"edited_source", "reran_tests_after_edit", "verified_fix"}
EXPECTED = {
    "6e44b9__sweagenttestrepo-1c2844.traj": TEST_FILE_ONLY,
    "swe-agent__test-repo-i1.traj": TEST_FILE_ONLY,
    "function_calling_simple.traj": TEST_FILE_ONLY,
    "pydicom__pydicom-1458.traj": FIX_AND_VERIFY,
    "marshmallow-code__marshmallow-1867.traj": FIX_AND_VERIFY,
    # HumanEvalFix runs main.py, a project file: an edit, but no recognisable test run.
    "humanevalfix-python-0.traj": {"edited_source"},
    "BabyEncryption.traj": SCRIPTS,
    "katy.traj": SCRIPTS,
    "warmup.traj": SCRIPTS,
    "rock.traj": SCRIPTS,
    "i_got_id_demo.traj": set(),  # wrote a scratch script it uploaded
    "BabyTimeCapsule.traj": set(),
    "eps.traj": set(),
    "flash.traj": set(),
    "networking_1.traj": set(),
}
FIXTURES = sorted(SWE_AGENT_FIXTURES.rglob("*.traj"))


def test_every_swe_agent_fixture_has_an_expectation():
    assert len(FIXTURES) == 22
    assert {path.name for path in FIXTURES} == set(EXPECTED)


@pytest.mark.parametrize("path", FIXTURES, ids=lambda path: f"{path.parent.name[:30]}/{path.name}")
def test_real_swe_agent_runs_get_the_labels_their_commands_earn(path: Path):
    (imported,) = parse(path)

    assert true_labels(run_labels(imported)) == EXPECTED[path.name]
    assert set(run_labels(imported)) == set(LABELS)
    scored = rubric(imported)
    assert scored.label_changes() == label_changes_step_by_step(scored)


def test_pydicom_counts_only_the_edit_that_passed_the_syntax_check_and_is_verified_by_the_rerun():
    (path,) = [p for p in FIXTURES if p.name == "pydicom__pydicom-1458.traj"]
    (imported,) = parse(path)
    labels = per_step_labels(imported)
    entry_of = {
        i: s.payload.get("trajectory_index") for i, s in enumerate(imported.steps) if s.kind == "command"
    }
    by_entry = {entry: labels[i] for i, entry in entry_of.items()}

    # entries 5-7 are edits refused by the syntax check, 8 the applied edit, 9 the passing rerun
    assert [by_entry[e]["edited_source"] for e in (5, 6, 7, 8)] == [False, False, False, True]
    assert [by_entry[e]["verified_fix"] for e in (8, 9)] == [False, True]
    assert by_entry[2]["ran_repro_before_fix"] and not by_entry[1]["ran_repro_before_fix"]


def test_marshmallow_variants_agree_whatever_the_tool_configuration():
    variants = [p for p in FIXTURES if p.name == "marshmallow-code__marshmallow-1867.traj"]
    first_edits = set()
    for path in variants:
        (imported,) = parse(path)
        labels = per_step_labels(imported)
        first_edits.add(
            next(
                imported.steps[i].command.split()[0] for i, step in enumerate(labels) if step["edited_source"]
            )
        )

    assert len(variants) == 8
    assert first_edits == {"edit"}
