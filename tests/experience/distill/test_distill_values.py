import pytest
from distill_factories import TASK, broken_fix, careful_fix, command, message, model_call, record, source_run

from experience.distill import chat
from experience.distill.decisions import decision_points
from experience.distill.source import SourceRun
from experience.distill.spec import DatasetSpec
from experience.distill.values import outcome_rows, target_value, value_rows
from experience.records import MessageRecord, StepRecord


def test_targets_discount_the_return_by_the_decisions_left():
    run = source_run("r1", careful_fix()[:3], success=True)

    rows = list(value_rows([run], DatasetSpec(kind="value", gamma=0.5)))

    # T = 3 decisions; t = 1..3 gets 0.5 ** (3 - t) * 1
    assert [row["step_index"] for row in rows] == [1, 2, 3]
    assert [row["target_value"] for row in rows] == [0.25, 0.5, 1.0]
    assert {row["step_count"] for row in rows} == {3}
    assert all(row["outcome"] is True for row in rows)


def test_a_recorded_reward_is_the_return_and_a_failure_is_worth_nothing():
    graded = source_run("r1", careful_fix()[:2], success=True, reward=0.8)
    failed = source_run("r2", careful_fix()[:2], success=False)

    graded_rows = list(value_rows([graded], DatasetSpec(kind="value", gamma=0.9)))
    failed_rows = list(value_rows([failed], DatasetSpec(kind="value", gamma=0.9)))

    assert [row["target_value"] for row in graded_rows] == pytest.approx([0.72, 0.8])
    assert [row["target_value"] for row in failed_rows] == [0.0, 0.0]
    assert target_value(2.0, 1, 1, 0.5) == 2.0
    with pytest.raises(ValueError):
        target_value(1.0, 0, 3, 0.9)


def test_a_model_call_and_the_commands_it_led_to_are_one_decision():
    steps = [
        message("system", "You are a careful engineer."),
        message("user", TASK),
        model_call("I will look first.\n```\nls\n```"),
        command("ls", "src tests"),
        model_call("Running two things.", tokens_in=50),
        command("cat src/dates.py", "def parse_date(): ..."),
        command("pytest", "3 passed"),
        StepRecord(kind="model_call", is_error=True),
        model_call("Done."),
    ]

    decisions = decision_points(record(steps))

    assert [(d.t, d.model_call, d.actions) for d in decisions] == [(1, 2, (3,)), (2, 4, (5, 6)), (3, 8, ())]


def test_the_context_is_the_recorded_request_when_there_is_one_else_the_rebuilt_chat():
    request = [MessageRecord("system", "sys"), MessageRecord("user", TASK), MessageRecord("assistant", "ls")]
    steps = [
        message("system", "sys"),
        message("user", TASK),
        model_call("ls"),
        command("ls", "src tests"),
        model_call("cat src/dates.py", request=request),
        command("cat src/dates.py", "def parse_date(): ..."),
    ]
    run = source_run("r1", steps)

    first, second = value_rows([run], DatasetSpec(kind="value"))

    assert first["messages"] == [{"role": "system", "content": "sys"}, {"role": "user", "content": TASK}]
    assert first["action"] == {"role": "assistant", "content": "ls"}
    assert second["messages"] == [m.as_openai() for m in request]
    assert second["action"] == {"role": "assistant", "content": "cat src/dates.py"}


def test_a_rebuilt_context_replays_actions_and_outputs_and_starts_with_the_task():
    run = source_run("r1", careful_fix()[:3])

    rows = list(value_rows([run], DatasetSpec(kind="value")))

    assert rows[0]["messages"] == [{"role": "user", "content": TASK}]
    assert rows[2]["messages"][1:] == [
        {"role": "assistant", "content": "create reproduce.py"},
        {"role": "user", "content": "[File: /repo/reproduce.py (1 lines total)]"},
        {"role": "assistant", "content": careful_fix()[1].command},
        {"role": "user", "content": "[File: /repo/reproduce.py (2 lines total)]"},
    ]
    assert rows[2]["action"] == {"role": "assistant", "content": "python reproduce.py"}


