"""benchmarks/run_all.py's verdicts: a figure is judged as a ratio to the same run's baseline when it has one,
scaled to the full size when its target is stated for it, and a figure the benchmark did not give is never
counted as met."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import run_all  # noqa: E402
from run_all import Bench, Figure  # noqa: E402

BENCH = Bench("demo", "demo.py", [], [], [], size_key="n", full_size=1000)


def test_a_figure_with_a_baseline_is_judged_by_its_ratio_to_it():
    figure = Figure("exec vs floor", "exec_p50_ms", "<=", 1.5, baseline="agent_floor_p50_ms")

    met = run_all.judge(BENCH, figure, {"exec_p50_ms": 4.0, "agent_floor_p50_ms": 3.2})
    missed = run_all.judge(BENCH, figure, {"exec_p50_ms": 5.0, "agent_floor_p50_ms": 3.2})

    assert (met["ratio"], met["verdict"]) == (1.25, "met")
    assert (missed["ratio"], missed["verdict"]) == (1.562, "not met")
    assert met["baseline"] == 3.2 and met["target"] == "ratio <= 1.5"


def test_a_target_stated_for_the_full_size_is_applied_to_the_run_scaled_up():
    figure = Figure("seconds per 1000", "seconds", "<", 30, per_full_size=True)

    row = run_all.judge(BENCH, figure, {"n": 100, "seconds": 3.5})

    assert row["value"] == 35.0 and row["verdict"] == "not met"


def test_a_missing_figure_or_a_zero_baseline_is_missing_not_met():
    ratio = Figure("rps vs litellm", "trove_rps", ">=", 50, baseline="litellm_rps")
    plain = Figure("recorded", "recorded_fraction", "==", 1.0)

    assert run_all.judge(BENCH, ratio, {"trove_rps": 3000, "litellm_rps": None})["verdict"] == "missing figure"
    assert run_all.judge(BENCH, ratio, {"trove_rps": 3000, "litellm_rps": 0})["verdict"] == "missing figure"
    assert run_all.judge(BENCH, plain, {})["verdict"] == "missing figure"


def test_nested_figures_are_read_by_their_dotted_path_and_untargeted_ones_are_reported():
    figure = Figure("pair recall", "quality.lexical.pair_recall")

    row = run_all.judge(BENCH, figure, {"quality": {"lexical": {"pair_recall": 0.97}}})

    assert (row["value"], row["target"], row["verdict"]) == (0.97, "-", "reported")


def test_the_value_models_gain_over_random_is_derived_for_both_models():
    figures = run_all.derived("value", {"heldout_bestof4_reranked": 0.7, "heldout_bestof4_random": 0.6,
                                        "learned_heldout_bestof4_reranked": 0.62,
                                        "learned_heldout_bestof4_random": 0.6})

    assert figures["bestof4_gain"] == 0.1 and figures["learned_bestof4_gain"] == 0.02


def test_a_benchmark_that_needs_a_missing_service_is_skipped_with_the_reason(monkeypatch):
    monkeypatch.delenv("REDIS_URL", raising=False)
    bench = Bench("needs-redis", "rollout_throughput.py", [], [], [], needs=("REDIS_URL",))

    figures, why, _ = run_all.run(bench, quick=True)

    assert figures is None and why == "skipped: set REDIS_URL"


def test_a_benchmark_is_run_and_its_last_json_line_read(tmp_path, monkeypatch):
    script = tmp_path / "fake_bench.py"
    script.write_text("import json\nprint('progress 1/2')\nprint(json.dumps({'x': 2, 'base': 4}))\n")
    monkeypatch.setattr(run_all, "LOG_DIR", tmp_path / "logs")
    monkeypatch.setattr(run_all, "command", lambda bench, quick: [sys.executable, str(script)])
    bench = Bench("fake", "fake_bench.py", [], [], [Figure("x vs base", "x", "<=", 0.5, baseline="base")], needs=())

    figures, why, _ = run_all.run(bench, quick=True)

    assert why == "" and figures == {"x": 2, "base": 4}
    assert run_all.judge(bench, bench.figures[0], figures)["verdict"] == "met"
    assert "progress 1/2" in (tmp_path / "logs" / "fake.log").read_text()


def test_a_benchmark_that_fails_is_an_error_row_naming_its_log(tmp_path, monkeypatch):
    script = tmp_path / "broken_bench.py"
    script.write_text("import sys\nprint('{\"x\": 1}')\nsys.exit(3)\n")
    monkeypatch.setattr(run_all, "LOG_DIR", tmp_path / "logs")
    monkeypatch.setattr(run_all, "REPO", tmp_path)
    monkeypatch.setattr(run_all, "command", lambda bench, quick: [sys.executable, str(script)])
    bench = Bench("broken", "broken_bench.py", [], [], [], needs=())

    figures, why, _ = run_all.run(bench, quick=True)

    assert figures is None and why == "error: exit 3 (log: logs/broken.log)"
