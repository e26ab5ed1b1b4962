"""What deduplication costs and how well it works: embedders, the FAISS index, and the whole pipeline.

Phases (each can be shrunk or skipped by flag):

- calibrate: the real SWE-agent fixtures (../shared/fixtures/trajectories, or under TROVE_SHARED_DIR): per embedder, the lowest
  cosine within the 8 marshmallow-1867 runs (one task, eight agent configurations) and within the three
  runs of the missing-colon issue (same work under three task keys), the single-linkage height of each
  group (the highest threshold at which union-find still joins all of it), the highest cosine between runs of
  different problems, and the highest cosine between a run and another problem's actions under the first
  run's task head (a stand-in for "same task, different approach"). README.md's thresholds come from here.
- real pairs (`--real-pairs`, on by default): the hand-labelled pairs of real runs in
  tests/fixtures/dedup/pair_labels.jsonl (several attempts at one task by one agent, different agents on one
  task, different tasks; its README says how they were labelled). Every labelled run is read by Trove's
  importers, all of them are clustered together the way the service's batch path does (exact hash, then
  cosine >= the embedder's threshold, single linkage, within task), and a pair is predicted duplicate when
  both runs land in one cluster. Pair precision / recall for both embedders at their service thresholds
  (`real_precision_lexical`, `real_recall_lexical`, `real_precision_minilm`, `real_recall_minilm`), the
  counts per kind and the pairs judged wrong; `real_marked_*` count a pair as predicted only when its runs
  also share an outcome (the service's duplicate marks, what a dataset build leaves out); beside them the
  same across tasks and a threshold sweep. These are the quality figures to quote.
- synthetic runs: `--n` TrajectoryRecords from templates (5,000 tasks x 20 runs at the default 100,000).
  Per task a few plans; each run replays a plan with fresh temp dirs and line numbers (an exact duplicate
  after normalisation), or with one or two edits (a near duplicate), or is a new plan (a distinct run).
  The plan a run came from is the ground truth for pair precision / recall of the clusters
  (`synthetic_quality`). The variations are exactly what the normaliser removes, so these figures say the
  pipeline works as built, not how well it judges real runs: the real pairs above do that.
- embed_per_s: lexical on all runs; MiniLM on the first `--minilm-n` (whole tasks, so the two embedders'
  cluster quality can also be compared on the same runs).
- index: `VectorIndex.rebuild` over the lexical vectors (the PQ scan + exact re-rank layout at this
  size, its candidate count tuned for plain recall@10 with the dedup threshold as a second target), then
  for 1,000 held-out runs (random runs kept out of the index, so mostly new runs of indexed tasks):
  single-vector query p50 (and the exact flat index's p50 in the same run), recall@10 against brute
  force, recall@10 of the true neighbours at or above the threshold, the same figures over a sweep of the
  candidate count, and (`with_tombstones`) the tuned figures again after removing every tenth id, against
  brute force over the ids left.
- end_to_end_s: normalise + hash + signature + lexical embedding + index build + clustering of all `--n`
  runs (generation of the synthetic records is not counted).
- million (`--million`, on by default): the same for the lexical vectors of `--million-n` more synthetic
  runs (generated and embedded in chunks; generation not timed). Targets: p50 < 5 ms, recall >= 0.99.

The last line printed is one JSON object.

    .venv/bin/python benchmarks/dedup.py [--n 100000] [--minilm-n 2000] [--no-million] [--no-calibrate]
    .venv/bin/python benchmarks/dedup.py --n 5000 --minilm-n 400 --million-n 100000   # a quick run
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import itertools
import json
import os
import random
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import faiss
import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from experience.dedup.canonical import outcome_of  # noqa: E402
from experience.dedup.cluster import Assignment, DedupItem, cluster_items  # noqa: E402
from experience.dedup.embed import Embedder, get_embedder  # noqa: E402
from experience.dedup.index import VectorIndex, recall_at_k  # noqa: E402
from experience.dedup.signature import action_sequence, exact_hash, signature_text  # noqa: E402
from experience.importers import read_all  # noqa: E402
from experience.records import StepRecord, TrajectoryRecord  # noqa: E402

SHARED_DIR = Path(os.environ.get("TROVE_SHARED_DIR") or REPO.parent / "shared")
FIXTURES_DIR = SHARED_DIR / "fixtures" / "trajectories"
FIXTURES = FIXTURES_DIR / "swe-agent"
PAIR_LABELS = REPO / "tests" / "fixtures" / "dedup" / "pair_labels.jsonl"
REAL_SWEEP = {"lexical": (0.80, 0.85, 0.88, 0.90, 0.92, 0.95), "minilm": (0.90, 0.93, 0.95, 0.96, 0.97)}
PAIR_KINDS = ("same_agent_same_task", "different_agents_same_task", "different_tasks")
RUNS_PER_TASK = 20
QUERIES = 1000
K = 10
RERANK_SWEEP = (50, 100, 200, 400, 800)

WORDS = (
    "parser serializer field value rounding precision timezone datetime schema nested list dict cache "
    "request response header token session config loader plugin registry handler retry timeout buffer "
    "stream encoder decoder widget layout render column index query filter order limit offset cursor "
    "migration model manager signal worker queue task result error warning exception fails crashes "
    "returns wrong missing unexpected empty negative overflow unicode bytes path file directory"
).split()


def log(message: str) -> None:
    print(message, flush=True)


def timed(function: Callable[[], Any]) -> tuple[Any, float]:
    start = time.perf_counter()
    result = function()
    return result, time.perf_counter() - start


# ---------------------------------------------------------------------------------------------- synthetic


@dataclasses.dataclass
class Plan:
    steps: list[tuple[str, tuple]]
    file: str
    symbol: str
    fix: str


@dataclasses.dataclass
class Task:
    key: str
    instruction: str
    files: list[str]
    symbols: list[str]


def make_task(number: int, rng: random.Random) -> Task:
    package = f"pkg{number % 97}"
    symbols = [f"{rng.choice(WORDS)}_{rng.choice(WORDS)}" for _ in range(4)]
    files = [f"src/{package}/{rng.choice(WORDS)}.py" for _ in range(3)]
    issue = " ".join(rng.choice(WORDS) for _ in range(60))
    return Task(f"org__repo{number % 211}-{number}", f"{symbols[0]} {issue} in {files[0]}", files, symbols)


def make_plan(task: Task, rng: random.Random) -> Plan:
    """One approach to the task: its own exploration, whether it reproduces first, the file it fixes, the
    fix, how it tests. Volatile parts (line numbers, temp dirs) are filled in per run by `render`."""
    file, symbol = rng.choice(task.files), rng.choice(task.symbols)
    fix = f"{rng.choice(task.symbols)}({rng.choice(WORDS)}, {rng.choice(WORDS)}={rng.choice(WORDS)})"
    steps: list[tuple[str, tuple]] = [("ls -F", ())] if rng.random() < 0.7 else []
    for _ in range(rng.randint(2, 5)):
        steps.append(
            rng.choice(
                [
                    ("grep -rn {0} src/", (rng.choice(task.symbols),)),
                    ("cat {0}", (rng.choice(task.files),)),
                    ("find_file {0} src", (rng.choice(task.files).rsplit("/", 1)[-1],)),
                    ("python -c 'import {0}; print({0}.{1})'", (rng.choice(WORDS), rng.choice(task.symbols))),
                    ("git log --oneline -5 -- {0}", (rng.choice(task.files),)),
                ]
            )
        )
    reproduce = rng.random() < 0.6
    if reproduce:
        steps += [
            ("create reproduce.py", ()),
            (
                "edit {line}:{line}\nfrom x import {0}\nprint({0}({1}))\nend_of_edit",
                (symbol, rng.choice(WORDS)),
            ),
            ("python reproduce.py", ()),
        ]
    steps += [("open {0} {line}", (file,)), ("edit {line}:{line2}\n        return {0}\nend_of_edit", (fix,))]
    steps += rng.choice(
        [
            [("cd {tmp}/repo && pytest tests/test_{0}.py -x", (rng.choice(WORDS),))],
            [("python -m pytest -q -k {0}", (rng.choice(task.symbols),))],
            [],
        ]
    )
    if reproduce:
        steps.append(("python reproduce.py", ()))
        steps.append(("rm reproduce.py", ()))
    steps.append(("submit", ()))
    return Plan(steps, file, symbol, fix)


def mutate(steps: list[tuple[str, tuple]], task: Task, rng: random.Random) -> list[tuple[str, tuple]]:
    """One or two small edits: the kind of difference between two near-duplicate runs."""
    plan = list(steps)
    for _ in range(rng.randint(1, 2)):
        where = rng.randrange(1, len(plan) - 1)
        choice = rng.random()
        if choice < 0.35:
            plan.insert(where, ("cat {0}", (rng.choice(task.files),)))
        elif choice < 0.6:
            del plan[where]
        elif choice < 0.8:
            plan.insert(where, plan[where])  # a retried command
        else:
            plan.insert(where, ("grep -rn {0} src/", (rng.choice(task.symbols),)))
    return plan


def render(plan: list[tuple[str, tuple]], rng: random.Random) -> list[str]:
    line = rng.randint(10, 900)
    tmp = f"/tmp/tmp{rng.getrandbits(40):010x}"
    return [
        template.format(*args, line=line, line2=line + rng.randint(0, 5), tmp=tmp) for template, args in plan
    ]


def record_of(task: Task, plan: Plan, commands: list[str], run: int) -> TrajectoryRecord:
    steps = [StepRecord(kind="command", command=command, output=f"(output {run})") for command in commands]
    diff = (
        f"diff --git a/{plan.file} b/{plan.file}\n--- a/{plan.file}\n+++ b/{plan.file}\n"
        f"@@ -1,3 +1,3 @@\n context\n-    return {plan.symbol}(x)\n+    return {plan.fix}\n"
    )
    return TrajectoryRecord(
        source="rollout",
        source_format="bench",
        source_ref=f"{task.key}/{run}",
        task_key=task.key,
        instruction=task.instruction,
        final_diff=diff,
        steps=steps,
    )


def iter_synthetic_runs(seed: int = 0) -> Iterator[tuple[TrajectoryRecord, str]]:
    """Endless runs grouped by task (RUNS_PER_TASK each), each with the plan it came from (ground truth)."""
    rng = random.Random(seed)
    for number in itertools.count():
        task = make_task(number, rng)
        plans = [make_plan(task, rng)]
        for run in range(RUNS_PER_TASK):
            kind = rng.random()
            if kind < 0.2 and run:  # a different approach to the same task
                plans.append(make_plan(task, rng))
                plan_number, steps = len(plans) - 1, plans[-1].steps
            else:  # the same plan again, as is (exact after normalisation) or with an edit or two
                plan_number = rng.randrange(len(plans))
                steps = plans[plan_number].steps
                steps = steps if kind < 0.55 else mutate(steps, task, rng)
            yield record_of(task, plans[plan_number], render(steps, rng), run), f"{task.key}/{plan_number}"


def synthetic_runs(count: int, seed: int = 0) -> tuple[list[TrajectoryRecord], list[str]]:
    pairs = list(itertools.islice(iter_synthetic_runs(seed), count))
    return [record for record, _ in pairs], [family for _, family in pairs]


def held_out(count: int, total: int, seed: int) -> np.ndarray:
    """Positions of `count` runs kept out of the index to serve as queries (mostly of indexed tasks)."""
    return np.sort(np.random.default_rng(seed).choice(total, count, replace=False))


def pair_quality(assignments: list[Assignment], families: list[str]) -> dict[str, float]:
    """Pair precision / recall of the clusters against the plans the runs came from."""
    pairs = lambda counts: sum(c * (c - 1) // 2 for c in counts.values())  # noqa: E731
    clusters = Counter(a.cluster_key for a in assignments)
    truth = Counter(families)
    both = Counter(zip((a.cluster_key for a in assignments), families, strict=True))
    together, predicted, actual = pairs(both), pairs(clusters), pairs(truth)
    return {
        "pair_precision": round(together / predicted, 4) if predicted else 1.0,
        "pair_recall": round(together / actual, 4) if actual else 1.0,
        "clusters": len(clusters),
        "true_families": len(truth),
    }


# ---------------------------------------------------------------------------------------------- pipeline


def dedup_pipeline(records: list[TrajectoryRecord], embedder: Embedder) -> tuple[list[Assignment], dict]:
    """What a full re-dedup does: normalise, hash, sign, embed, build the cache index, cluster."""
    timings: dict[str, float] = {}
    actions, timings["normalise_s"] = timed(lambda: [action_sequence(record) for record in records])
    hashes, timings["hash_s"] = timed(
        lambda: [exact_hash(r, actions=a) for r, a in zip(records, actions, strict=True)]
    )
    texts, timings["signature_s"] = timed(
        lambda: [signature_text(r, actions=a) for r, a in zip(records, actions, strict=True)]
    )
    vectors, timings["embed_s"] = timed(lambda: embedder.embed(texts))
    ids = np.arange(len(records), dtype=np.int64)
    index = VectorIndex(embedder.dim, recall_floor=embedder.threshold)
    _, timings["index_s"] = timed(lambda: index.rebuild(ids, vectors))
    items = [
        DedupItem(
            id=position, task_key=record.task_key, exact_hash=hashes[position], vector=vectors[position]
        )
        for position, record in enumerate(records)
    ]
    assignments, timings["cluster_s"] = timed(lambda: cluster_items(items, threshold=embedder.threshold))
    return assignments, {
        "timings": {key: round(value, 2) for key, value in timings.items()},
        "index": index,
        "vectors": vectors,
    }


def single_query_p50_ms(index: VectorIndex, queries: np.ndarray, rerank: int | None = None) -> float:
    """One query per call, FAISS on one OpenMP thread: what a web process answering one request sees. (With
    two threads on this shared 2-core box a flat 100k search took 75 ms instead of 15 ms: the threads wait
    for each other.)"""
    threads = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(1)
    try:
        times = []
        for query in queries:
            start = time.perf_counter()
            index.search(query, K, rerank=rerank)
            times.append(time.perf_counter() - start)
    finally:
        faiss.omp_set_num_threads(threads)
    return statistics.median(times) * 1000


def index_figures(
    index: VectorIndex, ids: np.ndarray, vectors: np.ndarray, queries: np.ndarray, threshold: float
) -> dict[str, Any]:
    """The tuned index against brute force, and a sweep of the re-ranked candidate count: p50, recall@10, recall@10 of the
    neighbours at or above the dedup threshold (what dedup needs)."""
    exact = VectorIndex(index.dim, exact_threshold=len(ids) + 1)
    exact.rebuild(ids, vectors)
    truth_scores, truth_ids = exact.search(queries, K)

    def measure(rerank: int | None) -> dict[str, float]:
        scores, found = index.search(queries, K, rerank=rerank)
        return {
            "query_p50_ms": round(single_query_p50_ms(index, queries[:300], rerank), 3),
            "recall_at_10": round(recall_at_k(found, scores, truth_ids, truth_scores, k=K), 4),
            "recall_at_10_above_threshold": round(
                recall_at_k(found, scores, truth_ids, truth_scores, k=K, floor=threshold), 4
            ),
        }

    tuned = measure(None)
    sweep = {}
    for rerank in RERANK_SWEEP if index.kind == "scan" else ():
        sweep[rerank] = measure(rerank)
        log(f"  rerank {rerank}: {sweep[rerank]}")
    above = float(np.mean(truth_scores[:, 0] >= threshold))
    return {
        **tuned,
        "exact_query_p50_ms": round(single_query_p50_ms(exact, queries[:50]), 2),
        "queries_with_a_neighbour_above_threshold": round(above, 3),
        "index_kind": index.kind,
        "rerank": index.rerank,
        "tuned_recall_at_10": index.measured_recall,
        "rerank_sweep": sweep,
        "with_tombstones": tombstone_figures(index, ids, vectors, queries, threshold),
    }


def tombstone_figures(
    index: VectorIndex, ids: np.ndarray, vectors: np.ndarray, queries: np.ndarray, threshold: float
) -> dict[str, Any]:
    """Every tenth id removed (tombstoned positions, filtered at query time), then p50 and recall
    against brute force over the ids left; the ids are put back afterwards. No removed id may come back."""
    gone = ids[::10]
    kept = np.ones(len(ids), dtype=bool)
    kept[::10] = False
    index.remove(gone)
    try:
        truth_scores, rows = faiss.knn(queries, vectors[kept], K, metric=faiss.METRIC_INNER_PRODUCT)
        truth_ids = ids[kept][rows]
        scores, found = index.search(queries, K)
        return {
            "removed": len(gone),
            "tombstones": index.tombstones,
            "removed_ids_returned": int(np.isin(found, gone).sum()),
            "query_p50_ms": round(single_query_p50_ms(index, queries[:300]), 3),
            "recall_at_10": round(recall_at_k(found, scores, truth_ids, truth_scores, k=K), 4),
            "recall_at_10_above_threshold": round(
                recall_at_k(found, scores, truth_ids, truth_scores, k=K, floor=threshold), 4
            ),
        }
    finally:
        index.add(gone, vectors[::10])


# ---------------------------------------------------------------------------------------------- real pairs


@dataclasses.dataclass(frozen=True)
class LabelledPair:
    kind: str  # one of PAIR_KINDS
    a: tuple[str, int]  # (file as the labels name it, index of the run in that file)
    b: tuple[str, int]
    duplicate: bool
    note: str


def locate_run_file(file: str) -> Path:
    """A label's `file`: `fixtures:PATH` (the shared trajectories) or `repo:PATH` (this checkout)."""
    if file.startswith("fixtures:"):
        return FIXTURES_DIR / file.removeprefix("fixtures:")
    if file.startswith("repo:"):
        return REPO / file.removeprefix("repo:")
    raise ValueError(f"pair label file {file!r} must start with 'fixtures:' or 'repo:'")


