"""Distillation: stored runs into value-model training sets, without touching the database.

Everything here works on `experience.records` dataclasses streamed in as `SourceRun`s and streams rows
out; the build service owns the queries, the `Dataset` / `DatasetVersion` rows and the files' storage.

Entry points:
- `build.distill(runs, spec, out_dir=...)`: one pass to per-split JSONL.gz + Parquet files and a manifest.
- `build.rows_for(runs, spec)`: the rows of the spec's kind (`values.value_rows`, `values.outcome_rows`,
  `pairwise.pairwise_rows`, `credit.sft_rows`).
- `rubric.rubric(record)`, `credit.first_harmful_step(record)`, `baseline.train / auc / best_of_n /
  score_steps`.
"""