def test_truncation_drops_the_oldest_turns_but_keeps_the_system_prompt_and_the_task():
    demo = "DEMONSTRATION " + "d" * 4000
    steps = [message("system", "s" * 400), message("user", demo), message("user", TASK)]
    for n in range(30):
        steps.append(command(f"cat file_{n}.py", "x" * 400))
    run = source_run("r1", steps)

    last = list(value_rows([run], DatasetSpec(kind="value", context_budget_tokens=1000)))[-1]
    messages = last["messages"]

    assert messages[0] == {"role": "system", "content": "s" * 400}
    assert messages[1] == {"role": "user", "content": TASK}
    assert all(m["content"] != demo for m in messages)
    assert messages[-1] == {"role": "user", "content": "x" * 400}  # the latest output is kept
    assert messages[-2] == {"role": "assistant", "content": "cat file_28.py"}
    assert last["stats"]["context_tokens"] <= 1000
    assert last["stats"]["context_dropped"] > 40


def test_the_task_is_kept_even_when_it_alone_is_over_budget():
    messages = [{"role": "user", "content": TASK * 100}, {"role": "assistant", "content": "ls"}]

    cut = chat.truncate(messages, 10, instruction=TASK)

    assert cut.messages == [messages[0]]
    assert cut.dropped == 1


def test_truncation_never_leaves_a_tool_answer_without_its_call():
    messages = [
        {"role": "user", "content": TASK},
        {"role": "assistant", "content": "a" * 400, "tool_calls": [{"id": "1"}]},
        {"role": "tool", "tool_call_id": "1", "content": "ok"},
        {"role": "assistant", "content": "b"},
    ]

    cut = chat.truncate(messages, 30, instruction=TASK)

    assert [m["role"] for m in cut.messages] == ["user", "assistant"]
    assert cut.messages[-1]["content"] == "b"


def test_a_recorded_prompt_token_count_replaces_the_character_estimate():
    messages = [{"role": "user", "content": "a" * 400}, {"role": "user", "content": "b" * 400}]

    assert chat.token_counts(messages) == [100, 100]
    assert chat.token_counts(messages, known_total=1000) == [500, 500]


def test_value_rows_carry_the_rubric_before_the_action_and_counts_so_far():
    rows = list(value_rows([source_run("r1", careful_fix())], DatasetSpec(kind="value")))

    before_verify = rows[5]  # decision 6 is the repro rerun that verifies the fix
    assert before_verify["rubric"]["edited_source"] and not before_verify["rubric"]["verified_fix"]
    assert rows[6]["rubric"]["verified_fix"]
    assert before_verify["stats"]["errors_before"] == 1
    assert before_verify["stats"]["actions_before"] == 5
    assert before_verify["record_step"] == 5


def test_outcome_rows_are_one_per_run_with_the_whole_conversation():
    runs = [source_run("ok", careful_fix(), success=True), source_run("bad", broken_fix(), success=False)]

    rows = list(outcome_rows(runs, DatasetSpec(kind="outcome")))

    assert [(row["trajectory_id"], row["outcome"]) for row in rows] == [("ok", True), ("bad", False)]
    assert len(rows[0]["messages"]) == 1 + 2 * 7
    assert rows[0]["rubric"]["verified_fix"] and not rows[1]["rubric"]["verified_fix"]


def test_duplicates_rejected_and_unusable_runs_are_left_out_by_default():
    runs = [
        source_run("kept", careful_fix()),
        source_run("dup", careful_fix(), is_duplicate=True),
        source_run("rejected", careful_fix(), curation="rejected"),
        source_run("accepted", careful_fix(), curation="accepted"),
        source_run("infra", careful_fix(), status="infra_error"),
        source_run("unlabelled", careful_fix(), success=None),
    ]

    default = {row["trajectory_id"] for row in outcome_rows(runs, DatasetSpec(kind="outcome"))}
    widened = {
        row["trajectory_id"]
        for row in outcome_rows(
            runs, DatasetSpec(kind="outcome", include_duplicates=True, include_rejected=True)
        )
    }

    assert default == {"kept", "accepted"}
    assert widened == {"kept", "dup", "rejected", "accepted"}