def load_pair_labels(path: Path = PAIR_LABELS) -> list[LabelledPair]:
    pairs = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        row = json.loads(line)
        if row["kind"] not in PAIR_KINDS:
            raise ValueError(f"{path}:{number}: kind {row['kind']!r} is not one of {', '.join(PAIR_KINDS)}")
        side = lambda ref: (ref["file"], int(ref["index"]))  # noqa: E731
        pairs.append(LabelledPair(row["kind"], side(row["a"]), side(row["b"]), bool(row["duplicate"]), row["note"]))
    return pairs


def labelled_runs(pairs: list[LabelledPair]) -> dict[tuple[str, int], TrajectoryRecord]:
    """Every run the pairs name, read by Trove's own importers (each file once). A missing run raises."""
    files: dict[str, list[TrajectoryRecord]] = {}
    runs = {}
    for ref in sorted({ref for pair in pairs for ref in (pair.a, pair.b)}):
        file, index = ref
        if file not in files:
            files[file] = read_all(locate_run_file(file))
        if not 0 <= index < len(files[file]):
            raise ValueError(f"{file} holds {len(files[file])} runs; the labels name run {index}")
        runs[ref] = files[file][index]
    return runs


def predicted_duplicates(
    runs: dict[tuple[str, int], TrajectoryRecord], embedder: Embedder, *, across_tasks: bool = False
) -> dict[tuple[str, int], int]:
    """The cluster (canonical position) of each labelled run when the service's batch path clusters them all
    together: exact hash, then cosine >= the embedder's threshold, single linkage, within task (the
    service's default) or across tasks (its `across_tasks` option)."""
    refs = list(runs)
    records = [runs[ref] for ref in refs]
    vectors = embedder.embed([signature_text(record) for record in records])
    items = [
        DedupItem(position, record.task_key, exact_hash(record), vectors[position])
        for position, record in enumerate(records)
    ]
    assignments = cluster_items(items, threshold=embedder.threshold, across_tasks=across_tasks)
    return {ref: assignment.canonical_id for ref, assignment in zip(refs, assignments, strict=True)}


