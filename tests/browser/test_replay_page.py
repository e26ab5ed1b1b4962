"""The replay timeline in a real browser: the steps render in order, keys step through them, deep links work."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from experience.records import MessageRecord, StepRecord, TrajectoryRecord
from experience.services.ingest import trajectory_ingest

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def _run():
    t0 = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)
    context = [MessageRecord(role="system", content="You are a coding agent."),
               MessageRecord(role="user", content="Fix the slugify bug.")]
    steps = [
        StepRecord(kind="model_call", started_at=t0, ended_at=t0 + timedelta(milliseconds=300),
                   request_messages=context, response_text="```bash\nls -la\n```", tokens_in=40, tokens_out=8,
                   latency_ms=300, call_id="c1"),
        StepRecord(kind="command", started_at=t0 + timedelta(seconds=1), ended_at=t0 + timedelta(seconds=1.2),
                   command="ls -la", output="slugify.py\ntests\n", exit_code=0),
        StepRecord(kind="eval", started_at=t0 + timedelta(seconds=2), ended_at=t0 + timedelta(seconds=3),
                   command="python3 -m unittest -q", output="OK", exit_code=0, text="evaluation passed; reward 1.0"),
    ]
    trajectory, _ = trajectory_ingest(record=TrajectoryRecord(
        source="api", source_format="trove", source_ref="browser-test-1", task_key="slugify",
        instruction="Fix the slugify bug.", model="trove-demo-stand-in", status="completed", reward=1.0,
        success=True, started_at=t0, finished_at=t0 + timedelta(seconds=3), steps=steps))
    return trajectory


def test_the_replay_timeline_shows_each_step_and_steps_with_the_keyboard(logged_in_page, live_server):
    trajectory = _run()
    page = logged_in_page
    page.goto(f"{live_server.url}/trajectories/{trajectory.pk}/")

    assert page.locator("#reward").inner_text() == "1.0"
    items = page.locator("#steps > li.step")
    assert items.count() == 3
    assert [items.nth(i).locator(".kind").inner_text() for i in range(3)] == ["model_call", "command", "eval"]
    assert "ls -la" in items.nth(1).locator("pre.cmd").inner_text()
    assert page.locator("#lanes .bar").count() == 3

    page.keyboard.press("j")
    page.keyboard.press("j")
    assert page.evaluate("window.location.hash") == "#step-1"
    assert "current" in items.nth(1).get_attribute("class")
    page.keyboard.press("k")
    assert page.evaluate("window.location.hash") == "#step-0"


def test_a_deep_link_opens_the_named_step(logged_in_page, live_server):
    trajectory = _run()
    page = logged_in_page
    page.goto(f"{live_server.url}/trajectories/{trajectory.pk}/#step-2")
    assert "current" in page.locator("#step-2").get_attribute("class")


def test_pages_require_login(page, live_server):
    page.goto(f"{live_server.url}/")
    assert "/accounts/login/" in page.url
