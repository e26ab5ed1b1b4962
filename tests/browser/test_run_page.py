"""The run page in Chromium, on real fixture runs and synthetic ones: tool calls linked to results, scores,
failing commands, the context lens, the timeline with and without timestamps, a 30,000-step run, compare,
keys and deep links, a 390 px screen."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest

from experience.models import Step, Trajectory
from experience.records import MessageRecord, StepRecord, TrajectoryRecord
from experience.services.importing import trajectories_import_file
from experience.services.ingest import trajectory_ingest
from experience.services.stored import stored_step_records
from experience.steps import CONTEXT
from tests.experience.importers.fixture_files import BROWSER, DEMOS, MULTI_SWE, TAU_BENCH

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]
T0 = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)


def _import(path, source_format: str) -> list[Trajectory]:
    report = trajectories_import_file(path=path)
    assert report.status == "imported", report.error
    return list(Trajectory.objects.filter(source_format=source_format).order_by("pk"))


def _open(page, live_server, trajectory_id: int, hash_: str = "") -> None:
    page.goto(f"{live_server.url}/trajectories/{trajectory_id}/{hash_}")
    page.wait_for_selector("body[data-index-ready='1']")


def _linked_tool_call(page, trajectory: Trajectory) -> None:
    """Some step shows a tool call's name and arguments, and its result link lands on the step answering it."""
    call = Step.objects.filter(trajectory=trajectory, kind="tool_call").order_by("seq").first() or \
        Step.objects.filter(trajectory=trajectory, kind="model_call", payload__has_key="tool_calls").order_by("seq").first()
    stored_call = call.payload["tool_calls"][0]
    page.evaluate(f"trovePage.jumpToSeq({call.seq})")
    step = page.locator(f"#step-{call.seq}")
    step.wait_for()
    assert step.locator(".tool-name").first.inner_text() == stored_call["function"]["name"]
    arguments = json.loads(stored_call["function"]["arguments"])
    shown = json.loads(step.locator("pre.args").first.inner_text())
    assert shown == arguments
    result = Step.objects.get(trajectory=trajectory, payload__tool_call_id=stored_call["id"],
                              kind__in=["command", "observation", "file_change"])
    step.locator("a.step-link", has_text="result").first.click()
    page.wait_for_selector(f"#step-{result.seq}.current")
    assert page.locator(f"#step-{result.seq} a.step-link", has_text="call").count() == 1


def test_openhands_tool_calls_show_name_and_arguments_linked_to_results(logged_in_page, live_server):
    run = _import(MULTI_SWE, "openhands-output")[0]
    _open(logged_in_page, live_server, run.pk)
    _linked_tool_call(logged_in_page, run)


def test_inspect_tool_calls_and_the_score_with_its_explanation(logged_in_page, live_server):
    run = _import(BROWSER, "inspect-eval")[0]
    page = logged_in_page
    _open(page, live_server, run.pk)
    _linked_tool_call(page, run)
    page.keyboard.press("v")  # the evaluation
    score = Step.objects.filter(trajectory=run, kind="eval").order_by("-seq").first()
    page.wait_for_selector(f"#step-{score.seq}.current")
    box = page.locator(f"#step-{score.seq} .score")
    assert box.locator(".verdict").inner_text().lower() == "passed"
    assert "C" in box.locator("dd").first.inner_text()
    assert score.preview[:40] in box.locator(".explanation").inner_text()
    assert "$ None" not in page.locator(f"#step-{score.seq}").inner_text()


def test_openai_conversation_tool_calls_are_linked(logged_in_page, live_server):
    run = _import(TAU_BENCH, "openai-conversations")[0]
    _open(logged_in_page, live_server, run.pk)
    _linked_tool_call(logged_in_page, run)


