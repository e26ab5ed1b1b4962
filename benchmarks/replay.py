"""The run page at any length, measured in Chromium.

    DATABASE_URL=postgres://... .venv/bin/python benchmarks/replay.py [--sizes 1000,10000,30000] [--loads 3]

Makes one run per size on a scratch database (created for the run, dropped after): model calls whose
context grows by two messages a call (compacted to the system prompt and the last 40 messages every 200
calls, as harnesses do), each answered with a tool call, then the command it ran (outputs of 0.2-2 KB, one in
twenty of 6-30 KB, one in fifteen failing) and an observation; an evaluation at the end. Serves Trove on a
live server and opens each run's page in headless Chromium (/usr/bin/chromium, --no-sandbox --disable-gpu
--disable-background-networking), once to warm up and then `--loads` times, the sizes in turns, and takes the median of:

- tti_ms: from navigation until the first steps are visible and `j` works (a step is selected);
- bytes: bytes transferred before that moment (the document and every resource finished by then);
- dom_nodes: elements in the page after the step index arrived and the timeline is drawn, and after a jump
  to the last step (the larger);
- jump_last_ms: from pressing `G` until the last step is on screen and selected.

Baseline: the 1,000-step run in the same session; tti_ratio_30k_1k = tti_ms_30k / tti_ms_1k says whether the
cost grows with the run (target < 1.5). Targets: tti_ms_30k < 1000, bytes_30k < 1 MB, dom_nodes < 5,000.
The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from datetime import UTC, datetime, timedelta

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")
os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")  # Playwright's sync API runs an event loop

CHROMIUM = os.environ.get("TROVE_CHROMIUM", "/usr/bin/chromium")
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking"]
PASSWORD = "bench-pass-123456"
SYSTEM = "You are a careful software engineer working in a sandboxed repository. " * 10


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1000,10000,30000")
    parser.add_argument("--loads", type=int, default=3)
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    import django

    django.setup()
    from django.conf import settings
    from django.db import connection

    if connection.vendor != "postgresql":
        sys.exit("benchmarks/replay.py measures Postgres: set DATABASE_URL=postgres://...")
    settings.TROVE_MAX_STEPS_PER_TRAJECTORY = max(settings.TROVE_MAX_STEPS_PER_TRAJECTORY, max(sizes))
    settings.ALLOWED_HOSTS = ["*"]
    name = os.environ.get("TROVE_BENCH_DATABASE_NAME", "trove_bench_replay")
    connection.settings_dict["TEST"]["NAME"] = name
    connection.creation.create_test_db(verbosity=0, autoclobber=True, serialize=False)
    try:
        figures = measure(sizes, args.loads)
    finally:
        connection.close()
        connection.creation.destroy_test_db(name, verbosity=0)
    print(json.dumps(figures))


def make_run(n_steps: int, seed: int):
    from experience.records import MessageRecord, StepRecord, TrajectoryRecord

    rng = random.Random(seed)
    t0 = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)
    context = [MessageRecord(role="system", content=SYSTEM), MessageRecord(role="user", content=f"Fix issue {seed}.")]
    steps: list[StepRecord] = []
    clock = 0.0
    call = 0
    while len(steps) < n_steps - 1:
        call += 1
        if call % 200 == 0:  # the harness compacts its history
            context = [context[0], MessageRecord(role="user", content=f"Summary of calls before {call}."), *context[-40:]]
        command = rng.choice(["pytest -q tests/", "grep -rn parse src/", "sed -n 1,80p src/app.py", "ls -la",
                              "python -c 'import app'"]) + f" # {call}"
        tool_call = {"id": f"call_{call}", "type": "function",
                     "function": {"name": "bash", "arguments": json.dumps({"command": command})}}
        latency = rng.uniform(300, 3000)
        steps.append(StepRecord(kind="model_call", request_messages=list(context), response_text=f"Next I run {command}.",
                                text="Thinking about what to check next. " * rng.randint(1, 6), tool_calls=[tool_call],
                                tokens_in=200 * len(context), tokens_out=rng.randint(20, 200), latency_ms=latency,
                                call_id=f"m{call}", started_at=t0 + timedelta(seconds=clock),
                                ended_at=t0 + timedelta(seconds=clock + latency / 1000)))
        clock += latency / 1000
        size = rng.randint(6000, 30000) if rng.random() < 0.05 else rng.randint(200, 2000)
        output = "".join(rng.choice("abcdefghij \n") for _ in range(size))
        duration = rng.uniform(50, 5000)
        steps.append(StepRecord(kind="command", command=command, output=output,
                                exit_code=1 if rng.random() < 1 / 15 else 0, duration_ms=duration,
                                payload={"tool_call_id": f"call_{call}", "tool": "bash"},
                                started_at=t0 + timedelta(seconds=clock), ended_at=t0 + timedelta(seconds=clock + duration / 1000)))
        clock += duration / 1000
        steps.append(StepRecord(kind="observation", text=output[:300], payload={"tool_call_id": f"call_{call}"},
                                started_at=t0 + timedelta(seconds=clock)))
        context = context + [MessageRecord(role="assistant", content=f"Next I run {command}.", tool_calls=[tool_call]),
                             MessageRecord(role="tool", content=output[:1500], tool_call_id=f"call_{call}")]
    steps = steps[: n_steps - 1]
    steps.append(StepRecord(kind="eval", command="pytest -q", output="12 passed", exit_code=0, text="evaluation passed; reward 1.0",
                            payload={"reward": 1.0}, started_at=t0 + timedelta(seconds=clock + 1)))
    return TrajectoryRecord(source="api", source_format="trove", source_ref=f"bench-replay-{n_steps}", task_key=f"bench-{seed}",
                            instruction="Fix it.", status="completed", reward=1.0, success=True, steps=steps)


def measure(sizes: list[int], loads: int) -> dict:
    from django.contrib.auth import get_user_model
    from django.test.testcases import LiveServerThread, _StaticFilesHandler

    from experience.services.ingest import trajectory_ingest
    from webapp.access.roles import role_groups_sync

    user = get_user_model().objects.create_user(username="bench", password=PASSWORD)
    user.groups.add(*role_groups_sync().values())
    runs = {}
    for size in sizes:
        started = time.perf_counter()
        trajectory, _ = trajectory_ingest(record=make_run(size, size))
        runs[size] = trajectory.pk
        print(f"stored a {size}-step run in {time.perf_counter() - started:.1f} s", file=sys.stderr, flush=True)
    server = LiveServerThread("127.0.0.1", _StaticFilesHandler, port=0)
    server.daemon = True
    server.start()
    server.is_ready.wait()
    if server.error:
        raise server.error
    base = f"http://127.0.0.1:{server.port}"
    try:
        figures = _browse(base, runs, loads)
    finally:
        server.terminate()
    return figures


def _browse(base: str, runs: dict[int, int], loads: int) -> dict:
    from playwright.sync_api import sync_playwright

    figures: dict = {}
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=FLAGS)
        context = browser.new_context(viewport={"width": 1280, "height": 900})
        context.add_init_script(_WATCH_INTERACTIVE)
        page = context.new_page()
        page.goto(f"{base}/accounts/login/")
        page.fill("input[name=username]", "bench")
        page.fill("input[name=password]", PASSWORD)
        page.click("button[type=submit]")
        page.wait_for_url(f"{base}/")
        for size, trajectory_id in runs.items():  # warm the server, its caches and the browser's for each run once
            _load(page, f"{base}/trajectories/{trajectory_id}/", size)
        samples: dict[int, list[dict]] = {size: [] for size in runs}
        for _ in range(loads):  # sizes in turns, so a noisy neighbour hits each alike
            for size, trajectory_id in runs.items():
                samples[size].append(_load(page, f"{base}/trajectories/{trajectory_id}/", size))
        for size, taken in samples.items():
            label = f"{size // 1000}k" if size % 1000 == 0 else str(size)
            for key in ("tti_ms", "bytes", "dom_nodes", "jump_last_ms"):
                figures[f"{key}_{label}"] = round(statistics.median(s[key] for s in taken), 1)
            print(f"{size} steps: {taken}", file=sys.stderr, flush=True)
        browser.close()
    labels = [f"{s // 1000}k" if s % 1000 == 0 else str(s) for s in runs]
    if len(labels) > 1:
        figures[f"tti_ratio_{labels[-1]}_{labels[0]}"] = round(figures[f"tti_ms_{labels[-1]}"] / figures[f"tti_ms_{labels[0]}"], 3)
    figures["targets"] = {"tti_ms_30k": "< 1000", "tti_ratio_30k_1k": "< 1.5", "bytes_30k": "< 1000000",
                          "dom_nodes_30k": "< 5000"}
    return figures


# Installed before the page's own scripts: as soon as a step is rendered, press `j` and note the moment the
# selection shows, all in the page, so Playwright's polling and round trips are not counted.
_WATCH_INTERACTIVE = """
(() => {
  const done = () => {
    if (window.__troveTti !== undefined) return true;
    if (!document.querySelector('#steps li.step:not(.loading)')) return false;
    document.body.dispatchEvent(new KeyboardEvent('keydown', {key: 'j', bubbles: true}));
    const check = () => document.querySelector('#steps li.step.current')
      ? (window.__troveTti = performance.now()) : requestAnimationFrame(check);
    check();
    return true;
  };
  const observer = new MutationObserver(() => { if (done()) observer.disconnect(); });
  document.addEventListener('DOMContentLoaded', () => { if (!done()) observer.observe(document.body, {childList: true, subtree: true}); });
})();
"""


def _load(page, url: str, size: int) -> dict:
    page.goto("about:blank")
    page.goto(url, wait_until="commit")
    page.wait_for_function("window.__troveTti !== undefined")
    tti = page.evaluate("window.__troveTti")
    transferred = page.evaluate("""(tti) => {
        const nav = performance.getEntriesByType('navigation')[0];
        let bytes = nav.transferSize || nav.encodedBodySize;
        for (const r of performance.getEntriesByType('resource')) if (r.responseEnd <= tti) bytes += r.transferSize || r.encodedBodySize;
        return bytes;
    }""", tti)
    page.wait_for_selector("body[data-index-ready='1']")
    nodes = page.evaluate("document.getElementsByTagName('*').length")
    jump = page.evaluate("""(last) => new Promise((resolve) => {
        const start = performance.now();
        document.body.dispatchEvent(new KeyboardEvent('keydown', {key: 'G', bubbles: true}));
        (function check() {
            const el = document.getElementById('step-' + last);
            if (el && el.classList.contains('current') && !el.classList.contains('loading')) {
                const box = el.getBoundingClientRect(), view = document.getElementById('viewport').getBoundingClientRect();
                if (box.top < view.bottom && box.bottom > view.top) return resolve(performance.now() - start);
            }
            if (performance.now() - start > 30000) return resolve(-1);  // never reached: reported as -1
            requestAnimationFrame(check);
        })();
    })""", size - 1)
    nodes = max(nodes, page.evaluate("document.getElementsByTagName('*').length"))
    return {"tti_ms": round(tti, 1), "bytes": transferred, "dom_nodes": nodes, "jump_last_ms": round(jump, 1)}


if __name__ == "__main__":
    main()
