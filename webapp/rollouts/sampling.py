"""Sampling policies: how a job spends its budget of samples over its tasks. No database in here.

Budget: `samples_per_task × number of tasks` rollouts. Planning counts every rollout created against it,
whatever its outcome (an infra error costs a sandbox and a model's time too; refunding it would let a broken
fleet loop). What the pages and the API call *spent* is what was issued to a worker: a sample that started
(running or finished since); one still queued (waiting for a slot of the job's concurrency) is not spent yet.

- `uniform`: every task gets `samples_per_task` samples, all issued at once.
- `adaptive` (balanced adaptive rollout): a first round of `k` samples per task; after that each sample goes
  to the task where it teaches most, the highest p(1-p) on the smoothed pass rate p = (s+1)/(n+2) (a
  Beta(1,1) prior). A task whose first round always passed or always failed stops receiving budget: more
  samples of it give a training signal of zero variance. Later samples only go to mixed tasks, and a mixed
  task stays mixed, so stopping is final. Samples still running dampen a task's score (divided by 1 + open),
  which spreads concurrent samples over the mixed tasks instead of stacking them on one.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

UNIFORM, ADAPTIVE = "uniform", "adaptive"
POLICIES = (UNIFORM, ADAPTIVE)

# Why a task receives no more samples (shown per task on the job page and in the API).
ALWAYS_PASSED = "always passed"
ALWAYS_FAILED = "always failed"
NO_OUTCOMES = "no outcomes (infrastructure errors only)"
QUOTA_REACHED = "all its samples issued"
BUDGET_SPENT = "job budget spent"
JOB_ENDED = "job ended"


@dataclass(frozen=True)
class TaskTally:
    """What one task of a job has received and returned so far."""

    task_id: int
    issued: int = 0  # rollouts created, whatever their state
    started: int = 0  # of those, issued to a worker: running, or finished after running (its budget spent)
    queued: int = 0
    running: int = 0
    succeeded: int = 0
    failed: int = 0
    infra_error: int = 0
    cancelled: int = 0

    @property
    def open(self) -> int:
        return self.queued + self.running

    @property
    def outcomes(self) -> int:
        """Finished samples that say something about the task (infra errors and cancels say nothing)."""
        return self.succeeded + self.failed

    @property
    def pass_rate(self) -> float | None:
        return self.succeeded / self.outcomes if self.outcomes else None

    @property
    def smoothed_pass_rate(self) -> float:
        return (self.succeeded + 1) / (self.outcomes + 2)

    @property
    def mixed(self) -> bool:
        return self.succeeded > 0 and self.failed > 0


@dataclass(frozen=True)
class Policy:
    name: str
    samples_per_task: int
    first_round: int = 1

    @property
    def first_round_size(self) -> int:
        """Samples per task issued at the start; never more than the task's share of the budget."""
        if self.name == UNIFORM:
            return self.samples_per_task
        return max(1, min(self.first_round, self.samples_per_task))

    def budget(self, n_tasks: int) -> int:
        return self.samples_per_task * n_tasks


def score(tally: TaskTally) -> float:
    """How much one more sample of this task teaches: p(1-p) on the smoothed pass rate, damped by open ones."""
    p = tally.smoothed_pass_rate
    return p * (1 - p) / (1 + tally.open)


def stop_reason(tally: TaskTally, policy: Policy) -> str | None:
    """Why the task gets no more samples from the policy, or None while it may still get some (or still has
    samples queued or running: a task is stopped once nothing of it is left to run)."""
    if tally.open:
        return None
    if policy.name == UNIFORM:
        return QUOTA_REACHED if tally.issued >= policy.samples_per_task else None
    if tally.issued < policy.first_round_size:
        return None  # its first round is still out: nothing is known yet
    if tally.mixed:
        return None
    if tally.outcomes == 0:
        return NO_OUTCOMES
    return ALWAYS_PASSED if tally.failed == 0 else ALWAYS_FAILED


def plan(tallies: Iterable[TaskTally], policy: Policy, *, slots: int) -> list[int]:
    """Task ids to sample next, one entry per new rollout (a task may repeat). Pure and deterministic.

    `slots` is how many may be issued now (the job's concurrency minus its open rollouts). Never plans past
    the budget. Uniform jobs issue everything at creation, so they never plan more here.
    """
    tallies = list(tallies)
    if policy.name != ADAPTIVE:
        return []
    remaining = policy.budget(len(tallies)) - sum(t.issued for t in tallies)
    live = {t.task_id: t for t in tallies if t.mixed}
    picks: list[int] = []
    for _ in range(max(0, min(slots, remaining))):
        if not live:
            break
        # Highest score first; on a tie the task with fewer samples, then the lower id (deterministic).
        best = max(live.values(), key=lambda t: (round(score(t), 12), -t.issued, -t.task_id))
        picks.append(best.task_id)
        live[best.task_id] = replace(best, issued=best.issued + 1, queued=best.queued + 1)
    return picks


def may_still_spend(tallies: Iterable[TaskTally], policy: Policy) -> int:
    """How many more samples the policy could still issue (0 when every task has stopped or the budget is out)."""
    tallies = list(tallies)
    remaining = max(0, policy.budget(len(tallies)) - sum(t.issued for t in tallies))
    if policy.name != ADAPTIVE:
        return 0
    undecided = any(stop_reason(t, policy) is None for t in tallies)
    return remaining if undecided else 0


def task_summary(tally: TaskTally, policy: Policy, *, budget_left: int, job_open: bool) -> dict:
    """One row of the per-task budget table: samples spent (issued to a worker), created, queued, running,
    outcomes, pass rate and why it stopped. `budget_left`: the job's budget not yet planned."""
    reason = stop_reason(tally, policy)
    if reason is None and not tally.open:
        reason = BUDGET_SPENT if budget_left == 0 else (None if job_open else JOB_ENDED)
    return {
        "task_id": tally.task_id,
        "spent": tally.started,
        "issued": tally.issued,
        "queued": tally.queued,
        "running": tally.running,
        "open": tally.open,
        "succeeded": tally.succeeded,
        "failed": tally.failed,
        "infra_error": tally.infra_error,
        "cancelled": tally.cancelled,
        "pass_rate": None if tally.pass_rate is None else round(tally.pass_rate, 4),
        "stopped": reason is not None,
        "stopped_because": reason,
    }
