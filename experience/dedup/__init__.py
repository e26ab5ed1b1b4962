"""Duplicate detection for trajectories, free of the ORM.

`signature` turns a `TrajectoryRecord` into an exact hash and a short text; `embed` turns texts into
unit vectors; `index` is the FAISS cache over those vectors; `cluster` groups items into duplicate
clusters (batch) or places one new item (incremental). The services layer feeds them rows and writes the
results back; nothing here imports Django. See README.md for the thresholds and how they were measured.
"""