def real_pair_scores(
    pairs: list[LabelledPair],
    runs: dict[tuple[str, int], TrajectoryRecord],
    embedder: Embedder,
    *,
    across_tasks: bool = False,
    same_outcome: bool = False,
) -> dict[str, Any]:
    """Pair precision / recall of the service's clusters against the hand labels, and the counts per kind.
    With `same_outcome`, a pair is predicted duplicate only when its runs also have the same outcome: what
    the service marks as a duplicate a dataset build leaves out (`canonical.derive`)."""
    cluster_of = predicted_duplicates(runs, embedder, across_tasks=across_tasks)
    outcome_of_run = {ref: outcome_of(success=run.success, reward=run.reward) for ref, run in runs.items()}
    counts = {kind: Counter() for kind in PAIR_KINDS}
    wrong = []
    outcome = {(True, True): "tp", (True, False): "fp", (False, True): "fn", (False, False): "tn"}
    for pair in pairs:
        predicted = cluster_of[pair.a] == cluster_of[pair.b] and (
            not same_outcome or outcome_of_run[pair.a] == outcome_of_run[pair.b]
        )
        counts[pair.kind][outcome[predicted, pair.duplicate]] += 1
        if predicted != pair.duplicate:
            wrong.append(f"{outcome[predicted, pair.duplicate]} {pair.kind}: {describe(pair.a)} ~ {describe(pair.b)}")
    total = sum(counts.values(), Counter())
    return {
        "threshold": embedder.threshold,
        "precision": round(total["tp"] / (total["tp"] + total["fp"]), 4) if total["tp"] + total["fp"] else None,
        "recall": round(total["tp"] / (total["tp"] + total["fn"]), 4) if total["tp"] + total["fn"] else None,
        "by_kind": {kind: {key: counts[kind][key] for key in ("tp", "fp", "fn", "tn")} for kind in PAIR_KINDS},
        "wrong": wrong,
    }


