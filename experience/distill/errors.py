"""The errors distillation raises. The build service maps them to its own error vocabulary (a bad spec is
a 400 naming the field; an empty dataset is a 409/422), so each carries what a caller needs to say why."""

from __future__ import annotations


class DistillError(Exception):
    """Base class: anything distillation refuses to do."""


class SpecError(DistillError, ValueError):
    """A dataset spec field has a bad value. `field` names it, so an API can point at it."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class EmptyDatasetError(DistillError):
    """The spec matched no rows: nothing to build, and no version should be recorded."""


class UnorderedInputError(DistillError):
    """Records for one task arrived in two separate runs of the stream.

    Pairing and per-task balancing buffer one task at a time, so they need records ordered by task key.
    """

    def __init__(self, task_key: str) -> None:
        super().__init__(f"records for task {task_key!r} are not contiguous; order the input by task key")
        self.task_key = task_key
