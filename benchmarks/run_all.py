"""Every benchmark, then one table: figure, baseline, ratio, target, verdict (met / not met).

    DATABASE_URL=postgres://... REDIS_URL=redis://... SECRET_KEY=... .venv/bin/python benchmarks/run_all.py --quick
    .venv/bin/python benchmarks/run_all.py                      # the full sizes (hours on a 2-core machine)
    .venv/bin/python benchmarks/run_all.py --quick --only lifecycle,rollouts --list

`make bench` runs it with `--quick`: small sizes, so the whole run takes minutes; the quick figures are noisier
than the full ones, and a target stated for the full size (n=1000 lifecycles in 30 s) is scaled to the quick
size. Each benchmark runs as its own process (its command is printed, with the full-size one); the figures are
read from the JSON object on its last line of output. A benchmark that cannot run here (no Postgres, no
LiteLLM venv, no kube-apiserver) gets rows that say why instead of a verdict, and the run goes on. Its whole
output is kept in var/bench-logs/<name>.log. Exit status: 0 when every figure that was measured met its target,
1 otherwise. `--json PATH` writes the rows as JSON as well (what docs/benchmarks.md's figures come from).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse, urlunparse

REPO = Path(__file__).resolve().parent.parent
LOG_DIR = REPO / "var" / "bench-logs"
LITELLM_BIN = REPO / "var" / "bench-venvs" / "litellm" / "bin" / "litellm"


@dataclass(frozen=True)
class Figure:
    """One row: `key` (a dotted path into the benchmark's JSON) judged against `target`.

    `baseline` is the key of the figure it is compared with (the same run's floor), if any; then the ratio
    key/baseline is what the target bounds. `op` is one of <=, <, >=, >, ==, with `limit` the bound, or empty
    for a figure reported beside the others with no target of its own. `per_full_size` scales a figure of
    the run's size (Bench.size_key) to the full size, where its target is stated."""

    label: str
    key: str
    op: str = ""
    limit: float = 0.0
    baseline: str = ""
    per_full_size: bool = False


@dataclass(frozen=True)
class Bench:
    name: str
    script: str
    quick: list[str]
    full: list[str]
    figures: list[Figure]
    needs: tuple[str, ...] = ("DATABASE_URL",)
    timeout_quick: float = 900
    timeout_full: float = 6 * 3600
    size_key: str = ""  # the JSON key holding the run's size, for per_full_size figures
    full_size: float = 0.0
    extra: Callable[[], list[str]] = field(default=lambda: [])  # arguments worked out at run time


def scratch_database_url(name: str) -> str:
    """DATABASE_URL's server with another database name (benchmarks that keep a store of their own)."""
    parsed = urlparse(os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/trove"))
    return urlunparse(parsed._replace(path=f"/{name}"))


def litellm_args() -> list[str]:
    return [] if LITELLM_BIN.exists() else ["--skip-litellm"]


BENCHES = [
    Bench("lifecycle", "sandbox_lifecycle.py", ["--n", "100", "--claims", "0"], ["--n", "1000", "--claims", "0"], [
        Figure("exec p50 vs agent floor p50", "exec_p50_ms", "<=", 1.5, baseline="agent_floor_p50_ms"),
        Figure("exec p99 vs agent floor p99", "exec_p99_ms", "<=", 3.0, baseline="agent_floor_p99_ms"),
        Figure("success rate", "success_rate", "==", 1.0),
        Figure("leaked (procs+dirs+cgroups+mounts)", "leaked", "==", 0),
        Figure("seconds per 1000 lifecycles", "seconds", "<", 30, per_full_size=True),
    ], needs=(), size_key="n", full_size=1000, timeout_quick=600),
    Bench("claims", "claims.py", ["--n", "60"], ["--n", "500"], [
        Figure("warm claim -> first exec p50 (ms)", "claim_to_first_exec_p50_ms", "<", 20),
        Figure("same exec straight to the agent p50 (ms)", "exec_floor_p50_ms"),
        Figure("warm claim -> first exec p99 (ms)", "claim_to_first_exec_p99_ms", "<", 100),
    ], timeout_quick=600),
    Bench("rollouts", "rollout_throughput.py", ["--rollouts", "30", "--query-sample", "1"], [], [
        Figure("Trove overhead per rollout (ms)", "trove_overhead_ms_per_rollout", "<", 50),
        Figure("  of it: sandbox create + destroy (ms)", "sandbox_lifecycle_ms"),
        Figure("  of it: exec round trips past the command (ms)", "exec_round_trip_ms"),
        Figure("  of it: other bookkeeping (ms)", "bookkeeping_ms"),
        Figure("  of it: dispatch idle (ms)", "dispatch_idle_ms"),
        Figure("overhead without sandbox create/destroy (ms)", "overhead_without_lifecycle_ms"),
    ], needs=("DATABASE_URL", "REDIS_URL"), timeout_quick=900),
    Bench("ingest", "ingest.py", ["--runs", "60", "--rounds", "1", "--orm-runs", "2"], [], [
        Figure("bulk ingest vs COPY (no digests)", "bulk_steps_per_s", ">=", 0.5, baseline="copy_steps_per_s"),
        Figure("ingest + digest pass vs COPY", "bulk_with_digests_steps_per_s", ">=", 0.5,
               baseline="copy_steps_per_s"),
        Figure("bulk ingest steps/s (no digests)", "bulk_steps_per_s", ">=", 20_000),
        Figure("bytes/step without blobs vs with", "bytes_per_step_without_blobs", ">=", 5.0,
               baseline="bytes_per_step_with_blobs"),
    ], timeout_quick=600),
    Bench("distill", "distill.py", ["--runs", "1000"], [], [
        Figure("first build (no digests) vs COPY", "first_build_rows_per_s", ">=", 0.25, baseline="copy_rows_per_s"),
        Figure("build on kept digests vs COPY", "rows_per_s", ">=", 0.25, baseline="copy_rows_per_s"),
        Figure("read path vs COPY", "read_rows_per_s", ">=", 0.25, baseline="copy_rows_per_s"),
        Figure("peak RSS, whole store vs a tenth", "peak_rss_mb_1m", "<=", 1.5, baseline="peak_rss_mb_100k"),
    ], timeout_quick=900, extra=lambda: ["--database-url", scratch_database_url("trove_bench_distill_quick")]),
    Bench("proxy", "proxy_overhead.py", ["--requests", "600", "--rounds", "1"], [], [
        Figure("calls recorded", "recorded_fraction", "==", 1.0),
        Figure("added latency p50 (ms) over direct", "trove_added_p50_ms", "<", 1.0),
        Figure("Trove rps vs direct rps", "trove_rps", ">=", 0.2, baseline="direct_rps"),
        Figure("Trove rps vs LiteLLM rps", "trove_rps", ">=", 50, baseline="litellm_rps"),
        Figure("Trove CPU/call with its recording's (ingest, Postgres, Redis) vs LiteLLM's",
               "trove_total_cpu_ms_per_call", "<=", 0.1, baseline="litellm_cpu_ms_per_call"),
    ], needs=("DATABASE_URL", "REDIS_URL"), timeout_quick=900, extra=litellm_args),
    Bench("kube", "kube_lifecycle.py", ["--n", "20", "--baseline-n", "5"], [], [
        Figure("success rate", "success_rate", "==", 1.0),
        Figure("leaked (pods+secrets+agents)", "leaked", "==", 0),
        Figure("API calls per sandbox vs floor", "api_calls_per_sandbox", baseline="api_calls_floor"),
        Figure("speed-up over one at a time", "speedup_vs_sequential"),
    ], needs=(), timeout_quick=600),
    Bench("dedup", "dedup.py", ["--n", "5000", "--minilm-n", "100", "--million-n", "100000"], [], [
        Figure("lexical pair precision, real labelled pairs", "real_precision_lexical"),
        Figure("lexical pair recall, real labelled pairs", "real_recall_lexical"),
        Figure("MiniLM pair precision, real labelled pairs", "real_precision_minilm"),
        Figure("MiniLM pair recall, real labelled pairs", "real_recall_minilm"),
        Figure("lexical pair precision, synthetic", "synthetic_quality.lexical.pair_precision"),
        Figure("lexical pair recall, synthetic", "synthetic_quality.lexical.pair_recall"),
        Figure("index query p50 (ms), million phase", "million.query_p50_ms", "<", 5.0),
        Figure("index recall@10, million phase", "million.recall_at_10", ">=", 0.99),
    ], needs=(), timeout_quick=900),
    Bench("rubric", "rubric.py", [], [], [
        Figure("min precision over labels", "min_precision", ">=", 0.9),
        Figure("min recall over labels", "min_recall", ">=", 0.9),
    ], needs=(), timeout_quick=600),
    # 8 samples: with 4, dedup marks some of each task's runs duplicate and no test task keeps the 4 best-of-4
    # needs; 8 folds: after the first fold's embedding a fold costs seconds, and 2 folds held 0 or 1 test task
    Bench("value", "value_baseline.py", ["--samples", "8", "--folds", "8"], [], [
        Figure("learned best-of-4 vs random (points)", "learned_bestof4_gain", ">=", 0.05),
        Figure("baseline best-of-4 vs random (points)", "bestof4_gain"),
        Figure("baseline held-out AUC", "heldout_auc"),
        Figure("learned held-out AUC", "learned_heldout_auc"),
    ], timeout_quick=1800, extra=lambda: ["--database-url", scratch_database_url("trove_bench_value_quick")]),
    Bench("embedded_search", "embedded_search.py", ["--runs", "1000"], ["--runs", "2000"], [
        Figure("SQLite search: FTS5 speed-up over the substring scan", "search_speedup", ">=", 10),
        Figure("SQLite search p50 (ms)", "search_p50_ms"),
        Figure("SQLite ingest with the FTS5 index vs without", "ingest_steps_per_s", ">=", 0.5,
               baseline="ingest_floor_steps_per_s"),
    ], needs=(), timeout_quick=600),
]


def derived(name: str, figures: dict[str, Any]) -> dict[str, Any]:
    """Figures a row needs that the benchmark gives in parts."""
    if name == "value":
        for prefix in ("", "learned_"):
            reranked, random = (figures.get(f"{prefix}heldout_bestof4_{kind}") for kind in ("reranked", "random"))
            if isinstance(reranked, (int, float)) and isinstance(random, (int, float)):
                figures[f"{prefix}bestof4_gain"] = round(reranked - random, 4)
    return figures


def lookup(figures: dict[str, Any], dotted: str) -> Any:
    value: Any = figures
    for part in dotted.split("."):
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return value


def command(bench: Bench, *, quick: bool) -> list[str]:
    """The benchmark's command line, run from the checkout (paths relative to it, as in the docs)."""
    args = bench.quick if quick else bench.full
    python = Path(sys.executable)
    if python.is_relative_to(REPO):
        python = python.relative_to(REPO)
    return [str(python), f"benchmarks/{bench.script}", *args, *bench.extra()]


def run(bench: Bench, *, quick: bool) -> tuple[dict[str, Any] | None, str, float]:
    """(the benchmark's figures, or None and why not, seconds it took)."""
    missing = [name for name in bench.needs if not os.environ.get(name)]
    if missing:
        return None, f"skipped: set {', '.join(missing)}", 0.0
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    log_path = LOG_DIR / f"{bench.name}.log"
    argv = command(bench, quick=quick)
    started = time.monotonic()
    with open(log_path, "wb") as log:
        try:
            done = subprocess.run(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=log, check=False,
                                  timeout=bench.timeout_quick if quick else bench.timeout_full)
        except subprocess.TimeoutExpired:
            return None, f"error: timed out (log: {log_path.relative_to(REPO)})", time.monotonic() - started
        log.write(b"\n--- stdout ---\n" + done.stdout)
    seconds = time.monotonic() - started
    lines = done.stdout.decode(errors="replace").strip().splitlines()
    try:
        figures = json.loads(lines[-1]) if lines else None
    except ValueError:
        figures = None
    if done.returncode != 0 or not isinstance(figures, dict):
        return None, f"error: exit {done.returncode} (log: {log_path.relative_to(REPO)})", seconds
    return derived(bench.name, figures), "", seconds


def judge(bench: Bench, figure: Figure, figures: dict[str, Any]) -> dict[str, Any]:
    value = lookup(figures, figure.key)
    baseline = lookup(figures, figure.baseline) if figure.baseline else None
    row = {"bench": bench.name, "figure": figure.label, "value": value, "baseline": baseline, "ratio": None,
           "target": target_text(figure), "verdict": ""}
    if figure.per_full_size and isinstance(value, (int, float)):
        size = lookup(figures, bench.size_key) or bench.full_size
        row["value"] = value = round(value * bench.full_size / size, 2)
    if not isinstance(value, (int, float)) or (figure.baseline and not isinstance(baseline, (int, float))):
        row["verdict"] = "missing figure"
        return row
    measured = value
    if figure.baseline:
        if not baseline:
            row["verdict"] = "missing figure"
            return row
        measured = row["ratio"] = round(value / baseline, 3)
    if not figure.op:
        row["verdict"] = "reported"
    else:
        row["verdict"] = "met" if compare(measured, figure.op, figure.limit) else "not met"
    return row


def compare(measured: float, op: str, limit: float) -> bool:
    return {"<=": measured <= limit, "<": measured < limit, ">=": measured >= limit, ">": measured > limit,
            "==": measured == limit}[op]


def target_text(figure: Figure) -> str:
    if not figure.op:
        return "-"
    subject = "ratio" if figure.baseline else "value"
    return f"{subject} {figure.op} {figure.limit:g}"


def table(rows: list[dict[str, Any]]) -> str:
    headers = ["benchmark", "figure", "value", "baseline", "ratio", "target", "verdict"]
    cells = [[r["bench"], r["figure"], fmt(r["value"]), fmt(r["baseline"]), fmt(r["ratio"]), r["target"],
              r["verdict"]] for r in rows]
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)),
             "  ".join("-" * w for w in widths)]
    lines += ["  ".join(c.ljust(w) for c, w in zip(cell, widths, strict=True)) for cell in cells]
    return "\n".join(lines)


def fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.3f}".rstrip("0").rstrip(".") if abs(value) < 1000 else f"{value:,.0f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def migrate() -> None:
    """The benchmarks that use DATABASE_URL directly expect Trove's schema there. A failure is printed, not
    fatal: those benchmarks then fail with their own error rows, and the others still run."""
    if not os.environ.get("DATABASE_URL"):
        return
    done = subprocess.run([sys.executable, "manage.py", "migrate", "--noinput", "-v", "0"], cwd=REPO,
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        print(f"manage.py migrate failed on DATABASE_URL: {done.stderr.strip().splitlines()[-1:]}", flush=True)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes: minutes, not hours")
    parser.add_argument("--only", default="", help="comma-separated benchmark names (default: all)")
    parser.add_argument("--list", action="store_true", help="print each benchmark's quick and full command, run none")
    parser.add_argument("--json", default="", help="also write the rows to this file")
    args = parser.parse_args(argv)
    chosen = [b for b in BENCHES if not args.only or b.name in args.only.split(",")]
    if args.list:
        for bench in chosen:
            print(f"{bench.name}:\n  quick: {shlex.join(command(bench, quick=True))}\n"
                  f"  full:  {shlex.join(command(bench, quick=False))}")
        return 0
    migrate()
    rows: list[dict[str, Any]] = []
    for bench in chosen:
        print(f"== {bench.name}: {shlex.join(command(bench, quick=args.quick))}", flush=True)
        figures, why, seconds = run(bench, quick=args.quick)
        print(f"   {why or 'done'} in {seconds:.0f} s", flush=True)
        for figure in bench.figures:
            rows.append(judge(bench, figure, figures) if figures else
                        {"bench": bench.name, "figure": figure.label, "value": None, "baseline": None,
                         "ratio": None, "target": target_text(figure), "verdict": why})
    print()
    print(table(rows))
    print(f"\nload average at the end: {os.getloadavg()[0]:.2f} (the machine may be shared)")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0 if all(r["verdict"] == "met" for r in rows if r["verdict"] in ("met", "not met")) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