def threshold_sweep(
    pairs: list[LabelledPair], runs: dict[tuple[str, int], TrajectoryRecord], embedder: Embedder
) -> dict[str, dict[str, float | None]]:
    """Precision / recall on the real pairs at thresholds around the service's (within task)."""
    sweep = {}
    for threshold in REAL_SWEEP[embedder.name]:
        moved = copy.copy(embedder)  # shares the loaded model; only the threshold differs
        moved.threshold = threshold
        scores = real_pair_scores(pairs, runs, moved)
        sweep[f"{threshold:.2f}"] = {"precision": scores["precision"], "recall": scores["recall"]}
    return sweep


def describe(ref: tuple[str, int]) -> str:
    file, index = ref
    return f"{file.rsplit('/', 2)[-2] if file.count('/') > 1 else file}/{file.rsplit('/', 1)[-1]}#{index}"


def real_pairs_phase() -> dict[str, Any]:
    """Both embedders on the hand-labelled pairs of real runs (tests/fixtures/dedup/README.md)."""
    pairs = load_pair_labels()
    runs = labelled_runs(pairs)
    figures: dict[str, Any] = {
        "real_pairs": len(pairs),
        "real_runs": len(runs),
        "real_duplicate_pairs": sum(pair.duplicate for pair in pairs),
    }
    for name in ("lexical", "minilm"):
        embedder = get_embedder(name)
        scores = real_pair_scores(pairs, runs, embedder)
        # Beside the service's default: what the embedder alone makes of every pair, other tasks included.
        across = real_pair_scores(pairs, runs, embedder, across_tasks=True)
        scores["across_tasks"] = {key: across[key] for key in ("precision", "recall", "by_kind", "wrong")}
        scores["sweep"] = threshold_sweep(pairs, runs, embedder)
        marked = real_pair_scores(pairs, runs, embedder, same_outcome=True)
        scores["marked"] = {key: marked[key] for key in ("precision", "recall", "by_kind", "wrong")}
        log(f"real pairs {name}: {scores}")
        figures[f"real_precision_{name}"] = scores["precision"]
        figures[f"real_recall_{name}"] = scores["recall"]
        figures[f"real_marked_precision_{name}"] = marked["precision"]
        figures[f"real_marked_recall_{name}"] = marked["recall"]
        figures[f"real_{name}"] = scores
    return figures


