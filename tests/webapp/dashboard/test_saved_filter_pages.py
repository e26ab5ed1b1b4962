"""Saved filters in the explorer, as a browser posts them: a curator saves the page's filters under a name,
sees theirs and others' shared ones (never others' private ones), opens one, deletes only their own."""

from __future__ import annotations

from urllib.parse import parse_qsl

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from experience.errors import ValidationError
from experience.models import SavedFilter
from experience.services.saved_filters import saved_filter_save
from webapp.access.roles import role_groups_sync

pytestmark = pytest.mark.django_db


def person(name: str, role: str = "curator") -> tuple[Client, object]:
    client = Client()
    user = get_user_model().objects.create_user(name)
    user.groups.add(role_groups_sync()[role])
    client.force_login(user)
    return client, user


def menu(client: Client) -> str:
    return client.get("/trajectories/").content.decode()


def test_a_saved_filter_is_stored_canonical_and_opens_the_same_explorer():
    ann, user = person("ann")

    saved = ann.post("/trajectories/saved-filters/", {"saved_name": " failed  pytest ", "outcome": "failure",
                                                    "q": "pytest", "status": "completed,failed"})

    row = SavedFilter.objects.get()
    assert (row.owner, row.name, row.shared) == (user, "failed pytest", False)
    assert row.filters == {"q": "pytest", "status": "completed,failed", "outcome": "failure"}
    path, _, query = saved["Location"].partition("?")
    assert path == "/trajectories/" and dict(parse_qsl(query)) == row.filters
    page = ann.get(saved["Location"]).content.decode()
    assert f'data-saved-filter="{row.pk}" class="open"' in page and "failed pytest" in page


def test_others_see_shared_filters_but_not_private_ones():
    ann, _ = person("ann")
    bob, _ = person("bob")
    ann.post("/trajectories/saved-filters/", {"saved_name": "ann private", "model": "m-1"})
    ann.post("/trajectories/saved-filters/", {"saved_name": "ann shared", "model": "m-2", "shared": "on"})

    bobs = menu(bob)

    assert "ann shared" in bobs and "shared by ann" in bobs and "ann private" not in bobs
    assert "ann private" in menu(ann) and "ann shared" in menu(ann)


def test_saving_again_under_a_name_replaces_it():
    ann, _ = person("ann")
    ann.post("/trajectories/saved-filters/", {"saved_name": "mine", "model": "m-1"})
    ann.post("/trajectories/saved-filters/", {"saved_name": "mine", "model": "m-2", "shared": "on"})

    assert list(SavedFilter.objects.values_list("name", "filters", "shared")) == [("mine", {"model": "m-2"}, True)]


def test_only_the_owner_deletes_a_saved_filter():
    ann, _ = person("ann")
    bob, _ = person("bob")
    ann.post("/trajectories/saved-filters/", {"saved_name": "shared one", "model": "m", "shared": "on"})
    row = SavedFilter.objects.get()
    assert f'/trajectories/saved-filters/{row.pk}/delete/' not in menu(bob)  # no button for someone else's

    refused = bob.post(f"/trajectories/saved-filters/{row.pk}/delete/", follow=True)
    assert SavedFilter.objects.filter(pk=row.pk).exists()
    assert "you have no saved filter with that id" in refused.content.decode()

    ann.post(f"/trajectories/saved-filters/{row.pk}/delete/")
    assert not SavedFilter.objects.exists() and "shared one" not in menu(bob)


@pytest.mark.parametrize(("post", "message"), [
    ({"saved_name": "", "model": "m"}, "name: a saved filter needs a name"),
    ({"saved_name": "x" * 101, "model": "m"}, "name: at most 100 characters"),
    ({"saved_name": "nothing"}, "filters: none chosen"),
    ({"saved_name": "bad", "outcome": "maybe"}, "outcome: &#x27;maybe&#x27; is not one of"),
])
def test_a_bad_save_says_what_is_wrong_and_stores_nothing(post, message):
    ann, _ = person("ann")

    shown = ann.post("/trajectories/saved-filters/", post, follow=True).content.decode()

    assert message in shown and not SavedFilter.objects.exists()


def test_a_reader_sees_saved_filters_but_cannot_save():
    ann, _ = person("ann")
    ann.post("/trajectories/saved-filters/", {"saved_name": "for all", "model": "m", "shared": "on"})
    reader, _ = person("rita", role="trainer")

    page = reader.get("/trajectories/?model=m").content.decode()
    refused = reader.post("/trajectories/saved-filters/", {"saved_name": "mine", "model": "m"})

    assert "for all" in page and 'id="save-filter"' not in page
    assert refused.status_code == 403 and SavedFilter.objects.count() == 1


def test_a_filter_that_does_not_parse_cannot_be_saved_through_the_service():
    _, user = person("ann")

    with pytest.raises(ValidationError) as caught:
        saved_filter_save(owner=user, name="x", params={"colour": "red"})

    assert caught.value.field == "colour"