def _synthetic(ref: str, n_steps: int = 0, *, timed: bool = True) -> Trajectory:
    """A run with growing contexts, a failing command, a rewritten history and an edit; `n_steps` pads it."""
    context = [MessageRecord(role="system", content="You are a coding agent."),
               MessageRecord(role="user", content="Fix the slugify bug.")]
    steps: list[StepRecord] = []

    def at(i: int) -> dict:
        return {"started_at": T0 + timedelta(seconds=i), "ended_at": T0 + timedelta(seconds=i, milliseconds=300)} if timed else {}

    for i in range(3):
        steps.append(StepRecord(kind="model_call", request_messages=list(context), response_text=f"reply {i}",
                                text=f"thinking {i}", tokens_in=50 + i, tokens_out=5, latency_ms=300, call_id=f"c{i}",
                                **at(2 * i)))
        steps.append(StepRecord(kind="command", command=f"run {i}", output=f"out {i}\n" * 50,
                                exit_code=100 if i == 1 else 0, **at(2 * i + 1)))
        context = context + [MessageRecord(role="assistant", content=f"reply {i}"),
                             MessageRecord(role="user", content=f"observation {i}")]
    context = [context[0], MessageRecord(role="system", content="Reminder: run the tests."), *context[1:]]
    steps.append(StepRecord(kind="model_call", request_messages=list(context), response_text="done", call_id="c3", **at(7)))
    steps.append(StepRecord(kind="file_change", text="--- a/s.py\n+++ b/s.py\n@@ -1 +1 @@\n-a\n+b", payload={"path": "s.py"}, **at(8)))
    for i in range(n_steps):
        steps.append(StepRecord(kind="command" if i % 2 else "observation", command=f"echo {i}", text=f"padding {i}",
                                output=str(i), exit_code=0, **at(9 + i)))
    trajectory, _ = trajectory_ingest(record=TrajectoryRecord(
        source="api", source_format="trove", source_ref=ref, task_key="slugify", instruction="Fix it.", steps=steps))
    return trajectory


def test_a_failing_command_is_red(logged_in_page, live_server):
    run = _synthetic("failing")
    page = logged_in_page
    _open(page, live_server, run.pk)
    page.keyboard.press("e")  # the first error
    page.wait_for_selector("#step-3.current")
    badge = page.locator("#step-3 .exit")
    assert badge.inner_text() == "exit 100"
    assert page.evaluate("getComputedStyle(document.querySelector('#step-3 .exit')).backgroundColor") == "rgb(204, 31, 26)"
    assert "failed" in page.locator("#step-3").get_attribute("class")
    assert page.evaluate("getComputedStyle(document.querySelector('#step-1 .exit')).backgroundColor") != "rgb(204, 31, 26)"
    # Output past a screenful is collapsed until asked for.
    assert page.locator("#step-1 pre.output").inner_text().count("\n") < 40
    page.locator("#step-1 button.more").click()
    assert page.locator("#step-1 pre.output").inner_text().count("out 0") == 50


def test_the_context_lens_shows_exactly_what_is_new_and_says_when_history_was_rewritten(logged_in_page, live_server):
    run = _synthetic("lens")
    page = logged_in_page
    _open(page, live_server, run.pk)
    rows = list(Step.objects.filter(trajectory=run, kind="model_call").order_by("seq"))
    contexts = [r.request_messages for r in stored_step_records(rows)]
    page.locator("#step-2 details.context summary").click()
    page.wait_for_selector("#step-2 .lens .lens-new-head")
    new = page.locator("#step-2 .lens .msg.new pre").all_inner_texts()
    assert new == [m.content for m in contexts[1][len(contexts[0]):]]
    assert page.locator("#step-2 details.unchanged summary").inner_text().startswith(f"{len(contexts[0])} earlier messages unchanged")
    assert page.locator("#step-2 .rewrite").count() == 0
    page.locator("#step-6 details.context summary").click()
    page.wait_for_selector("#step-6 .rewrite")
    assert "system reminder" in page.locator("#step-6 .rewrite strong").inner_text()
    assert "+Reminder: run the tests." in page.locator("#step-6 .rewrite pre").inner_text()
    # No context is in the page until a call is opened.
    assert "You are a coding agent." not in page.evaluate("document.getElementById('run-config').textContent")


_OFFSET_IN_VIEWPORT = """(seq) => document.getElementById('step-' + seq).getBoundingClientRect().top
    - document.getElementById('viewport').getBoundingClientRect().top"""