# ---------------------------------------------------------------------------------------------- phases


def calibrate() -> dict[str, Any]:
    from experience.importers.swe_agent import parse

    records = [
        record
        for path in sorted(FIXTURES.rglob("*.traj"))
        for record in parse(path)
        if any(step.kind == "command" for step in record.steps)
    ]
    works = [work_of(record) for record in records]
    heads = {work: record for work, record in zip(reversed(works), reversed(records), strict=True)}
    swapped = [
        (a, dataclasses.replace(b, task_key=a.task_key, instruction=a.instruction))
        for work_a, a in heads.items()
        for work_b, b in heads.items()
        if work_a != work_b
    ]
    figures: dict[str, Any] = {"runs": len(records)}
    for name in ("lexical", "minilm"):
        embedder = get_embedder(name)
        vectors = embedder.embed([signature_text(record) for record in records])
        similarity = vectors @ vectors.T
        first = embedder.embed([signature_text(a) for a, _ in swapped])
        second = embedder.embed([signature_text(b) for _, b in swapped])
        figures[name] = {"threshold": embedder.threshold}
        for label, work in (
            ("marshmallow", "marshmallow-code__marshmallow-1867"),
            ("missing_colon", "missing-colon"),
        ):
            members = [position for position, other in enumerate(works) if other == work]
            block = similarity[np.ix_(members, members)]
            figures[name][f"{label}_within_min"] = round(float(block.min()), 3)
            figures[name][f"{label}_linkage"] = round(linkage_height(similarity, members), 3)
        different = np.array(works)[:, None] != np.array(works)[None, :]
        figures[name]["cross_problem_max"] = round(float(similarity[different].max()), 3)
        figures[name]["same_head_other_actions_max"] = round(float((first * second).sum(axis=1).max()), 3)
        log(f"calibrate {name}: {figures[name]}")
    return figures


