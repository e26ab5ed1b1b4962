from distill_factories import TASK, broken_fix, careful_fix, command, record, source_run

from experience.distill.credit import first_harmful_step, sft_rows
from experience.distill.spec import DatasetSpec


def assistant_weights(messages):
    return [(m["content"], m["weight"]) for m in messages if m["role"] == "assistant"]


def test_the_harmful_step_is_the_first_change_after_the_last_passing_test():
    # 2 edit, 3 repro passes, 4 edit (never followed by a pass), 5 tests fail
    assert first_harmful_step(record(broken_fix(), success=False)) == 4


def test_a_verified_but_wrong_fix_is_harmful_from_its_first_change():
    steps = careful_fix()  # verified by its own tests, yet the task's evaluation failed

    assert first_harmful_step(record(steps, success=False)) == 4


def test_a_run_that_never_changed_anything_is_harmful_only_at_its_end():
    steps = [command("ls", "src"), command("cat src/dates.py", "..."), command("submit", "")]

    assert first_harmful_step(record(steps, success=False)) == 2


def test_rewriting_an_existing_test_is_a_change_but_a_new_repro_script_is_not():
    steps = [
        command("cat > reproduce.py <<'EOF'\nimport dates\nEOF"),
        command("python reproduce.py", "Traceback (most recent call last):\nValueError", 1),
        command("sed -i 's/== 2/== 3/' tests/test_dates.py"),
        command("submit"),
    ]

    assert first_harmful_step(record(steps, success=False)) == 2
    assert first_harmful_step(record(steps, success=True)) is None


def test_truncate_mode_keeps_a_failed_run_up_to_its_harmful_decision():
    run = source_run("bad", broken_fix(), success=False)

    (row,) = sft_rows([run], DatasetSpec(kind="sft", sft_mode="truncate"))

    assert row["messages"] == [
        {"role": "user", "content": TASK},
        {"role": "assistant", "content": "cat src/dates.py", "weight": 1},
        {"role": "user", "content": "def parse_date(text): ..."},
        {"role": "assistant", "content": "python reproduce_issue.py", "weight": 1},
        {"role": "user", "content": "Traceback (most recent call last):\nValueError: bad"},
        {"role": "assistant", "content": "sed -i 's/strict=True/strict=False/' src/dates.py", "weight": 1},
        {"role": "user", "content": ""},
        {"role": "assistant", "content": "python reproduce_issue.py", "weight": 1},
    ]
    assert (row["harmful_step"], row["harmful_decision"], row["trained_turns"]) == (4, 5, 4)
    assert row["outcome"] is False


def test_mask_mode_keeps_the_whole_failed_run_with_zero_weight_from_the_harmful_decision():
    run = source_run("bad", broken_fix(), success=False)

    (row,) = sft_rows([run], DatasetSpec(kind="sft", sft_mode="mask"))

    assert assistant_weights(row["messages"]) == [
        ("cat src/dates.py", 1),
        ("python reproduce_issue.py", 1),
        ("sed -i 's/strict=True/strict=False/' src/dates.py", 1),
        ("python reproduce_issue.py", 1),
        ("sed -i 's/return d/return None/' src/dates.py", 0),
        ("pytest tests/test_dates.py", 0),
        ("submit", 0),
    ]
    assert len(row["messages"]) == 1 + 2 * 7
    assert row["messages"][-1] == {"role": "user", "content": "diff --git a/src/dates.py b/src/dates.py"}


def test_successful_runs_are_kept_whole_and_fully_trained():
    (row,) = sft_rows(
        [source_run("ok", careful_fix(), success=True)], DatasetSpec(kind="sft", sft_mode="truncate")
    )

    assert [weight for _, weight in assistant_weights(row["messages"])] == [1] * 7
    assert row["harmful_step"] is None


def test_a_failed_run_harmful_from_its_first_decision_gives_no_row():
    steps = [command("sed -i 's/a/b/' src/dates.py"), command("pytest", "2 failed", 1)]

    assert list(sft_rows([source_run("bad", steps, success=False)], DatasetSpec(kind="sft"))) == []
    assert (
        list(sft_rows([source_run("bad", steps, success=False)], DatasetSpec(kind="sft", sft_mode="mask")))
        == []
    )