@pytest.mark.parametrize(("path", "source_format"), [(BROWSER, "inspect-eval"), (sorted(DEMOS.glob("replay__*/*.traj"))[0], "swe-agent-traj")])
def test_the_context_lens_of_a_real_run_matches_its_stored_contexts(logged_in_page, live_server, path, source_format):
    """On imported runs: where a call's context extends the previous one, the lens shows exactly the messages
    after it and no rewrite; where it does not (SWE-agent folds old observations), the lens says so."""
    run = _import(path, source_format)[0]
    rows = list(Step.objects.filter(trajectory=run, kind="model_call", blob_refs__has_key=CONTEXT).order_by("seq"))[:5]
    assert len(rows) >= 3, "the fixture run has model calls with stored contexts"
    contexts = [[m.content for m in r.request_messages] for r in stored_step_records(rows)]
    page = logged_in_page
    _open(page, live_server, run.pk)
    for before, after, row in zip(contexts, contexts[1:], rows[1:], strict=False):
        page.evaluate(f"trovePage.jumpToSeq({row.seq})")
        step = page.locator(f"#step-{row.seq}")
        step.locator("details.context > summary").click()
        step.locator(".lens .lens-new-head").wait_for()
        # Opening a lens keeps its step where it was in the viewport: the list must not jump.
        assert abs(page.evaluate(_OFFSET_IN_VIEWPORT, row.seq) - 8) < 3
        shown = step.locator(".lens .msg.new > pre").all_inner_texts()
        if after[: len(before)] == before:
            assert step.locator(".rewrite").count() == 0
            assert shown == [text for text in after[len(before):] if text]
        else:
            assert step.locator(".rewrite").count() >= 1
            assert "History rewritten" in step.locator(".rewrite strong").first.inner_text()


def test_the_context_lens_counts_tokens_per_message_where_the_records_allow(logged_in_page, live_server):
    """Usage gives each call's prompt size: the delta between two calls is the new messages' size, exact for
    a lone new message, shared out (≈) over several; token ids count the same way."""
    system, user = MessageRecord(role="system", content="You are a coding agent."), MessageRecord(role="user", content="Fix it.")
    reply, tool = MessageRecord(role="assistant", content="ls"), MessageRecord(role="tool", content="a.py b.py\n" * 8)
    nudge = MessageRecord(role="user", content="Run the tests now.")
    steps = [StepRecord(kind="model_call", request_messages=[system, user], response_text="ls", tokens_in=120, tokens_out=20, call_id="t0"),
             StepRecord(kind="command", command="ls", output="a.py b.py", exit_code=0),
             StepRecord(kind="model_call", request_messages=[system, user, reply, tool], response_text="", tokens_in=180,
                        tokens_out=9, call_id="t1", payload={"prompt_token_ids": list(range(180))}),
             StepRecord(kind="model_call", request_messages=[system, user, reply, tool, nudge], response_text="ok",
                        tokens_in=999, tokens_out=2, call_id="t2", payload={"prompt_token_ids": list(range(195))})]
    run, _ = trajectory_ingest(record=TrajectoryRecord(source="api", source_format="trove", source_ref="tokens",
                                                       task_key="tokens", steps=steps))
    page = logged_in_page
    _open(page, live_server, run.pk)
    page.locator("#step-2 details.context summary").click()
    page.wait_for_selector("#step-2 .lens .lens-new-head")
    assert page.locator("#step-2 .lens .msg.new .tokens").all_inner_texts() == ["≈ 20 tokens", "≈ 40 tokens"]
    assert "· 60 tokens (counted from token ids)" in page.locator("#step-2 .lens-new-head").inner_text()
    assert page.locator("#step-2 details.unchanged summary").inner_text().endswith("(120 tokens)")
    page.locator("#step-3 details.context summary").click()
    page.wait_for_selector("#step-3 .lens .lens-new-head")
    assert page.locator("#step-3 .lens .msg.new .tokens").all_inner_texts() == ["15 tokens"]  # 195 - 180 token ids
    page.locator("#step-0 details.context summary").click()
    page.wait_for_selector("#step-0 .lens .lens-new-head")
    shown = page.locator("#step-0 .lens .msg.new .tokens").all_inner_texts()
    assert len(shown) == 2 and all(text.startswith("≈ ") for text in shown)
    assert sum(int(text.split()[1]) for text in shown) == 120
    page.locator("#step-2").screenshot(path=str(_shots() / "lens-tokens.png"))