def work_of(record: TrajectoryRecord) -> str:
    """The problem a fixture run solves: three files solve the same missing-colon issue under three keys."""
    same_issue = record.task_key.lower() in {"swe-agent__test-repo-i1", "function_calling_simple"}
    return "missing-colon" if same_issue else record.task_key


def linkage_height(similarity: np.ndarray, members: list[int]) -> float:
    """The highest threshold at which single linkage still joins all members: the weakest edge of the
    maximum spanning tree (Prim's algorithm)."""
    joined, best, height = {members[0]}, similarity[members[0]].copy(), 1.0
    while len(joined) < len(members):
        weight, nearest = max((best[m], m) for m in members if m not in joined)
        height = min(height, float(weight))
        joined.add(nearest)
        best = np.maximum(best, similarity[nearest])
    return height


def synthetic_phase(args: argparse.Namespace) -> dict[str, Any]:
    (all_records, all_families), generate_s = timed(lambda: synthetic_runs(args.n + QUERIES))
    queries_at = set(held_out(QUERIES, len(all_records), seed=3).tolist())
    records = [r for i, r in enumerate(all_records) if i not in queries_at]
    families = [f for i, f in enumerate(all_families) if i not in queries_at]
    query_records = [all_records[i] for i in sorted(queries_at)]
    log(f"generated {len(records)} runs (+{len(query_records)} held out as queries) in {generate_s:.1f}s")

    lexical = get_embedder("lexical")
    start = time.perf_counter()
    assignments, details = dedup_pipeline(records, lexical)
    end_to_end_s = time.perf_counter() - start
    quality = pair_quality(assignments, families)
    duplicates = sum(a.is_duplicate for a in assignments)
    exact = sum(a.match == "exact" for a in assignments)
    log(
        f"end to end {end_to_end_s:.1f}s {details['timings']}; {duplicates} duplicates ({exact} exact); {quality}"
    )

    index, vectors = details["index"], details["vectors"]
    texts = [signature_text(r) for r in records]
    _, lexical_embed_s = timed(lambda: lexical.embed(texts))
    queries = lexical.embed([signature_text(r) for r in query_records])
    ids = np.arange(len(records), dtype=np.int64)
    _, index_build_s = timed(
        lambda: VectorIndex(lexical.dim, recall_floor=lexical.threshold).rebuild(ids, vectors)
    )
    log(f"index {index.kind} rerank={index.rerank}: build {index_build_s:.1f}s")
    figures = index_figures(index, ids, vectors, queries, lexical.threshold)
    log(f"index: {figures}")

    minilm_figures = minilm_phase(
        records[: args.minilm_n], families[: args.minilm_n], vectors[: args.minilm_n]
    )
    return {
        "n": len(records),
        "embed_per_s": {
            "lexical": round(len(texts) / lexical_embed_s, 1),
            "minilm": minilm_figures.pop("per_s"),
        },
        "index_build_s": round(index_build_s, 2),
        **figures,
        "end_to_end_s": round(end_to_end_s, 2),
        "end_to_end_parts_s": details["timings"],
        "duplicates_marked": duplicates,
        "exact_duplicates": exact,
        "synthetic_quality": {"lexical": quality, "minilm_subset": minilm_figures},
    }


