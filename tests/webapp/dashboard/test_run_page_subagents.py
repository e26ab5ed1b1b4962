"""A run imported with subagents (Claude Code, ATIF v1.7, Harbor) links to them from its page, and each links back."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth import get_user_model

from experience.models import Trajectory
from experience.services.importing import trajectories_import_file
from tests.experience.importers.fixture_files import ATIF_V17, HARBOR_BUILT

pytestmark = pytest.mark.django_db


def linked(client, pk: int) -> dict[int, str]:
    """The run page's links to linked runs: {run id: the line's words before the link}."""
    page = client.get(f"/trajectories/{pk}/").content.decode()
    line = re.search(r'<p class="muted" id="linked-runs">(.*?)</p>', page, re.DOTALL)
    assert line, "the page shows no linked runs"
    return {int(m.group(1)): m.group(0) for m in re.finditer(r'/trajectories/(\d+)/"', line.group(1))}


def test_a_parent_links_to_its_subagents_and_each_subagent_back(client):
    client.force_login(get_user_model().objects.create_user("reader"))
    trajectories_import_file(path=HARBOR_BUILT / "result.json")
    parent = Trajectory.objects.get(source_ref="harbor:5a1c9e7d-0f3b-4e2a-8c6d-9b4f2e1a7c30")
    children = list(Trajectory.objects.filter(metadata__parent_source_ref=parent.source_ref).order_by("id"))

    assert set(linked(client, parent.pk)) == {c.pk for c in children} and len(children) == 2
    for child in children:
        assert set(linked(client, child.pk)) == {parent.pk}


def test_a_run_with_no_links_shows_none(client):
    client.force_login(get_user_model().objects.create_user("reader"))
    trajectories_import_file(path=ATIF_V17)
    child = Trajectory.objects.get(source_ref="atif:harbor-golden-run/traj_child_golden")
    child.metadata = {}
    child.save(update_fields=["metadata"])
    assert 'id="linked-runs"' not in client.get(f"/trajectories/{child.pk}/").content.decode()