def test_a_run_without_timestamps_gets_a_slot_per_step(logged_in_page, live_server):
    run = _synthetic("untimed", 20, timed=False)
    page = logged_in_page
    _open(page, live_server, run.pk)
    assert "no timestamps: one slot per step" in page.locator("#timeline-note").inner_text()
    page.locator("#timeline-canvas").scroll_into_view_if_needed()
    canvas = page.locator("#timeline-canvas").bounding_box()
    assert canvas["width"] > 300 and canvas["height"] > 60
    n = run.n_steps
    # Clicking the middle of the tool lane lands on a step near the middle of the run.
    page.mouse.click(canvas["x"] + 112 + (canvas["width"] - 120) * 0.5, canvas["y"] + 18 + 9)
    page.wait_for_selector("li.step.current")
    seq = int(page.locator("li.step.current").get_attribute("data-seq"))
    assert abs(seq - n / 2) <= 3
    assert page.locator("#timeline-marker").get_attribute("data-seq") == str(seq)
    page.mouse.move(canvas["x"] + 112 + (canvas["width"] - 120) * 0.25, canvas["y"] + 27)
    page.wait_for_selector("#timeline-tip:not([hidden])")
    assert page.locator("#timeline-tip").inner_text().startswith("#")


def test_the_value_curve_note_shows_once_the_index_carries_estimates(logged_in_page, live_server):
    plain, scored = _synthetic("unscored"), _synthetic("scored")
    calls = list(Step.objects.filter(trajectory=scored, kind="model_call").order_by("seq"))
    for index, step in enumerate(calls):
        step.value_estimate = 0.25 * index
    Step.objects.bulk_update(calls, ["value_estimate"])
    page = logged_in_page
    _open(page, live_server, plain.pk)
    assert not page.locator("#value-curve").is_visible()
    _open(page, live_server, scored.pk)
    assert page.locator("#value-curve").is_visible()
    assert page.evaluate("trovePage.state.index.value.filter((v) => v !== null)") == [0.25 * i for i in range(len(calls))]


def test_a_30000_step_run_scrolls_to_its_last_step(logged_in_page, live_server, settings):
    settings.TROVE_MAX_STEPS_PER_TRAJECTORY = 40_000
    run = _synthetic("long", 30_000 - 8)
    page = logged_in_page
    _open(page, live_server, run.pk)
    assert run.n_steps == 30_000
    page.keyboard.press("G")
    page.wait_for_selector("#step-29999.current")
    assert "padding 29991" in page.locator("#step-29999").inner_text() or "echo 29991" in page.locator("#step-29999").inner_text()
    assert page.evaluate("document.getElementsByTagName('*').length") < 5000
    page.keyboard.press("k")
    page.wait_for_selector("#step-29998.current")
    page.keyboard.press("g")
    page.wait_for_selector("#step-0.current")


def test_filters_search_and_deep_links(logged_in_page, live_server):
    run = _synthetic("find", 40)
    page = logged_in_page
    _open(page, live_server, run.pk, "#q=echo%2017")
    page.wait_for_selector("li.step.current")
    assert page.locator("#search-count").inner_text().startswith("match 1 of")
    assert "echo 17" in page.locator("li.step.current").inner_text()
    assert "q=echo%2017" in page.evaluate("location.hash")
    page.locator("#kind-filters input[data-kind='observation']").uncheck()
    page.wait_for_timeout(50)
    kinds = set(page.locator("#steps li.step").evaluate_all("els => els.map(e => e.className)"))
    assert not any("kind-observation" in k for k in kinds)
    page.keyboard.press("?")
    assert page.locator("#help").is_visible()
    page.keyboard.press("Escape")
    assert not page.locator("#help").is_visible()
    page.keyboard.press("d")
    page.wait_for_selector("#step-7.current")  # the first edit
    page.goto(f"{live_server.url}/trajectories/{run.pk}/#step-30")
    page.wait_for_selector("#step-30.current")


def test_keys_step_through_the_run(logged_in_page, live_server):
    run = _synthetic("keys")
    page = logged_in_page
    _open(page, live_server, run.pk)
    page.keyboard.press("j")
    page.keyboard.press("j")
    page.wait_for_selector("#step-1.current")
    assert page.evaluate("window.location.hash") == "#step-1"
    page.keyboard.press("k")
    page.wait_for_selector("#step-0.current")


