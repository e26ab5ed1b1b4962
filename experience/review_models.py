"""Review queues: a fixed list of runs (from an explorer filter, or a random sample of it) that curators work
through one run at a time, or of pairs of runs of the same task to judge one against the other. Imported by experience.models, so these are the experience app's models.

Several curators share a queue: each takes the next open item with a claim that expires (as fleets lease
sandboxes), so no two review the same run at once, and a curator who walks away gives the run back when the
claim runs out. An item is decided once (approve / reject / skip); the decision is also a curation of the run.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models


class ReviewQueue(models.Model):
    class Kind(models.TextChoices):
        RUNS = "runs"  # one run per item: approve / reject / skip
        PAIRS = "pairs"  # two runs of a task per item: which is better, and why (a PairwisePreference)

    name = models.CharField(max_length=200)
    kind = models.CharField(max_length=8, choices=Kind.choices, default=Kind.RUNS)
    filters = models.JSONField(default=dict, blank=True, help_text="the explorer filters it was made from")
    sample = models.PositiveIntegerField(null=True, blank=True, help_text="a random sample of this many, or all")
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)
    # The queue behind the ad-hoc pairs page (/pairs/): its items are the pairs that page offered, so curators
    # there share the queues' claims. Not listed with the queues people make.
    adhoc = models.BooleanField(default=False)

    class Meta:
        ordering = ["-id"]
        constraints = [models.UniqueConstraint(fields=["kind"], condition=models.Q(adhoc=True),
                                               name="review_queue_one_adhoc_per_kind")]

    def __str__(self) -> str:
        return self.name or f"queue {self.pk}"


class ReviewItem(models.Model):
    class Decision(models.TextChoices):
        APPROVE = "approve"
        REJECT = "reject"
        SKIP = "skip"
        FIRST = "first"  # a pair: `trajectory` is the better run
        SECOND = "second"  # a pair: `other` is the better run

    queue = models.ForeignKey(ReviewQueue, on_delete=models.CASCADE, related_name="items")
    trajectory = models.ForeignKey("experience.Trajectory", on_delete=models.CASCADE, related_name="+")
    other = models.ForeignKey("experience.Trajectory", null=True, blank=True, on_delete=models.CASCADE,
                              related_name="+", help_text="a pairs queue: the run compared with `trajectory`")
    position = models.PositiveIntegerField()
    claimed_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="+")
    claimed_until = models.DateTimeField(null=True, blank=True)
    decision = models.CharField(max_length=16, choices=Decision.choices, blank=True)
    reason = models.TextField(blank=True)
    decided_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="+")
    decided_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["queue", "trajectory"], condition=models.Q(other__isnull=True),
                                    name="review_item_once_per_queue"),
            models.UniqueConstraint(fields=["queue", "trajectory", "other"], condition=models.Q(other__isnull=False),
                                    name="review_pair_once_per_queue"),
        ]
        # The claim's scan: a queue's open items in order.
        indexes = [models.Index(fields=["queue", "decision", "position"], name="review_item_open_idx")]

    def __str__(self) -> str:
        return f"run {self.trajectory_id} in queue {self.queue_id}"


class PairwisePreference(models.Model):
    """A curator's choice between two runs of the same task: `chosen` did better than `rejected`, and why.
    The pairwise dataset kind takes these pairs before its automatic ones (success against failure)."""

    task_key = models.CharField(max_length=300, db_index=True)
    chosen = models.ForeignKey("experience.Trajectory", on_delete=models.CASCADE, related_name="+")
    rejected = models.ForeignKey("experience.Trajectory", on_delete=models.CASCADE, related_name="+")
    reason = models.TextField()
    actor = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                              related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["chosen", "rejected"], name="preference_once_per_pair")]

    def __str__(self) -> str:
        return f"{self.chosen_id} over {self.rejected_id}"


class SavedFilter(models.Model):
    """An explorer filter a curator named, to open again later: theirs alone, or shared with everyone who
    can read runs. `filters` holds query parameters as experience.search reads them (validated on save)."""

    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    name = models.CharField(max_length=100)
    filters = models.JSONField(default=dict)
    shared = models.BooleanField(default=False)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name", "id"]
        constraints = [models.UniqueConstraint(fields=["owner", "name"], name="saved_filter_name_per_owner")]
        # The explorer's menu: a user's own, and everyone's shared ones.
        indexes = [models.Index(fields=["shared"], name="saved_filter_shared_idx", condition=models.Q(shared=True))]

    def __str__(self) -> str:
        return self.name
