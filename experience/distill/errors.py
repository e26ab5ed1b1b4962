"""The errors distillation raises.

User-facing ones extend the store's vocabulary (`experience.errors`), so the API's exception handler maps
them without knowing this package: a bad spec is a 400 naming the field, an empty dataset a 422. Errors
that mean the calling code is wrong (unordered input, a row that no longer fits its schema) are plain
`RuntimeError`s: a 500 and a bug report, not a message for a user.
"""

from __future__ import annotations

from experience.errors import TroveError, ValidationError


class DistillError(TroveError):
    """Base class for what a dataset build refuses to do."""


class SpecError(DistillError, ValidationError):
    """A dataset spec field has a bad value. `field` names it, so an API can point at it."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}", field=field)


class EmptyDatasetError(DistillError):
    """The spec matched no rows: nothing to build, and no version should be recorded."""

    status_code = 422
    code = "empty_dataset"


class UnorderedInputError(RuntimeError):
    """Records for one task arrived in two separate stretches of the stream.

    Pairing and per-task balancing buffer one task at a time, so they need records ordered by task key.
    """

    def __init__(self, task_key: str) -> None:
        super().__init__(f"records for task {task_key!r} are not contiguous; order the input by task key")
        self.task_key = task_key


class RowShapeError(RuntimeError):
    """A row does not fit the declared Parquet schema of its kind (a field the schema does not know)."""


class TokenizerUnavailable(DistillError):
    """The tokenizer an operator named for an endpoint (TROVE_RL_TOKENIZERS) cannot be loaded: the server's
    configuration is wrong, not the caller's request, so a 503 that names the endpoint, the file and why."""

    status_code = 503
    code = "tokenizer_unavailable"
