"""A run's page shows its curation history: who changed what, from what to what, and why."""

from __future__ import annotations

import html

import pytest
from django.contrib.auth import get_user_model

from experience.services.curation import trajectories_curate, trajectories_outcome_set
from tests.experience.services.store_factories import RunFactory, stored
from webapp.dashboard.views import HISTORY_ROWS

pytestmark = pytest.mark.django_db


@pytest.fixture
def curator():
    return get_user_model().objects.create_user("carol")


def test_the_run_page_lists_outcome_changes_newest_first(client, curator):
    (pk,) = stored(RunFactory(reward=1.0, success=True))
    trajectories_curate(trajectories=[pk], action="approve", actor=curator, reason="looks right")
    trajectories_outcome_set(trajectories=[pk], actor=curator, reward=0.0, success=False,
                             reason="it deleted the failing test")
    client.force_login(curator)

    page = html.unescape(client.get(f"/trajectories/{pk}/").content.decode())

    section = page[page.index('id="curation-history"'):]
    assert section.index("set_outcome") < section.index("approve")
    assert "carol" in section and "it deleted the failing test" in section and "looks right" in section
    assert "<code>{'reward': 1.0, 'success': True}</code>" in section
    assert "<code>{'reward': 0.0, 'success': False}</code>" in section
    assert "the full history" not in section


def test_a_long_history_links_to_the_full_list(client, curator):
    (pk,) = stored(RunFactory())
    for n in range(HISTORY_ROWS + 1):
        trajectories_outcome_set(trajectories=[pk], actor=curator, reward=float(n), reason=f"score {n}")
    client.force_login(curator)

    page = client.get(f"/trajectories/{pk}/").content.decode()

    assert page.count("<td>set_outcome</td>") == HISTORY_ROWS
    assert f'href="/api/v1/trajectories/{pk}/events/"' in page


def test_a_run_never_curated_shows_no_history(client, curator):
    (pk,) = stored(RunFactory())
    client.force_login(curator)

    assert 'id="curation-history"' not in client.get(f"/trajectories/{pk}/").content.decode()