def test_negatives_are_capped_per_task_deterministically():
    runs = [source_run(f"win-{n}", careful_fix(), task_key="t1", success=True) for n in range(2)]
    runs += [source_run(f"loss-{n}", broken_fix(), task_key="t1", success=False) for n in range(9)]
    runs += [source_run(f"hard-{n}", broken_fix(), task_key="t2", success=False) for n in range(5)]
    spec = DatasetSpec(kind="outcome", neg_pos_ratio=1.5)

    kept = [row["trajectory_id"] for row in outcome_rows(runs, spec)]
    again = [row["trajectory_id"] for row in outcome_rows(list(runs), spec)]

    t1 = [tid for tid in kept if not tid.startswith("hard")]
    assert sum(tid.startswith("win") for tid in t1) == 2
    assert sum(tid.startswith("loss") for tid in t1) == 3  # ceil(1.5 * 2)
    assert sum(tid.startswith("hard") for tid in kept) == 2  # unsolved task: ceil(1.5 * 1)
    assert kept == again


def test_a_run_without_decisions_gives_no_rows():
    empty = SourceRun("e", record([message("user", TASK)]))

    assert list(value_rows([empty], DatasetSpec(kind="value"))) == []
    assert list(outcome_rows([empty], DatasetSpec(kind="outcome"))) == []


def test_a_task_missing_from_the_steps_goes_after_the_system_prompt():
    run = source_run("r1", [message("system", "You are careful."), command("ls", "src")])

    (row,) = value_rows([run], DatasetSpec(kind="value"))

    assert row["messages"] == [
        {"role": "system", "content": "You are careful."},
        {"role": "user", "content": TASK},
    ]


def _contexts_of_a_growing_run():
    """Contexts as a run's model calls see them: each the previous one plus a reply and an output, the
    messages shared between contexts; then one that is not an extension (a harness that rewrote it)."""
    system, task = {"role": "system", "content": "s" * 400}, {"role": "user", "content": "Task: " + TASK}
    context, contexts = [system, {"role": "user", "content": "demo " * 300}, task], []
    for n in range(12):
        call = {"role": "assistant", "content": f"run {n}", "tool_calls": [{"id": f"c{n}"}]}
        context = context + [call, {"role": "tool", "tool_call_id": f"c{n}", "content": "o" * (100 + 40 * n)}]
        contexts.append(context)
    contexts.append([system, task] + contexts[-1][-4:])
    return contexts


@pytest.mark.parametrize("known_total", [None, 2500])
@pytest.mark.parametrize("budget", [10_000, 700, 300, 50])
def test_truncating_with_per_run_message_facts_gives_what_truncating_each_context_alone_gives(
    budget, known_total
):
    facts = chat.MessageFacts()

    for context in _contexts_of_a_growing_run():
        shared = chat.truncate(context, budget, instruction=TASK, known_total=known_total, facts=facts)
        alone = chat.truncate(context, budget, instruction=TASK, known_total=known_total)

        assert shared == alone
        assert chat.token_counts(context, known_total, facts) == chat.token_counts(context, known_total)
        assert (
            chat.task_index(context, TASK, facts=facts)
            == chat.task_index(context, TASK)
            == (context.index(next(m for m in context if m["content"] == "Task: " + TASK)))
        )


def test_the_value_rows_of_a_run_are_those_of_each_context_truncated_alone():
    request = [MessageRecord("system", "s" * 200), MessageRecord("user", TASK)]
    steps = []
    for n in range(8):
        steps += [
            model_call(f"step {n}", list(request), tokens_in=60 * (n + 2)),
            command(f"cat f{n}.py", "x" * 300),
        ]
        request += [MessageRecord("assistant", f"step {n}"), MessageRecord("user", "x" * 300)]
    spec = DatasetSpec(kind="value", context_budget_tokens=300)

    rows = list(value_rows([source_run("r1", steps)], spec))

    assert len(rows) == 8 and rows[-1]["stats"]["context_dropped"] > 0  # the budget cut the late contexts
    assert_each_row_is_its_context_cut_alone(rows, steps[::2], 300)


