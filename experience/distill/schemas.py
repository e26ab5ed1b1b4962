"""Declared Parquet schemas, one per row kind.

Declaring them (rather than inferring from the first rows) keeps every file of a kind readable as one
table: a first batch without tool calls cannot fix a schema that a later batch breaks. Free-form JSON
(`tool_calls`) is stored as a JSON string. Rows are checked against these schemas when written, so a row
field added without a schema change fails loudly in tests.
"""

from __future__ import annotations

import pyarrow as pa

from experience.distill.digest import STATS_KEYS
from experience.distill.rubric import LABELS

MESSAGE = pa.struct(
    [
        ("role", pa.string()),
        ("content", pa.string()),
        ("name", pa.string()),
        ("tool_call_id", pa.string()),
        ("tool_calls", pa.string()),  # JSON
        ("weight", pa.int8()),
    ]
)
MESSAGES = pa.list_(MESSAGE)
RUBRIC = pa.struct([(label, pa.bool_()) for label in LABELS])
# Curators' step labels (experience.services.step_labels): which step, the label, the note.
STEP_LABELS = pa.list_(pa.struct([("step", pa.int32()), ("label", pa.string()), ("note", pa.string())]))
STATS = pa.struct([(key, pa.int64()) for key in STATS_KEYS])

_IDENTITY = [
    ("kind", pa.string()),
    ("task_key", pa.string()),
    ("task_set", pa.string()),
    ("group_key", pa.string()),
    ("split", pa.string()),
]

SCHEMAS: dict[str, pa.Schema] = {
    "value": pa.schema(
        _IDENTITY
        + [
            ("trajectory_id", pa.string()),
            ("step_index", pa.int32()),
            ("step_count", pa.int32()),
            ("record_step", pa.int32()),
            ("messages", MESSAGES),
            ("action", MESSAGE),
            ("target_value", pa.float64()),
            ("outcome", pa.bool_()),
            ("reward", pa.float64()),
            ("rubric", RUBRIC),
            ("stats", STATS),
            ("step_labels", STEP_LABELS),
        ]
    ),
    "outcome": pa.schema(
        _IDENTITY
        + [
            ("trajectory_id", pa.string()),
            ("step_count", pa.int32()),
            ("messages", MESSAGES),
            ("outcome", pa.bool_()),
            ("reward", pa.float64()),
            ("rubric", RUBRIC),
            ("stats", STATS),
            ("step_labels", STEP_LABELS),
        ]
    ),
    "pairwise": pa.schema(
        _IDENTITY
        + [
            ("prompt", MESSAGES),
            ("chosen", MESSAGES),
            ("rejected", MESSAGES),
            ("chosen_trajectory_id", pa.string()),
            ("rejected_trajectory_id", pa.string()),
            ("chosen_reward", pa.float64()),
            ("rejected_reward", pa.float64()),
            ("chosen_step_labels", STEP_LABELS),
            ("rejected_step_labels", STEP_LABELS),
        ]
    ),
    "sft": pa.schema(
        _IDENTITY
        + [
            ("trajectory_id", pa.string()),
            ("messages", MESSAGES),
            ("outcome", pa.bool_()),
            ("reward", pa.float64()),
            ("mode", pa.string()),
            ("harmful_step", pa.int32()),
            ("harmful_decision", pa.int32()),
            ("step_count", pa.int32()),
            ("trained_turns", pa.int32()),
            ("step_labels", STEP_LABELS),
        ]
    ),
    "rl": pa.schema(
        _IDENTITY
        + [
            ("trajectory_id", pa.string()),
            ("job_id", pa.int64()),
            ("rollout_sample_index", pa.int32()),
            ("sample_index", pa.int32()),
            ("token_ids", pa.list_(pa.int32())),
            ("loss_mask", pa.list_(pa.int8())),
            ("logprobs", pa.list_(pa.float64())),
            ("exact", pa.bool_()),
            ("calls", pa.list_(pa.int32())),
            ("policy_version", pa.string()),
            ("fork_cause", pa.string()),
            ("fork_message_index", pa.int32()),
            ("fork_token_index", pa.int32()),
            ("reward", pa.float64()),
            ("outcome", pa.bool_()),
            ("process_rewards", pa.list_(pa.struct([("step", pa.int32()), ("label", pa.string())]))),
        ]
    ),
}


def schema_for_kind(kind: str) -> pa.Schema:
    return SCHEMAS[kind]
