"""RL sample assembly from the store against the COPY floor of the same rows, and its cost per length.

    DATABASE_URL=postgres://... .venv/bin/python benchmarks/rl_samples.py [--rollouts 200] [--turns 12]
        [--demo-job N --concurrency 2]   # with REDIS_URL: also N real rollouts against the demo model

Workload: `--rollouts` runs of `--turns` model calls each, recorded through a stand-in server that returns
prompt and completion token ids and logprobs (a real byte-level BPE `tokenizers` tokenizer over a ChatML
template: tests/experience/distill/rl_traffic.py), each call made into its step by the recording proxy's
own `CallRecord.to_step_record`, stored with the rollout runner's ingest on a scratch database (created
for the run, dropped after). The stand-in server rather than demo-model jobs: the same tokenizer.json it
uses serves the re-tokenised figures, and storing 200 rollouts takes seconds, not a fleet's minutes. (The
demo model's ids chain too: tests/integration/test_rl_samples_harnesses.py assembles real harness
rollouts against it, one exact sample each.)

Figures (the last line is one JSON object):
- with --demo-job N: demo_job_rollouts, demo_job_samples, demo_job_samples_per_rollout,
  demo_job_exact_fraction, demo_job_fork_causes: the same of N built-in-harness rollouts against the demo
  model through the proxy with token capture (real sandboxes, the runner's own recording);
- rollouts, samples, samples_per_rollout, exact_fraction: what `run_samples` assembled from the store
  (20 runs a call, as a page of GET /jobs/{id}/samples/ does);
- assembly_tokens_per_s: the tokens the calls recorded (prompt + completion ids) per second of assembly,
  reading included; copy_tokens_per_s: the same tokens over the time Postgres takes to COPY the same
  model-call step rows and the blobs they refer to out (the floor: no parsing, no chaining);
  assembly_vs_copy their ratio (target >= 0.25);
- length_ratio_10x: the time to assemble, from the store, rollouts that recorded 10x the tokens (longer
  tool outputs; long_vs_short_tokens says how many times exactly) over the time for the shorter ones
  (target <= 12); retokenised_turns_ratio_10x: the same from the store for runs recorded without token ids
  (re-tokenised with the tokenizer their endpoint names, TROVE_RL_TOKENIZERS), PAGE runs of 10x the turns
  over PAGE of the shorter ones (target <= 12): each message is parsed and tokenised once, and a call's
  request is compared with the sample's history by identity of the shared messages;
  retokenised_turns_cpu_ratio_10x: the same in this process's CPU time (robust to other processes' load
  on a shared machine; Postgres's time is not in it);
  retokenised_in_memory_turns_ratio_10x: `assemble` on calls built one by one in memory (no message
  shared between calls, so each call's request is compared with the history field by field: the one
  part that grows with the square of the turns, as each request repeats the history; target <= 12), and
  retokenised_in_memory_turns_cpu_ratio_10x the same in CPU time;
- the floor of those ratios, same run: retokenised_texts_ratio_10x, how many times the distinct
  texts (message headers and bodies) the longer rollouts hold: what tokenising each once must grow by; and
  retokenised_floor_ratio_10x, this process's CPU time to tokenise each distinct text of the longer
  rollouts once (headers and bodies, a fresh tokenizer per try) over the same for the shorter ones: the
  floor of the CPU ratios; retokenised_floor_ms, that floor for one longer rollout.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from tempfile import TemporaryDirectory

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")

PAGE = 20
DEMO_MODEL = "trove-demo-stand-in"
RETOKENISED_ENDPOINT = "bench-no-ids"  # the endpoint the stored runs name; its tokenizer is the stand-in's


def recorded_run(server, turns: int, *, output_chars: int, with_ids: bool = True):
    from tests.experience.distill.rl_traffic import agent_run

    def long_outputs(turn, messages):
        return [{**m, "content": m["content"] + " ok" * (output_chars // 3)}
                if m["role"] == "tool" and m.get("tool_call_id") == f"call_{turn - 1}" else m for m in messages]

    return agent_run(server, turns, with_ids=with_ids, edit=long_outputs)


def store_runs(server, rollouts: int, turns: int, *, output_chars: int = 300, prefix: str = "bench",
               with_ids: bool = True) -> list[int]:
    from experience.records import TrajectoryRecord
    from experience.services.ingest import trajectory_ingest

    ids = []
    for index in range(rollouts):
        record = TrajectoryRecord(
            source="rollout", source_format="trove-rollout", source_ref=f"{prefix}:{index}",
            task_key=f"task-{index % 25}", status="completed", reward=float(index % 2),
            started_at=datetime.now(UTC),
            steps=recorded_run(server, turns, output_chars=output_chars, with_ids=with_ids),
            metadata={"job_id": 1, "sample_index": index // 25, "model_endpoint": RETOKENISED_ENDPOINT},
        )
        ids.append(trajectory_ingest(record=record, rollout_runner=True)[0].pk)
    return ids


def timed_assembly(ids: list[int]) -> tuple[float, dict]:
    from experience.services.rl_samples import run_samples

    started, assemblies = time.perf_counter(), {}
    for start in range(0, len(ids), PAGE):
        assemblies.update(run_samples(trajectory_ids=ids[start:start + PAGE]))
    return time.perf_counter() - started, assemblies


def timed_copy(ids: list[int]) -> tuple[float, int]:
    """COPY out the model-call step rows of the runs and the blobs they refer to: the bytes assembly reads."""
    from django.db import connection

    from experience.models import Step
    from experience.steps import referenced_hashes

    where = f"kind = 'model_call' AND trajectory_id IN ({','.join(map(str, ids))})"
    refs = Step.objects.filter(trajectory_id__in=ids, kind="model_call").values_list("blob_refs", flat=True)
    hashes = sorted({h for blob_refs in refs for h in referenced_hashes(blob_refs)})
    queries = [f"SELECT * FROM experience_step WHERE {where}",
               "SELECT * FROM experience_blob WHERE sha256 IN (" + ",".join(f"'{h}'" for h in hashes) + ")"]
    started, size = time.perf_counter(), 0
    with connection.cursor() as cursor:
        for query in queries:
            with cursor.cursor.copy(f"COPY ({query}) TO STDOUT") as copy:
                for data in copy:
                    size += len(data)
    return time.perf_counter() - started, size


def recorded_tokens(ids: list[int]) -> int:
    from experience.models import Step

    total = 0
    for payload in Step.objects.filter(trajectory_id__in=ids, kind="model_call").values_list("payload", flat=True):
        total += len(payload.get("prompt_token_ids") or []) + len(payload.get("token_ids") or [])
    return total


def best_time(function, repeat: int = 5) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        function()
        times.append(time.perf_counter() - started)
    return min(times)


def length_ratios(server, tokenizer_path: Path, turns: int) -> dict:
    """Assembly from the store of PAGE rollouts against PAGE rollouts with 10x the recorded tokens (tool
    outputs that long); in memory, message-level chaining of a rollout against one with 10x the turns."""
    from experience.distill.rl_samples import assemble, model_calls, tokenizer_encoder

    short = model_calls(recorded_run(server, turns, output_chars=300))
    chars = _ten_times_longer(server, turns, short)
    short_ids = store_runs(server, PAGE, turns, output_chars=300, prefix="short")
    long_ids = store_runs(server, PAGE, turns, output_chars=chars, prefix="long")
    few = model_calls(recorded_run(server, turns, output_chars=300, with_ids=False))
    many = model_calls(recorded_run(server, turns * 10, output_chars=300, with_ids=False))

    def retokenised(calls) -> tuple[float, float]:
        # A tokenizer loaded afresh for each try: its word cache would otherwise hold the short
        # rollout's every word after the first try, and not the long one's. Best wall and CPU time.
        walls, cpus = [], []
        for _ in range(7):
            encode = tokenizer_encoder(str(tokenizer_path))
            cpu = time.process_time()
            walls.append(best_time(lambda: assemble(calls, encode=encode), repeat=1))  # noqa: B023
            cpus.append(time.process_time() - cpu)
        return min(walls), min(cpus)

    few_stored = store_runs(server, PAGE, turns, prefix="few-no-ids", with_ids=False)
    many_stored = store_runs(server, PAGE, turns * 10, prefix="many-no-ids", with_ids=False)
    (few_wall, few_cpu), (many_wall, many_cpu) = (_retokenised_from_store(ids, tokenizer_path)
                                                  for ids in (few_stored, many_stored))
    few_floor, many_floor = (_tokenising_floor(calls, tokenizer_path) for calls in (few, many))
    (few_memory, few_memory_cpu), (many_memory, many_memory_cpu) = retokenised(few), retokenised(many)
    return {
        "length_ratio_10x": round(best_time(lambda: timed_assembly(long_ids), repeat=3)
                                  / best_time(lambda: timed_assembly(short_ids), repeat=3), 2),
        "long_vs_short_tokens": round(recorded_tokens(long_ids) / recorded_tokens(short_ids), 2),
        "retokenised_turns_ratio_10x": round(many_wall / few_wall, 2),
        "retokenised_turns_cpu_ratio_10x": round(many_cpu / few_cpu, 2),
        "retokenised_in_memory_turns_ratio_10x": round(many_memory / few_memory, 2),
        "retokenised_in_memory_turns_cpu_ratio_10x": round(many_memory_cpu / few_memory_cpu, 2),
        "retokenised_texts_ratio_10x": round(len(_distinct_texts(many)) / len(_distinct_texts(few)), 2),
        "retokenised_floor_ratio_10x": round(many_floor / few_floor, 2),
        "retokenised_floor_ms": round(many_floor * 1000, 2),
    }


def _distinct_texts(calls) -> list[str]:
    """Every header and body a rollout's messages render to, each once, in order."""
    from experience.distill.rl_samples import chatml_segments

    texts = (text for call in calls for message in [*call.messages, call.response] for text in chatml_segments(message))
    return list(dict.fromkeys(texts))