def test_the_rows_of_a_run_share_their_context_messages_and_its_rubric_is_made_once():
    request = [MessageRecord("system", "s"), MessageRecord("user", TASK)]
    steps = []
    for n in range(3):
        steps += [model_call(f"step {n}", list(request)), command(f"cat f{n}.py", "x")]
        request += [MessageRecord("assistant", f"step {n}"), MessageRecord("user", "x")]
    run = source_run("r1", steps)

    rows = list(value_rows([run], DatasetSpec(kind="value")))

    assert rows[1]["messages"][0] is rows[2]["messages"][0]  # one dict per message record and run
    assert run.scored is run.scored


def _growing(*steps):
    """Contexts that each extend the one before by the given messages (shared objects)."""
    context, contexts = [], []
    for added in steps:
        context = context + list(added)
        contexts.append(context)
    return contexts


_SYSTEM = {"role": "system", "content": "s" * 40}
_TASK_MESSAGE = {"role": "user", "content": TASK}
_GROWING_CASES = {
    # A tool answer right after the task: truncation drops it even within the budget.
    "tool_after_task": _growing([_SYSTEM, _TASK_MESSAGE], [{"role": "tool", "content": "o" * 40}], [_SYSTEM]),
    # The task shows up only in a later context: the search resumes over the added messages.
    "task_comes_later": _growing(
        [_SYSTEM, {"role": "user", "content": "a demonstration"}],
        [{"role": "assistant", "content": "ok"}],
        [_TASK_MESSAGE, {"role": "tool", "content": "o"}],
        [{"role": "assistant", "content": "done"}],
    ),
    # No user message at first, then a system message after the start, then the first user message.
    "late_users": _growing(
        [{"role": "assistant", "content": "hello"}],
        [{"role": "system", "content": "late system"}],
        [{"role": "user", "content": "not the task"}, {"role": "tool", "content": "x" * 80}],
    ),
    "system_only_then_tool": _growing([_SYSTEM], [{"role": "tool", "content": "t"}], [_TASK_MESSAGE]),
}


@pytest.mark.parametrize("known_total", [None, 37])
@pytest.mark.parametrize("budget", [10_000, 30, 0])
@pytest.mark.parametrize("case", sorted(_GROWING_CASES))
def test_a_growing_context_is_truncated_as_each_context_alone(case, budget, known_total):
    facts = chat.MessageFacts()

    for context in _GROWING_CASES[case]:
        shared = chat.truncate(context, budget, instruction=TASK, known_total=known_total, facts=facts)
        alone = chat.truncate(context, budget, instruction=TASK, known_total=known_total)

        assert shared == alone


def test_a_tool_message_right_after_the_task_is_dropped_within_the_budget_when_facts_are_shared():
    facts = chat.MessageFacts()
    first, second, _ = _GROWING_CASES["tool_after_task"]

    chat.truncate(first, 10_000, instruction=TASK, facts=facts)
    cut = chat.truncate(second, 10_000, instruction=TASK, facts=facts)

    assert cut.dropped == 1 and cut.messages == [_SYSTEM, _TASK_MESSAGE]


def test_value_rows_of_a_growing_request_history_match_rows_made_one_decision_at_a_time():
    request = [MessageRecord("system", "s" * 50), MessageRecord("user", "a demonstration")]
    steps = []
    for n in range(6):
        steps += [
            model_call(f"step {n}", list(request), tokens_in=30 * (n + 1)),
            command(f"ls {n}", "x" * 90),
        ]
        request += [
            MessageRecord("assistant", f"step {n}"),
            MessageRecord("tool" if n == 2 else "user", "x" * 90),
        ]
        if n == 1:
            request.append(MessageRecord("user", TASK))
    spec = DatasetSpec(kind="value", context_budget_tokens=120)
    run = source_run("r1", steps)

    rows = list(value_rows([run], spec))

    assert_each_row_is_its_context_cut_alone(rows, steps[::2], 120)
    assert rows[3]["messages"][0] is rows[4]["messages"][0]


def assert_each_row_is_its_context_cut_alone(rows, calls, budget):
    """Each row's messages and context stats are what truncating its call's request on its own gives."""
    for row, call in zip(rows, calls, strict=True):
        alone = chat.truncate(
            [m.as_openai() for m in call.request_messages], budget, instruction=TASK, known_total=call.tokens_in
        )
        assert row["messages"] == alone.messages
        stats = row["stats"]
        assert (stats["context_tokens"], stats["context_dropped"]) == (alone.tokens, alone.dropped)
