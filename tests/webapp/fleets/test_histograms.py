"""Latency histograms: buckets, trimming, percentiles. No database."""

from __future__ import annotations

from webapp.fleets.histograms import histogram, percentile


def test_values_land_in_their_buckets_and_empty_ends_are_trimmed():
    h = histogram([3, 4, 4.9, 12, 150])
    assert [(b.label, b.count) for b in h.bins] == [
        ("2 ms–5 ms", 3), ("5 ms–10 ms", 0), ("10 ms–20 ms", 1), ("20 ms–50 ms", 0), ("50 ms–100 ms", 0),
        ("100 ms–200 ms", 1)]
    assert h.bins[0].pct == 100.0 and h.bins[2].pct == 33.3


def test_percentiles_are_nearest_rank():
    values = list(range(1, 101))
    assert (percentile(values, 50), percentile(values, 99), percentile(values, 100)) == (50, 99, 100)
    h = histogram([float(v) for v in values])
    assert (h.n, h.p50, h.p90, h.p99, h.max) == (100, 50, 90, 99, 100)


def test_the_open_ends_are_labelled():
    h = histogram([0.2, 90_000])
    assert h.bins[0].label == "< 1 ms" and h.bins[-1].label == "≥ 60 s"


def test_no_values_no_bins():
    assert histogram([]).n == 0 and histogram([]).bins == []