def _tokenising_floor(calls, tokenizer_path: Path) -> float:
    """The best CPU time of tokenising each distinct text of a rollout once (a fresh tokenizer per try, as
    the figures it floors load theirs): no rendering, no chaining, no comparing."""
    from experience.distill.rl_samples import tokenizer_encoder

    texts, times = _distinct_texts(calls), []
    for _ in range(7):
        encode = tokenizer_encoder(str(tokenizer_path))
        started = time.process_time()
        for text in texts:
            encode(text)
        times.append(time.process_time() - started)
    return min(times)


def _retokenised_from_store(ids: list[int], tokenizer_path: Path) -> tuple[float, float]:
    """The best wall time and the best CPU time of this process (which other processes' load does not
    inflate; the database's own time is not in it) of `run_samples` (pages of PAGE runs) on stored runs
    without token ids, re-tokenised with the tokenizer their endpoint names; the tokenizer loaded afresh for
    each try (its word cache)."""
    from django.conf import settings

    from experience.distill import rl_samples

    settings.TROVE_RL_TOKENIZERS = {RETOKENISED_ENDPOINT: str(tokenizer_path)}
    walls, cpus = [], []
    for _ in range(7):
        rl_samples._cached_encoder.cache_clear()
        cpu = time.process_time()
        elapsed, assemblies = timed_assembly(ids)
        cpus.append(time.process_time() - cpu)
        assert all(not a.exact and len(a.samples) == 1 for a in assemblies.values()), "re-tokenised, one sample"
        walls.append(elapsed)
    return min(walls), min(cpus)