def minilm_phase(records: list[TrajectoryRecord], families: list[str], lexical_vectors: np.ndarray) -> dict:
    """MiniLM's speed, and both embedders' cluster quality on the same (smaller) set of runs."""
    if not records:
        return {"per_s": None}
    minilm = get_embedder("minilm")
    texts = [signature_text(r) for r in records]
    minilm.embed(texts[:8])  # load the model outside the timing
    vectors, seconds = timed(lambda: minilm.embed(texts))
    hashes = [exact_hash(r) for r in records]
    quality = {}
    for name, embedded, threshold in (
        ("minilm", vectors, minilm.threshold),
        ("lexical", lexical_vectors, get_embedder("lexical").threshold),
    ):
        items = [DedupItem(i, r.task_key, hashes[i], embedded[i]) for i, r in enumerate(records)]
        quality[name] = pair_quality(cluster_items(items, threshold=threshold), families)
    log(f"minilm {len(texts)} texts in {seconds:.1f}s; quality on these runs {quality}")
    return {"per_s": round(len(texts) / seconds, 1), "n": len(records), **quality}


def million_phase(args: argparse.Namespace) -> dict[str, Any]:
    """Lexical vectors of `--million-n` synthetic runs, built in chunks so the records never all exist."""
    lexical = get_embedder("lexical")
    total = args.million_n + QUERIES
    vectors = np.empty((total, lexical.dim), dtype=np.float32)
    runs = iter_synthetic_runs(seed=11)
    start = time.perf_counter()
    for offset in range(0, total, 20_000):
        chunk = [record for record, _ in itertools.islice(runs, min(20_000, total - offset))]
        vectors[offset : offset + len(chunk)] = lexical.embed([signature_text(record) for record in chunk])
    log(f"million: {total} synthetic runs generated and embedded in {time.perf_counter() - start:.0f}s")
    query_rows = held_out(QUERIES, total, seed=5)
    queries = vectors[query_rows]
    vectors = np.delete(vectors, query_rows, axis=0)
    ids = np.arange(len(vectors), dtype=np.int64)
    index = VectorIndex(lexical.dim, recall_floor=lexical.threshold)
    _, build_s = timed(lambda: index.rebuild(ids, vectors))
    log(
        f"million: {index.kind} rerank={index.rerank} (tuned {index.measured_recall}) in {build_s:.0f}s"
    )
    figures = index_figures(index, ids, vectors, queries, lexical.threshold)
    log(f"million: {figures}")
    return {"n": len(vectors), "dim": lexical.dim, "index_build_s": round(build_s, 1), **figures}


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--n", type=int, default=100_000, help="synthetic runs deduplicated end to end")
    parser.add_argument("--minilm-n", type=int, default=2000, help="runs embedded with MiniLM (0 skips)")
    parser.add_argument("--million", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--million-n", type=int, default=1_000_000)
    parser.add_argument("--calibrate", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--real-pairs", action=argparse.BooleanOptionalAction, default=True)
    args = parser.parse_args()

    result: dict[str, Any] = {}
    if args.real_pairs:
        result.update(real_pairs_phase())
    if args.calibrate:
        result["calibration"] = calibrate()
    result = {**synthetic_phase(args), **result}
    if args.million:
        result["million"] = million_phase(args)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