def test_a_narrow_screen_works(phone_page, live_server):
    page = phone_page
    run = _synthetic("narrow", 10)
    _open(page, live_server, run.pk)
    assert page.locator("#stepper").is_visible()
    page.locator("#step-next").click()
    page.locator("#step-next").click()
    page.wait_for_selector("#step-1.current")
    assert page.locator("#step-position").inner_text() == "step 2 of 18"
    page.locator("#step-prev").click()
    page.wait_for_selector("#step-0.current")
    overflow = page.evaluate("document.documentElement.scrollWidth - document.documentElement.clientWidth")
    assert overflow <= 1
    page.screenshot(path=str(_shots() / "run-page-390.png"), full_page=False)


def test_the_compare_page_aligns_two_fixture_runs_and_names_the_first_divergence(logged_in_page, live_server):
    paths = sorted(DEMOS.glob("replay__marshmallow-code__marshmallow-1867__*/*.traj"))[:2]
    runs = [_import(path, "swe-agent-traj")[-1] for path in paths]
    a, b = runs[0], runs[1] if runs[1].pk != runs[0].pk else runs[0]
    page = logged_in_page
    page.goto(f"{live_server.url}/trajectories/compare/?a={a.pk}&b={b.pk}")
    divergence = page.locator("#divergence").inner_text()
    assert divergence.startswith("First divergence at action")
    first = page.locator("tr.first-divergence")
    assert first.count() == 1 and first.get_attribute("data-op") in ("changed", "inserted", "deleted")
    link = first.locator("a").first
    assert link.get_attribute("href").startswith("/trajectories/")
    assert page.locator("#outcome-a").inner_text().startswith("A") and page.locator("#outcome-b").count() == 1
    assert page.locator("#counts").inner_text().count("matched") == 1


def test_the_compare_page_explains_missing_ids(logged_in_page, live_server):
    page = logged_in_page
    response = page.goto(f"{live_server.url}/trajectories/compare/?a=1&b=x")
    assert response.status == 400
    assert "b: give a run's id" in page.locator(".compare-form").inner_text()


def test_step_content_is_shown_as_text_never_run_as_markup(logged_in_page, live_server):
    """An agent's output is attacker-controlled: markup in a command, its output, a tool call and a context
    message must appear as text, and no script in it may run."""
    attack = '<img src=x onerror="window.__pwned=1"><script>window.__pwned=2</script>'
    call = {"id": "x1", "type": "function", "function": {"name": attack, "arguments": json.dumps({"q": attack})}}
    steps = [StepRecord(kind="model_call", request_messages=[MessageRecord(role="user", content=attack)],
                        response_text=attack, tool_calls=[call], call_id="x-m1"),
             StepRecord(kind="command", command=attack, output=attack, exit_code=1, payload={"tool_call_id": "x1"}),
             StepRecord(kind="file_change", text=f"--- a/x\n+++ b/x\n@@ -1 +1 @@\n-a\n+{attack}", payload={"path": attack})]
    run, _ = trajectory_ingest(record=TrajectoryRecord(source="api", source_format="trove", source_ref="xss", task_key=attack,
                                                       steps=steps, final_diff=f"--- a/x\n+++ b/x\n@@ -1 +1 @@\n+{attack}"))
    page = logged_in_page
    _open(page, live_server, run.pk)
    page.locator("#step-0 details.context summary").click()
    page.wait_for_selector("#step-0 .lens .msg.new")
    assert page.evaluate("window.__pwned") is None
    assert page.locator("#steps img, #final-diff img, #steps script").count() == 0
    assert attack in page.locator("#step-1 pre.cmd").inner_text()
    assert page.locator("#step-0 .tool-name").inner_text() == attack
    assert attack in page.locator("#step-0 .lens .msg.new pre").inner_text()


def test_pages_require_login(page, live_server):
    page.goto(f"{live_server.url}/trajectories/1/")
    assert "/accounts/login/" in page.url


def _shots():
    from pathlib import Path

    path = Path("/tmp/trove-run-page-shots")
    path.mkdir(exist_ok=True)
    return path