def _ten_times_longer(server, turns: int, short) -> int:
    """The tool-output length at which the rollout's calls record 10x the tokens of `short`'s."""
    from experience.distill.rl_samples import model_calls

    chars = 3000
    while _tokens(model_calls(recorded_run(server, turns, output_chars=chars))) < 10 * _tokens(short):
        chars += 500
    return chars


def _tokens(calls) -> int:
    return sum(len(call.prompt_ids) + len(call.completion_ids) for call in calls)


def demo_job(rollouts: int, concurrency: int) -> dict:
    """`--demo-job N`: a job of N built-in-harness rollouts over the demo tasks against the demo model, through
    the recording proxy with the endpoint's token capture on (vLLM's fields), in local bubblewrap sandboxes,
    run by `rollout_run` on `concurrency` threads as a Celery worker would; then its samples from the store."""
    import shutil
    import tempfile
    import uuid
    from concurrent.futures import ThreadPoolExecutor

    from django.conf import settings

    from experience.services.rl_samples import run_samples
    from webapp.rollouts.endpoints import endpoint_register
    from webapp.rollouts.models import Rollout
    from webapp.rollouts.services import job_create
    from workers.demo.model import serve_in_thread
    from workers.sandboxes.local import LocalBackend
    from workers.sandboxes.registry import set_backend
    from workers.seed import seed_demo_task_set, seed_local_fleet
    from workers.stack import start_proxy

    root = Path(tempfile.mkdtemp(prefix="trove-bench-rl-sbx-", dir="/tmp"))
    root.chmod(0o711)
    settings.TROVE_SANDBOX_ROOT = root
    set_backend("local", LocalBackend(root=root))
    model_url, stop_model = serve_in_thread("127.0.0.1", 0)
    proxy, sink = start_proxy(host="127.0.0.1", port=0)
    settings.TROVE_PROXY_PUBLIC_URL = proxy.base_url
    try:
        endpoint = endpoint_register(name=f"bench-rl-{uuid.uuid4().hex[:6]}", base_url=model_url.rstrip("/"),
                                     protocol="chat", model_names=[DEMO_MODEL], allow_private_network=True,
                                     token_capture="vllm")
        task_set = seed_demo_task_set()
        keys = list(task_set.tasks.order_by("key").values_list("key", flat=True))
        job = job_create(task_set=task_set, endpoint=endpoint, model_name=DEMO_MODEL, task_keys=keys,
                         fleet=seed_local_fleet(name=f"bench-rl-{uuid.uuid4().hex[:6]}", min_warm=0, max_warm=0,
                                                max_total=concurrency * 2),
                         samples_per_task=-(-rollouts // len(keys)), max_steps=15, concurrency=concurrency,
                         enqueue=lambda rollout_id: None)
        ids = list(job.rollouts.order_by("pk").values_list("pk", flat=True))
        job.rollouts.filter(pk__in=ids[rollouts:]).delete()  # exactly N
        with ThreadPoolExecutor(max_workers=concurrency) as pool:
            list(pool.map(_run_rollout, ids[:rollouts]))
        finished = Rollout.objects.filter(job=job, status__in=(Rollout.Status.SUCCEEDED, Rollout.Status.FAILED))
        assemblies = run_samples(trajectory_ids=list(finished.values_list("trajectory_id", flat=True)))
    finally:
        sink.close()
        proxy.stop()
        stop_model()
        shutil.rmtree(root, ignore_errors=True)
    samples = [sample for assembly in assemblies.values() for sample in assembly.samples]
    causes: dict[str, int] = {}
    for assembly in assemblies.values():
        for fork in assembly.forks:
            causes[fork.cause] = causes.get(fork.cause, 0) + 1
    return {"demo_job_rollouts": len(assemblies), "demo_job_samples": len(samples),
            "demo_job_samples_per_rollout": round(len(samples) / max(1, len(assemblies)), 3),
            "demo_job_exact_fraction": round(sum(s.exact for s in samples) / max(1, len(samples)), 3),
            "demo_job_fork_causes": causes}


def _run_rollout(rollout_id: int) -> None:
    from django.db import connection

    from workers.rollout_runner import rollout_run

    try:
        rollout_run(rollout_id=rollout_id, worker=f"bench-rl-{os.getpid()}")
    finally:
        connection.close()


def measure(args: argparse.Namespace, folder: Path) -> dict:
    from tests.experience.distill.rl_traffic import TokenServer, train_tokenizer

    tokenizer_path = train_tokenizer(folder / "tokenizer.json")
    server = TokenServer(tokenizer_path)
    ids = store_runs(server, args.rollouts, args.turns)
    tokens = recorded_tokens(ids)
    timed_copy(ids)  # warm the cache for both
    copy_s, copy_bytes = timed_copy(ids)
    assembly_s, assemblies = timed_assembly(ids)
    samples = [sample for assembly in assemblies.values() for sample in assembly.samples]
    figures = {
        "rollouts": len(ids),
        "samples": len(samples),
        "samples_per_rollout": round(len(samples) / len(ids), 3),
        "exact_fraction": round(sum(sample.exact for sample in samples) / max(1, len(samples)), 3),
        "recorded_tokens": tokens,
        "copy_bytes": copy_bytes,
        "assembly_tokens_per_s": round(tokens / assembly_s),
        "copy_tokens_per_s": round(tokens / copy_s),
        "assembly_vs_copy": round(copy_s / assembly_s, 3),
    }
    figures.update(length_ratios(server, tokenizer_path, args.turns))
    if args.demo_job:
        figures.update(demo_job(args.demo_job, args.concurrency))
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rollouts", type=int, default=200)
    parser.add_argument("--turns", type=int, default=12)
    parser.add_argument("--demo-job", type=int, default=0, metavar="N",
                        help="also run a job of N built-in-harness rollouts against the demo model with token "
                             "capture (needs REDIS_URL, bubblewrap) and report its samples")
    parser.add_argument("--concurrency", type=int, default=2, help="the demo job's rollouts at a time")
    args = parser.parse_args()
    import django

    django.setup()
    from django.db import connection

    if connection.vendor != "postgresql":
        sys.exit("benchmarks/rl_samples.py measures Postgres: set DATABASE_URL=postgres://...")
    name = os.environ.get("TROVE_BENCH_DATABASE_NAME", "trove_bench_rl_samples")
    connection.settings_dict["TEST"]["NAME"] = name
    connection.creation.create_test_db(verbosity=0, autoclobber=True, serialize=False)
    try:
        with TemporaryDirectory(prefix="trove-bench-rl-") as folder:
            figures = measure(args, Path(folder))
    finally:
        connection.creation.destroy_test_db(name, verbosity=0)
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
