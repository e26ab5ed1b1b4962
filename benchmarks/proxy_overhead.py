"""What the recording proxy costs: the same load sent directly to a model server, through Trove's proxy
(recording on) and through LiteLLM's proxy, in one run.

Every part is its own process: a mock OpenAI-compatible upstream (aiohttp, a fixed small answer, plain
or streamed), Trove's proxy (its app served by `run_proxy`), LiteLLM's proxy (from its own venv,
var/bench-venvs/litellm, started with a master key and the local cost map), and the load generator
(aiohttp client, a new process per run). What Trove's proxy records into, `--sink`:

- `stream` (default; the headline): the full stack — Trove as wired (`make_trove_proxy_app`), every
  call's token checked in the database, records XADDed in batches to the Redis stream (REDIS_URL) and an
  ingest process (`ingest_stream`, what the `trove.proxy.ingest` task runs; at `--ingest-nice`, default
  10, as background work) storing them in Postgres meanwhile. Needs DATABASE_URL (a migrated Postgres);
  the benchmark creates a job with one running rollout per connection (each with its trajectory; a
  harness's calls are sequential) and deletes them afterwards (`--keep` keeps them); `recorded_fraction`
  counts the model_call steps found in the database, `recorded_after_s` how long after the last phase the
  last of them landed;
- `db`: the embedded default — the same, but records written by the real writer (`write_call_records`)
  from the sink's thread inside the proxy process;
- `count`: a diagnostic, not recording — the proxy core alone, a fixed token table (no token check) and an
  `InProcessSink` whose writer counts.

Trove's proxy is served by `serve_proxy` (what `run_proxy` uses) in `--workers` processes, default 1:
`run_proxy` itself defaults to one per CPU, but on a 2-core machine that also runs the load generator,
the upstream, the ingest, Postgres and Redis, a second proxy process costs more in switching than it
gains. LiteLLM runs in its default configuration (one worker). Each target gets a warm-up, then these
phases; the loaded ones are split into `--rounds` rounds in which the targets take turns (so a noisy
neighbour on a shared machine hits all of them alike; latencies are pooled, throughput is the median round):

- unloaded: one request at a time, alternating between the direct upstream and one proxy (one loadgen,
  one connection per target; Trove and LiteLLM each paired with direct in a run of their own) — what the
  proxy adds to a call, free of queueing, each proxy and its direct baseline sampled under the same
  conditions. Not the three in one rotation: LiteLLM keeps a core busy for milliseconds after each answer
  (its logging and cost callbacks), and the request after it paid for that;
- load: 16 connections, `--requests` plain requests — throughput, and latency under load;
- stream: 16 connections, a third as many streamed requests.

On a 2-core machine the load phases are CPU-bound and the proxy is a third Python process sharing the two
cores with the load generator and the upstream, so latency under load is mostly queueing
(16 / throughput); the added median is therefore taken from the unloaded phase, and the loaded medians
are printed beside it.

`--protocol chat|responses|messages` (default chat): every target is called in that API with the same
conversation (Responses in Codex's shape, Messages in Claude Code's) and the mock answers in it; Trove's
endpoint speaks it too (a pass-through, recorded and normalised), and LiteLLM serves it from its own
`/v1/responses` (an OpenAI model) or `/v1/messages` (an Anthropic model at the mock). `--stream` streams the
unloaded and load phases as well (the stream phase always is).

Trove's CPU per call, `trove_total_cpu_ms_per_call`, is its proxy's (load phase) plus the work its recording
causes, each over every call of the run: the ingest's (from once it idles after its start), the Postgres
backends serving the benchmark's database (token checks, the writer or the ingest: sampled from /proc, Postgres
being local), and, with `--sink stream`, a redis-server started for the run alone. `trove_total_over_litellm_cpu`
sets it against LiteLLM's process (target <= 0.1). `failed_calls` counts non-200 answers per target.

The last line is one JSON object; `*_p50_ms`, `*_p99_ms` and `*_added_p50_ms` are unloaded, `*_rps`
from the load phase, `*_loaded_*` and `*_stream_*` from the other phases, `*_cpu_ms_per_call` the CPU
time of a target's own processes per call in the load phase (robust to noisy neighbours; `upstream_` is
the mock's own, `ingest_` the stream ingest's with `--sink stream`). Targets: recorded_fraction 1.0,
trove_added_p50_ms < 1, trove_rps >= 50 x litellm_rps and >= direct_rps / 5.

    DATABASE_URL=postgres://... REDIS_URL=redis://... SECRET_KEY=... \
        .venv/bin/python benchmarks/proxy_overhead.py [--requests 3000] [--sink stream|db|count] [--skip-litellm] \
        [--protocol chat|responses|messages] [--stream]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
LITELLM_BIN = REPO / "var" / "bench-venvs" / "litellm" / "bin" / "litellm"
LITELLM_INSTALL = "python3 -m venv var/bench-venvs/litellm && var/bench-venvs/litellm/bin/pip install 'litellm[proxy]==1.108.7'"
MASTER_KEY = "sk-bench-master"
MODEL = "bench-model"
TOKEN = "bench-token"
CONCURRENCY = 16
WARMUP_REQUESTS = 200

PLAIN_BODY = json.dumps(
    {
        "id": "chatcmpl-bench",
        "object": "chat.completion",
        "created": 1700000000,
        "model": MODEL,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "cd /repo && pytest -q tests/test_parser.py"},
                "finish_reason": "stop",
                "logprobs": None,
            }
        ],
        "usage": {"prompt_tokens": 52, "completion_tokens": 11, "total_tokens": 63},
    }
).encode()


def _stream_events() -> list[bytes]:
    def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
        body = {
            "id": "chatcmpl-bench",
            "object": "chat.completion.chunk",
            "created": 1700000000,
            "model": MODEL,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }
        return b"data: " + json.dumps(body).encode() + b"\n\n"

    words = ["cd /repo", " && pytest", " -q tests/", "test_parser.py"]
    usage = {
        "id": "chatcmpl-bench",
        "object": "chat.completion.chunk",
        "created": 1700000000,
        "model": MODEL,
        "choices": [],
        "usage": {"prompt_tokens": 52, "completion_tokens": 11, "total_tokens": 63},
    }
    return (
        [chunk({"role": "assistant", "content": ""})]
        + [chunk({"content": word}) for word in words]
        + [chunk({}, "stop"), b"data: " + json.dumps(usage).encode() + b"\n\n", b"data: [DONE]\n\n"]
    )


REQUEST = {
    "model": MODEL,
    "messages": [
        {"role": "system", "content": "You are a software engineer working in a bash shell. " * 8},
        {"role": "user", "content": "The parser drops the last token of a quoted string. Fix it."},
        {"role": "assistant", "content": "ls -la /repo"},
        {"role": "user", "content": "README.md  setup.py  src/  tests/"},
    ],
    "temperature": 0.0,
    "max_tokens": 256,
}


ANSWER_TEXT = "cd /repo && pytest -q tests/test_parser.py"
WORDS = ["cd /repo", " && pytest", " -q tests/", "test_parser.py"]
SYSTEM = "You are a software engineer working in a bash shell. " * 8
# What each protocol's harness sends and where (OpenAI Responses: Codex's shape; Anthropic Messages: Claude
# Code's), the same conversation as REQUEST.
PROTOCOL_PATHS = {"chat": "/v1/chat/completions", "responses": "/v1/responses", "messages": "/v1/messages"}
RESPONSES_REQUEST = {
    "model": MODEL, "instructions": SYSTEM, "store": False, "max_output_tokens": 256, "temperature": 0.0,
    "input": [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": REQUEST["messages"][1]["content"]}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "ls -la /repo"}]},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": REQUEST["messages"][3]["content"]}]},
    ],
}
MESSAGES_REQUEST = {
    "model": MODEL, "system": SYSTEM, "max_tokens": 256, "temperature": 0.0,
    "messages": [{"role": m["role"], "content": m["content"]} for m in REQUEST["messages"][1:]],
}
REQUESTS = {"chat": REQUEST, "responses": RESPONSES_REQUEST, "messages": MESSAGES_REQUEST}


def _sse(event: str | None, data: dict[str, Any]) -> bytes:
    return (f"event: {event}\n".encode() if event else b"") + b"data: " + json.dumps(data).encode() + b"\n\n"


def _responses_answer(status: str = "completed", text: str = ANSWER_TEXT) -> dict[str, Any]:
    message = {"type": "message", "id": "msg_bench", "status": "completed", "role": "assistant",
               "content": [{"type": "output_text", "text": text, "annotations": []}]}
    return {"id": "resp_bench", "object": "response", "created_at": 1700000000, "status": status, "model": MODEL,
            "output": [message] if status == "completed" else [], "parallel_tool_calls": False, "tools": [],
            "tool_choice": "auto", "error": None, "incomplete_details": None,
            "usage": {"input_tokens": 52, "output_tokens": 11, "total_tokens": 63,
                      "input_tokens_details": {"cached_tokens": 0}, "output_tokens_details": {"reasoning_tokens": 0}}}


def _responses_events() -> list[bytes]:
    item = {"type": "message", "id": "msg_bench", "status": "in_progress", "role": "assistant", "content": []}
    part = {"type": "output_text", "text": "", "annotations": []}
    events = [_sse("response.created", {"type": "response.created", "sequence_number": 0,
                                        "response": _responses_answer("in_progress")}),
              _sse("response.output_item.added", {"type": "response.output_item.added", "sequence_number": 1,
                                                  "output_index": 0, "item": item}),
              _sse("response.content_part.added", {"type": "response.content_part.added", "sequence_number": 2,
                                                   "item_id": "msg_bench", "output_index": 0, "content_index": 0,
                                                   "part": part})]
    for n, word in enumerate(WORDS):
        events.append(_sse("response.output_text.delta", {"type": "response.output_text.delta", "sequence_number": 3 + n,
                                                          "item_id": "msg_bench", "output_index": 0,
                                                          "content_index": 0, "delta": word}))
    done = _responses_answer()
    events += [_sse("response.output_text.done", {"type": "response.output_text.done", "sequence_number": 7,
                                                  "item_id": "msg_bench", "output_index": 0, "content_index": 0,
                                                  "text": ANSWER_TEXT}),
               _sse("response.output_item.done", {"type": "response.output_item.done", "sequence_number": 8,
                                                  "output_index": 0, "item": done["output"][0]}),
               _sse("response.completed", {"type": "response.completed", "sequence_number": 9, "response": done})]
    return events


MESSAGES_ANSWER = {"id": "msg_bench", "type": "message", "role": "assistant", "model": MODEL,
                   "content": [{"type": "text", "text": ANSWER_TEXT}], "stop_reason": "end_turn",
                   "stop_sequence": None, "usage": {"input_tokens": 52, "output_tokens": 11}}


def _messages_events() -> list[bytes]:
    start = {**MESSAGES_ANSWER, "content": [], "stop_reason": None, "usage": {"input_tokens": 52, "output_tokens": 1}}
    events = [_sse("message_start", {"type": "message_start", "message": start}),
              _sse("content_block_start", {"type": "content_block_start", "index": 0,
                                           "content_block": {"type": "text", "text": ""}})]
    events += [_sse("content_block_delta", {"type": "content_block_delta", "index": 0,
                                            "delta": {"type": "text_delta", "text": word}}) for word in WORDS]
    return events + [_sse("content_block_stop", {"type": "content_block_stop", "index": 0}),
                     _sse("message_delta", {"type": "message_delta", "usage": {"output_tokens": 11},
                                            "delta": {"stop_reason": "end_turn", "stop_sequence": None}}),
                     _sse("message_stop", {"type": "message_stop"})]


# --------------------------------------------------------------------------- roles (child processes)


def _new_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


def role_upstream(port: int) -> None:
    from aiohttp import web

    answers = {"chat": (PLAIN_BODY, _stream_events()),
               "responses": (json.dumps(_responses_answer()).encode(), _responses_events()),
               "messages": (json.dumps(MESSAGES_ANSWER).encode(), _messages_events())}

    def answering(protocol: str) -> Any:
        plain, events = answers[protocol]

        async def answer(request: web.Request) -> web.StreamResponse:
            raw = await request.read()
            if b'"stream": true' not in raw and b'"stream":true' not in raw:
                return web.Response(body=plain, content_type="application/json")
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await response.prepare(request)
            for event in events:
                await response.write(event)
            await response.write_eof()
            return response

        return answer

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": MODEL, "object": "model"}]})

    app = web.Application()
    for protocol, path in PROTOCOL_PATHS.items():
        app.router.add_post(path, answering(protocol))
    app.router.add_get("/v1/models", models)
    web.run_app(app, host="127.0.0.1", port=port, access_log=None, print=None, loop=_new_loop())


def _django() -> None:
    sys.path.insert(0, str(REPO))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")
    import django

    django.setup()


def create_bench_rollouts(upstream_v1: str, count: int, protocol: str = "chat") -> dict[str, Any]:
    """A job of `count` running rollouts (each with its trajectory) whose model is the mock upstream, made by
    the real services, as a rollout runner leaves them while its harness calls the model."""
    import uuid
    from datetime import UTC, datetime

    from experience.records import TrajectoryRecord
    from experience.services.ingest import trajectory_open
    from webapp.rollouts.endpoints import endpoint_register
    from webapp.rollouts.models import Rollout, new_rollout_token
    from webapp.rollouts.services import job_create, rollout_start
    from workers.seed import seed_demo_task_set, seed_local_fleet

    fleet = seed_local_fleet(name=f"bench-proxy-{uuid.uuid4().hex[:8]}", min_warm=0, max_warm=0, max_total=1)
    task_set = seed_demo_task_set()
    task_key = task_set.tasks.order_by("key").values_list("key", flat=True)[0]
    endpoint = endpoint_register(name=f"bench-proxy-{uuid.uuid4().hex[:8]}", base_url=upstream_v1, protocol=protocol,
                                 model_names=[MODEL], allow_private_network=True)  # the mock upstream is on loopback
    job = job_create(task_set=task_set, fleet=fleet, endpoint=endpoint, model_name=MODEL,
                     name="benchmarks/proxy_overhead.py", samples_per_task=count, task_keys=[task_key], concurrency=count,
                     enqueue=lambda rollout_id: None)
    tokens = []
    for rollout_id in job.rollouts.order_by("pk").values_list("pk", flat=True):
        rollout = rollout_start(rollout_id=rollout_id, worker="benchmark")
        assert rollout is not None
        trajectory = trajectory_open(rollout_runner=True, record=TrajectoryRecord(
            source="rollout", source_format="trove-rollout", source_ref=f"bench:{rollout.pk}:{uuid.uuid4().hex}",
            task_key=rollout.task.key, harness="benchmark", model=MODEL, status="running",
            started_at=datetime.now(UTC)))
        token, token_hash = new_rollout_token()  # the database keeps the hash; the load generator sends the token
        Rollout.objects.filter(pk=rollout.pk).update(trajectory=trajectory, token=token_hash)
        tokens.append(token)
    return {"job_id": job.pk, "fleet_id": fleet.pk, "tokens": tokens}


def count_bench_records(job_id: int) -> int:
    from experience.models import Step

    return Step.objects.filter(trajectory__rollout__job_id=job_id, kind="model_call").count()


def delete_bench_rollouts(bench: dict[str, Any]) -> None:
    from experience.models import Trajectory
    from webapp.fleets.models import Fleet
    from webapp.rollouts.models import RolloutJob

    Trajectory.objects.filter(rollout__job_id=bench["job_id"]).delete()
    RolloutJob.objects.filter(pk=bench["job_id"]).delete()
    Fleet.objects.filter(pk=bench["fleet_id"]).delete()


def role_trove(port: int, upstream_url: str, sink_kind: str, workers: int, protocol: str = "chat") -> None:
    """Trove's proxy served as `run_proxy` serves it, in `workers` processes, each with its own app and
    sink. `--sink count` is one process (its counter is the process's own)."""
    sys.path.insert(0, str(REPO))
    from aiohttp import web

    from webapp.proxy.server import serve_proxy

    if sink_kind != "count":
        _django()

    def make_app() -> tuple[Any, Any]:
        if sink_kind == "count":
            app, sink, recorded_now = _counting_app(upstream_url, protocol)
        else:
            from webapp.proxy.wiring import database_sink, make_trove_proxy_app

            app, sink = make_trove_proxy_app(sink=database_sink() if sink_kind == "db" else None)
            recorded_now = lambda: -1  # noqa: E731 - counted in the database by the orchestrator

        async def recorded(request: web.Request) -> web.Response:
            await asyncio.get_running_loop().run_in_executor(None, sink.flush, 30.0)
            return web.json_response({"recorded": recorded_now()})

        app.router.add_get("/bench/recorded", recorded)
        return app, sink

    serve_proxy(make_app, workers=_trove_processes(sink_kind, workers), host="127.0.0.1", port=port)


def _counting_app(upstream_url: str, protocol: str) -> tuple[Any, Any, Any]:
    from webapp.proxy.app import Target, make_proxy_app
    from webapp.proxy.recorder import InProcessSink

    counted = [0]

    def count(batch: list[Any]) -> None:
        counted[0] += len(batch)

    sink = InProcessSink(count)
    target = Target("bench-rollout", "bench-trajectory", f"{upstream_url}/v1", "sk-upstream", allow_private_network=True,
                    protocol=protocol)

    async def resolve(token: str) -> Target | None:
        return target if token == TOKEN else None

    return make_proxy_app(resolve=resolve, sink=sink), sink, lambda: counted[0]


def role_ingest(nice: int) -> None:
    """The full stack's ingest (what beat's `trove.proxy.ingest` runs), in a loop until terminated.

    At `nice` (default 10): it is background work, and on a machine this small it shares two cores with
    the proxy, the load generator and the mock upstream, so at normal priority it takes the request
    path's CPU; lowered, it stores what the stream holds when the cores are free (`recorded_after_s`).
    """
    os.nice(nice)
    _django()
    from webapp.proxy.wiring import consumer_name, ingest_stream

    while True:
        ingest_stream(consumer=consumer_name("bench-ingest"), max_seconds=5.0)


def role_loadgen(urls: list[str], *, requests: int, concurrency: int, stream: bool, per_worker: bool = False,
                 protocol: str = "chat") -> None:
    """One URL: `requests` requests over `concurrency` connections. Several URLs: one connection each,
    one request at a time, taking turns (paired samples under the same conditions). Several URLs with
    `per_worker`: one target reached by a URL per connection (a rollout token each), pooled."""
    import aiohttp

    request = REQUESTS[protocol]
    body = json.dumps({**request, "stream": True} if stream else request).encode()
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {MASTER_KEY}"}
    if protocol == "messages":  # what an Anthropic client sends (LiteLLM reads its key from either header)
        headers.update({"anthropic-version": "2023-06-01", "x-api-key": MASTER_KEY})
    latencies: dict[str, list[float]] = {url: [] for url in urls}
    failures: dict[str, dict[str, int]] = {url: {} for url in urls}

    async def one(session: aiohttp.ClientSession, url: str) -> None:
        started = time.perf_counter()
        try:
            async with session.post(url, data=body, headers=headers) as response:
                await response.read()
                ok, reason = response.status == 200, f"status {response.status}"
        except (aiohttp.ClientError, TimeoutError) as exc:
            ok, reason = False, type(exc).__name__
        if ok:
            latencies[url].append((time.perf_counter() - started) * 1000.0)
        else:
            failures[url][reason] = failures[url].get(reason, 0) + 1

    async def worker(session: aiohttp.ClientSession, share: int, own: list[str]) -> None:
        for _ in range(share):
            for url in own:
                await one(session, url)

    async def main() -> float:
        connector = aiohttp.TCPConnector(limit=concurrency * (1 if per_worker else len(urls)))
        timeout = aiohttp.ClientTimeout(total=60)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
            shares = [
                requests // concurrency + (1 if i < requests % concurrency else 0) for i in range(concurrency)
            ]
            started = time.perf_counter()
            owns = [[urls[i % len(urls)]] if per_worker else urls for i in range(concurrency)]
            await asyncio.gather(*(worker(session, share, own) for share, own in zip(shares, owns, strict=True)))
            return time.perf_counter() - started

    loop = _new_loop()
    elapsed = loop.run_until_complete(main())
    loop.close()
    if per_worker:
        pooled_failures: dict[str, int] = {}
        for by_reason in failures.values():
            for reason, count in by_reason.items():
                pooled_failures[reason] = pooled_failures.get(reason, 0) + count
        pooled = [ms for url in urls for ms in latencies[url]]
        print(json.dumps(_summary(pooled, pooled_failures, requests, elapsed)))
        return
    summaries = {url: _summary(latencies[url], failures[url], requests, elapsed) for url in urls}
    print(json.dumps(summaries[urls[0]] if len(urls) == 1 else {"per_url": summaries}))


def _summary(latencies: list[float], failures: dict[str, int], sent: int, elapsed: float) -> dict[str, Any]:
    ordered = sorted(latencies)

    def pct(p: float) -> float | None:
        return round(ordered[min(len(ordered) - 1, int(p * len(ordered)))], 3) if ordered else None

    return {
        "sent": sent,
        "ok": len(latencies),
        "failures": failures,
        "elapsed_s": round(elapsed, 3),
        "rps": round(len(latencies) / elapsed, 1) if elapsed > 0 else None,
        "p50_ms": round(statistics.median(ordered), 3) if ordered else None,
        "p90_ms": pct(0.90),
        "p99_ms": pct(0.99),
        "latencies_ms": [round(ms, 3) for ms in latencies],
    }


# --------------------------------------------------------------------------- orchestration


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _spawn(args: list[str], *, env: dict[str, str] | None = None, log: Path) -> subprocess.Popen[bytes]:
    handle = open(log, "wb")
    return subprocess.Popen(args, stdout=handle, stderr=subprocess.STDOUT, env=env, cwd=REPO)


def _self(*args: str) -> list[str]:
    return [sys.executable, str(Path(__file__).resolve()), *args]


def _wait_ready(
    url: str,
    process: subprocess.Popen[bytes],
    log: Path,
    *,
    timeout: float,
    headers: dict[str, str] | None = None,
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{url}: the process exited:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(
                urllib.request.Request(url, headers=headers or {}), timeout=2
            ) as reply:
                if reply.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.3)
    raise RuntimeError(f"{url} did not become ready in {timeout}s:\n{log.read_text()[-3000:]}")


def _load(url: str | list[str], *, requests: int, concurrency: int, stream: bool = False,
          per_worker: bool = False, protocol: str = "chat") -> dict[str, Any]:
    urls = [url] if isinstance(url, str) else url
    args = _self("--role", "loadgen", "--requests", str(requests), "--concurrency", str(concurrency),
                 "--protocol", protocol)
    args += [arg for one in urls for arg in ("--url", one)] + (["--stream"] if stream else [])
    args += ["--per-worker"] if per_worker else []
    done = subprocess.run(args, capture_output=True, timeout=1800, check=True, cwd=REPO)
    return json.loads(done.stdout.decode().strip().splitlines()[-1])


def _litellm_config(workdir: Path, upstream_url: str, protocol: str) -> Path:
    """The mock as LiteLLM's model: an OpenAI one (its /v1/chat/completions and /v1/responses call the
    upstream's) or, for Messages, an Anthropic one (its /v1/messages calls the upstream's /v1/messages)."""
    provider, api_base = ("anthropic", upstream_url) if protocol == "messages" else ("openai", f"{upstream_url}/v1")
    path = workdir / "litellm.yaml"
    path.write_text(
        "model_list:\n"
        f"  - model_name: {MODEL}\n"
        "    litellm_params:\n"
        f"      model: {provider}/{MODEL}\n"
        f"      api_base: {api_base}\n"
        "      api_key: sk-upstream\n"
        "general_settings:\n"
        f"  master_key: {MASTER_KEY}\n"
    )
    return path


def _start_litellm(
    workdir: Path, upstream_url: str, protocol: str = "chat"
) -> tuple[subprocess.Popen[bytes] | None, str | None, str | None]:
    """(process, base URL, None) or (None, None, why it is not there)."""
    if not LITELLM_BIN.exists():
        return (
            None,
            None,
            f"LiteLLM is not installed in its own venv ({LITELLM_BIN}); install it with: {LITELLM_INSTALL}",
        )
    port = _free_port()
    # Its default configuration: Trove's DATABASE_URL / REDIS_URL would switch on LiteLLM's own database
    # (it reads the same names) and it would not start without its Prisma tooling.
    env = {key: value for key, value in os.environ.items() if key not in ("DATABASE_URL", "REDIS_URL")}
    env.update(LITELLM_LOCAL_MODEL_COST_MAP="True", LITELLM_MASTER_KEY=MASTER_KEY, LITELLM_LOG="ERROR")
    log = workdir / "litellm.log"
    process = _spawn(
        [
            str(LITELLM_BIN),
            "--config",
            str(_litellm_config(workdir, upstream_url, protocol)),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--num_workers",
            "1",
        ],
        env=env,
        log=log,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_ready(f"{url}/health/liveliness", process, log, timeout=180)
    except RuntimeError as exc:
        process.terminate()
        return None, None, f"LiteLLM did not start: {exc}"
    return process, url, None


PHASES = ("unloaded", "load", "stream")
LOADED_PHASES = ("load", "stream")


def _phase_load(phase: str, requests: int, rounds: int, protocol: str = "chat", stream: bool = False) -> dict[str, Any]:
    """The loadgen arguments of one round of a loaded phase (`stream`: the load phase streamed too)."""
    if phase == "load":
        return {"requests": max(100, requests // rounds), "concurrency": CONCURRENCY, "protocol": protocol,
                "stream": stream}
    return {"requests": max(100, requests // 3 // rounds), "concurrency": CONCURRENCY, "stream": True,
            "protocol": protocol}


def _measure(
    urls: dict[str, str | list[str]], requests: int, rounds: int, cpu_pids: dict[str, list[int]],
    protocol: str = "chat", stream: bool = False, recording: _Recording | None = None,
) -> dict[str, dict[str, Any]]:
    """The unloaded phase alternates between direct and one proxy at a time, one request each, so a proxy's
    samples and its baseline's are taken under the same conditions. The loaded phases run in `rounds` rounds, the targets taking
    turns within a round; latencies are pooled over the rounds, throughput is the median round's.
    A target given as a list of URLs (one per rollout token) gets one per connection. The CPU time the
    target's own processes (`cpu_pids`) spend in the plain load phase is divided by its calls: unlike
    latency, that figure hardly moves with a noisy neighbour on a shared machine.

    `recording` (the database sinks): the CPU that storing Trove's load-phase calls costs (the ingest,
    Postgres, Redis), from a drained start to the moment the round's last call is stored."""
    for url in urls.values():  # pools, caches, lazy imports
        _load(url, requests=WARMUP_REQUESTS, concurrency=CONCURRENCY, per_worker=isinstance(url, list),
              protocol=protocol, stream=stream)
    firsts = {name: url[0] if isinstance(url, list) else url for name, url in urls.items()}
    results: dict[str, dict[str, Any]] = {}
    for name in (name for name in firsts if name != "direct"):  # each proxy paired with direct
        pair = _load([firsts["direct"], firsts[name]], requests=max(100, requests // 6), concurrency=1,
                     protocol=protocol, stream=stream)["per_url"]
        results[name] = {"unloaded": _without_samples(pair[firsts[name]])}
        results[name]["unloaded"]["direct_p50_ms"] = pair[firsts["direct"]]["p50_ms"]
        results.setdefault("direct", {"unloaded": _without_samples(pair[firsts["direct"]])})
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {name: {p: [] for p in LOADED_PHASES} for name in urls}
    cpu_s = dict.fromkeys(urls, 0.0)
    trove_sent = WARMUP_REQUESTS + results["trove"]["unloaded"]["sent"]
    recording_s = 0.0
    for phase in LOADED_PHASES:
        for _ in range(rounds):
            for name, url in urls.items():
                measured_recording = recording is not None and name == "trove" and phase == "load"
                if measured_recording:
                    recording.drain(trove_sent)
                    recording_before = recording.cpu()
                before = _cpu_seconds(cpu_pids[name])
                runs[name][phase].append(
                    _load(url, **_phase_load(phase, requests, rounds, protocol, stream),
                          per_worker=isinstance(url, list)))
                if phase == "load":
                    cpu_s[name] += _cpu_seconds(cpu_pids[name]) - before
                if name == "trove":
                    trove_sent += runs[name][phase][-1]["sent"]
                if measured_recording:
                    recording.drain(trove_sent)
                    recording_s += recording.cpu() - recording_before
    for name in urls:
        results[name].update({phase: _pooled(runs[name][phase]) for phase in LOADED_PHASES})
        results[name]["load"]["cpu_ms_per_call"] = round(1000 * cpu_s[name] / results[name]["load"]["sent"], 3)
    if recording is not None:
        results["trove"]["load"]["recording_cpu_ms_per_call"] = round(
            1000 * recording_s / results["trove"]["load"]["sent"], 3)
    return results


def _cpu_seconds(pids: list[int]) -> float:
    """User + system CPU time of the processes and all their descendants (Linux /proc)."""
    tick = os.sysconf("SC_CLK_TCK")
    stats = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue  # gone meanwhile
            stats[int(entry.name)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / tick)  # ppid, cpu
    total, todo, seen = 0.0, list(pids), set()
    while todo:
        pid = todo.pop()
        if pid in seen or pid not in stats:
            continue
        seen.add(pid)
        total += stats[pid][1]
        todo += [child for child, (ppid, _) in stats.items() if ppid == pid]
    return total


def _settled_cpu(pids: list[int], timeout: float = 60.0) -> float:
    """The processes' CPU time once it stops growing (two 0.5 s samples apart by under 20 ms)."""
    deadline = time.monotonic() + timeout
    last = _cpu_seconds(pids)
    while time.monotonic() < deadline:
        time.sleep(0.5)
        now = _cpu_seconds(pids)
        if now - last < 0.02:
            return now
        last = now
    return last


def _without_samples(summary: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in summary.items() if key not in ("latencies_ms", "rps", "elapsed_s")}


def _pooled(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    latencies = [ms for one in rounds for ms in one["latencies_ms"]]
    failures: dict[str, int] = {}
    for one in rounds:
        for reason, count in one["failures"].items():
            failures[reason] = failures.get(reason, 0) + count
    pooled = _summary(latencies, failures, sum(one["sent"] for one in rounds), 0.0)
    pooled["elapsed_s"] = round(sum(one["elapsed_s"] for one in rounds), 3)
    pooled["rps"] = round(statistics.median(one["rps"] for one in rounds if one["rps"] is not None), 1)
    pooled["rps_rounds"] = [one["rps"] for one in rounds]
    return _without_samples(pooled) | {"rps": pooled["rps"], "rps_rounds": pooled["rps_rounds"]}


def _sent(results: dict[str, dict[str, Any]]) -> int:
    return WARMUP_REQUESTS + sum(phase["sent"] for phase in results.values())


def _recorded(trove_url: str, expected: int, bench: dict[str, Any] | None) -> int:
    """Calls recorded: counted by the proxy's writer (--sink count), or model_call steps in the database."""
    # Records are put after each answer is sent: wait a little for the last ones to be queued (and, through
    # the stream, for the ingest to store them).
    deadline = time.monotonic() + (10 if bench is None else 120)
    while True:
        with urllib.request.urlopen(f"{trove_url}/bench/recorded", timeout=60) as reply:  # flushes the sink
            recorded = int(json.loads(reply.read())["recorded"])
        if bench is not None:
            recorded = count_bench_records(bench["job_id"])
        if recorded >= expected or time.monotonic() > deadline:
            return recorded
        time.sleep(0.5)


def _keys(
    results: dict[str, dict[str, dict[str, Any]] | None],
    recorded_fraction: float,
    litellm_missing: str | None,
) -> dict[str, Any]:
    def get(target: str, phase: str, key: str) -> Any:
        found = results.get(target)
        return found[phase][key] if found else None

    def minus(a: float | None, b: float | None) -> float | None:
        return round(a - b, 3) if a is not None and b is not None else None

    direct_p50, trove_p50, litellm_p50 = (
        get(t, "unloaded", "p50_ms") for t in ("direct", "trove", "litellm")
    )
    litellm_direct_p50 = get("litellm", "unloaded", "direct_p50_ms")  # its own pair's baseline
    keys: dict[str, Any] = {
        "direct_p50_ms": direct_p50,
        "trove_p50_ms": trove_p50,
        "trove_p99_ms": get("trove", "unloaded", "p99_ms"),
        "litellm_p50_ms": litellm_p50,
        "trove_added_p50_ms": minus(trove_p50, direct_p50),
        "litellm_added_p50_ms": minus(litellm_p50, litellm_direct_p50),
        "direct_rps": get("direct", "load", "rps"),
        "trove_rps": get("trove", "load", "rps"),
        "litellm_rps": get("litellm", "load", "rps"),
        "recorded_fraction": recorded_fraction,
    }
    for target in ("direct", "trove", "litellm"):
        keys[f"{target}_loaded_p50_ms"] = get(target, "load", "p50_ms")
        keys[f"{target}_loaded_p99_ms"] = get(target, "load", "p99_ms")
        keys[f"{target}_stream_p50_ms"] = get(target, "stream", "p50_ms")
        keys[f"{target}_stream_rps"] = get(target, "stream", "rps")
    keys["trove_added_loaded_p50_ms"] = minus(keys["trove_loaded_p50_ms"], keys["direct_loaded_p50_ms"])
    # CPU per call of each target's own processes (direct: the mock upstream's, the scale of the rest)
    keys["upstream_cpu_ms_per_call"] = get("direct", "load", "cpu_ms_per_call")
    keys["trove_cpu_ms_per_call"] = get("trove", "load", "cpu_ms_per_call")
    keys["litellm_cpu_ms_per_call"] = get("litellm", "load", "cpu_ms_per_call")
    if keys["trove_rps"] and keys["litellm_rps"]:
        keys["trove_over_litellm_rps"] = round(keys["trove_rps"] / keys["litellm_rps"], 1)
    if keys["trove_rps"] and keys["direct_rps"]:
        keys["trove_over_direct_rps"] = round(keys["trove_rps"] / keys["direct_rps"], 3)
    if litellm_missing:
        keys["litellm_missing_reason"] = litellm_missing
    return keys


def _start_private_redis(workdir: Path) -> tuple[subprocess.Popen[bytes], str]:
    """A redis-server for this run only (no snapshots), so its CPU time is all the benchmark's."""
    import redis

    port = _free_port()
    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit("--sink stream: redis-server is needed (a private one measures Redis's share of the work)")
    process = _spawn([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                      "--dir", str(workdir)], log=workdir / "redis.log")
    url = f"redis://127.0.0.1:{port}/0"
    deadline = time.monotonic() + 20
    while True:
        try:
            redis.Redis.from_url(url).ping()
            return process, url
        except redis.ConnectionError:
            if time.monotonic() > deadline or process.poll() is not None:
                raise RuntimeError(f"the private redis-server did not start: {(workdir / 'redis.log').read_text()}") from None
            time.sleep(0.1)


class _BackendCpu:
    """CPU time of the Postgres backends serving the benchmark's database (the proxy's token checks, the
    writer or the ingest; not this process's own), sampled every 0.2 s so a backend that ends meanwhile
    still counts up to its last sample. Postgres runs locally: its backends' /proc is readable."""

    def __init__(self) -> None:
        import threading

        import psycopg
        from django.db import connection

        settings = connection.settings_dict
        self._conn = psycopg.connect(dbname=settings["NAME"], user=settings["USER"], password=settings["PASSWORD"] or None,
                                     host=settings["HOST"] or None, port=settings["PORT"] or None, autocommit=True)
        self._cpu: dict[int, float] = {}
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        with self._lock:
            self._sample_now()

    def _sample_now(self) -> None:
        rows = self._conn.execute("SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                                  "AND pid <> pg_backend_pid()").fetchall()
        for (pid,) in rows:
            try:
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            self._cpu[pid] = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def _run(self) -> None:
        while not self._done.wait(0.2):
            self._sample()

    def total(self) -> float:
        self._sample()
        return sum(self._cpu.values())

    def stop(self) -> float:
        if not self._done.is_set():
            self._done.set()
            self._thread.join()
            self._sample()
            self._conn.close()
        return sum(self._cpu.values())


class _Recording:
    """What storing Trove's calls costs, measured around its load rounds: the CPU of the ingest process (if
    any), the database backends and the private Redis (if any); `drain(n)` waits until n calls are stored."""

    def __init__(self, backends: _BackendCpu, pids: list[int], job_id: int) -> None:
        self._backends, self._pids, self._job_id = backends, pids, job_id

    def cpu(self) -> float:
        return self._backends.total() + _cpu_seconds(self._pids)

    def drain(self, sent: int, timeout: float = 300.0) -> None:
        deadline = time.monotonic() + timeout
        while count_bench_records(self._job_id) < sent:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{sent} calls sent, {count_bench_records(self._job_id)} stored after {timeout}s")
            time.sleep(0.2)


def _total_cpu(keys: dict[str, Any]) -> dict[str, Any]:
    """Trove's CPU per call in the load phase: its proxy's, and that of storing the calls (the ingest,
    Postgres, Redis) measured around the same rounds."""
    if keys.get("trove_cpu_ms_per_call") is None:
        return {}
    total = round(keys["trove_cpu_ms_per_call"] + (keys.get("recording_cpu_ms_per_call") or 0.0), 3)
    out: dict[str, Any] = {"trove_total_cpu_ms_per_call": total}
    if keys.get("litellm_cpu_ms_per_call"):
        out["trove_total_over_litellm_cpu"] = round(total / keys["litellm_cpu_ms_per_call"], 3)
    return out


def _trove_processes(sink_kind: str, workers: int) -> int:
    return 1 if sink_kind == "count" else max(1, workers)


def _check_environment(sink_kind: str) -> None:
    if sink_kind == "count":
        return
    if not (os.environ.get("DATABASE_URL") or "").startswith(("postgres://", "postgresql://")):
        raise SystemExit(f"--sink {sink_kind}: set DATABASE_URL to a migrated Postgres (and SECRET_KEY)")
    if sink_kind == "stream" and not os.environ.get("REDIS_URL"):
        raise SystemExit("--sink stream: set REDIS_URL (the proxy records through the Redis stream)")
    _django()


def orchestrate(requests: int, sink_kind: str, skip_litellm: bool, rounds: int, keep: bool = False,
                ingest_nice: int = 10, workers: int = 1, protocol: str = "chat", stream: bool = False) -> dict[str, Any]:
    workdir = Path(tempfile.mkdtemp(prefix="trove-bench-proxy-"))
    processes: list[subprocess.Popen[bytes]] = []
    redis_process: subprocess.Popen[bytes] | None = None
    backends: _BackendCpu | None = None
    bench: dict[str, Any] | None = None
    if sink_kind == "stream":  # a Redis of its own: all of its CPU is what Trove's recording made it do
        redis_process, os.environ["REDIS_URL"] = _start_private_redis(workdir)
    _check_environment(sink_kind)
    try:
        upstream_port, trove_port = _free_port(), _free_port()
        upstream_url, trove_url = f"http://127.0.0.1:{upstream_port}", f"http://127.0.0.1:{trove_port}"
        upstream_log, trove_log = workdir / "upstream.log", workdir / "trove.log"
        processes.append(_spawn(_self("--role", "upstream", "--port", str(upstream_port)), log=upstream_log))
        if sink_kind != "count":  # a running rollout per connection, as a job's harnesses would be
            bench = create_bench_rollouts(f"{upstream_url}/v1", CONCURRENCY, protocol)
            backends = _BackendCpu()
        env = dict(
            os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
        )
        trove_args = ["--role", "trove", "--port", str(trove_port), "--upstream", upstream_url, "--sink", sink_kind]
        trove_args += ["--workers", str(workers), "--protocol", protocol]
        processes.append(_spawn(_self(*trove_args), env=env, log=trove_log))
        if sink_kind == "stream":
            processes.append(_spawn(_self("--role", "ingest", "--ingest-nice", str(ingest_nice)), env=env,
                                    log=workdir / "ingest.log"))
        _wait_ready(f"{upstream_url}/v1/models", processes[0], upstream_log, timeout=30)
        _wait_ready(f"{trove_url}/healthz", processes[1], trove_log, timeout=60)
        # The ingest's start (Django, imports) is not per-call work: its CPU is counted from once it idles.
        ingest_cpu_at_start = _settled_cpu([processes[2].pid]) if sink_kind == "stream" else 0.0
        litellm_url: str | None = None
        litellm_missing: str | None = "skipped (--skip-litellm)"
        if not skip_litellm:
            litellm, litellm_url, litellm_missing = _start_litellm(workdir, upstream_url, protocol)
            if litellm is not None:
                processes.append(litellm)
        tokens = [TOKEN] if bench is None else bench["tokens"]
        path = PROTOCOL_PATHS[protocol]
        trove_urls = [f"{trove_url}/r/{token}{path}" for token in tokens]
        urls: dict[str, str | list[str]] = {
            "direct": f"{upstream_url}{path}",
            "trove": trove_urls[0] if bench is None else trove_urls,
        }
        if litellm_url:
            urls["litellm"] = f"{litellm_url}{path}"
        cpu_pids = {"direct": [processes[0].pid], "trove": [processes[1].pid]}
        if litellm_url:
            cpu_pids["litellm"] = [processes[-1].pid]
        recording = None
        if backends is not None and bench is not None:
            extra = [processes[2].pid] if sink_kind == "stream" else []
            extra += [redis_process.pid] if redis_process is not None else []
            recording = _Recording(backends, extra, bench["job_id"])
        results: dict[str, Any] = _measure(urls, requests, rounds, cpu_pids, protocol, stream, recording)
        expected = _sent(results["trove"])
        measured = time.monotonic()
        recorded_fraction = round(_recorded(trove_url, expected, bench) / expected, 4)
        recorded_after_s = round(time.monotonic() - measured, 2)
        for name, phases in results.items():
            for phase, figures in phases.items():
                print(f"{name:8s} {phase:9s} {json.dumps(figures)}")
        keys = {**_keys(results, recorded_fraction, litellm_missing), "sink": sink_kind,
                "recorded_after_s": recorded_after_s, "trove_processes": _trove_processes(sink_kind, workers),
                "litellm_processes": 1 if litellm_url else None}
        if sink_kind == "stream":  # the ingest process's whole run, over every call it stored
            ingest_cpu = _cpu_seconds([processes[2].pid]) - ingest_cpu_at_start
            keys["ingest_cpu_ms_per_call"] = round(1000 * ingest_cpu / expected, 3)
            keys["ingest_nice"] = ingest_nice
            assert redis_process is not None
            keys["redis_cpu_ms_per_call"] = round(1000 * _cpu_seconds([redis_process.pid]) / expected, 3)
        if backends is not None:  # the database work of the token checks and of storing the records
            keys["postgres_cpu_ms_per_call"] = round(1000 * backends.stop() / expected, 3)
        keys["recording_cpu_ms_per_call"] = results["trove"]["load"].get("recording_cpu_ms_per_call")
        keys.update(_total_cpu(keys), protocol=protocol, stream=stream)
        keys["failed_calls"] = {name: sum(sum(figures["failures"].values()) for figures in phases.values())
                                for name, phases in results.items()}
        return keys
    finally:
        if backends is not None:
            backends.stop()
        for process in reversed(processes):
            process.terminate()
        for process in processes:
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
        if redis_process is not None:
            redis_process.terminate()
            redis_process.wait(timeout=15)
        shutil.rmtree(workdir, ignore_errors=True)
        if bench is not None and not keep:
            delete_bench_rollouts(bench)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--role", choices=["orchestrate", "upstream", "trove", "loadgen", "ingest"], default="orchestrate"
    )
    parser.add_argument("--port", type=int)
    parser.add_argument("--upstream")
    parser.add_argument("--url", action="append", default=[])
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--concurrency", type=int, default=CONCURRENCY)
    parser.add_argument("--stream", action="store_true")
    parser.add_argument("--per-worker", action="store_true")
    parser.add_argument("--sink", choices=["count", "db", "stream"], default="stream")
    parser.add_argument("--ingest-nice", type=int, default=10,
                        help="--sink stream: the ingest process's niceness (0: the request path's priority)")
    parser.add_argument("--keep", action="store_true", help="--sink db|stream: keep the benchmark's rollouts")
    parser.add_argument("--skip-litellm", action="store_true")
    parser.add_argument("--workers", type=int, default=1,
                        help="Trove's proxy processes (run_proxy's own default is one per CPU; --sink count: 1)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds per phase")
    parser.add_argument("--protocol", choices=sorted(PROTOCOL_PATHS), default="chat",
                        help="the API every target is called in (Trove passes it through; LiteLLM serves it too)")
    args = parser.parse_args()
    if args.role == "upstream":
        role_upstream(args.port)
    elif args.role == "trove":
        role_trove(args.port, args.upstream, args.sink, args.workers, args.protocol)
    elif args.role == "loadgen":
        role_loadgen(args.url, requests=args.requests, concurrency=args.concurrency, stream=args.stream,
                     per_worker=args.per_worker, protocol=args.protocol)
    elif args.role == "ingest":
        role_ingest(args.ingest_nice)
    else:
        print(json.dumps(orchestrate(args.requests, args.sink, args.skip_litellm, args.rounds, args.keep,
                                     args.ingest_nice, args.workers, args.protocol, args.stream)))


if __name__ == "__main__":
    main()
