"""Writers that turn TrajectoryRecords into files: Trove's own lossless JSONL (`trove_jsonl`) and ATIF
(`atif`). ORM-free: they take records, so a service streams rows into records and hands them over."""
