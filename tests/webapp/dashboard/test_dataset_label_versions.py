"""A dataset version's page says which rubric (and credit) version its labels are."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model

from experience.distill.credit import CREDIT_VERSION
from experience.distill.rubric import RUBRIC_VERSION
from experience.models import Label
from experience.services import datasets
from tests.experience.services.dataset_store import store_tasks
from webapp.access.roles import role_groups_sync

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def dataset_dir(settings, tmp_path):
    settings.TROVE_DATASET_DIR = tmp_path / "datasets"


def test_the_version_page_names_the_label_versions_its_manifest_records(client):
    store_tasks([f"task-{n}" for n in range(6)])
    dataset = datasets.dataset_create(name="labelled", kind="value")
    version = datasets.dataset_version_build(
        version_id=datasets.dataset_version_request(dataset=dataset, force=True).pk
    )
    user = get_user_model().objects.create_user("researcher")
    user.groups.add(role_groups_sync()["researcher"])
    client.force_login(user)

    page = client.get("/datasets/labelled/v1/").content.decode()

    assert version.manifest["label_versions"]["rubric"] == RUBRIC_VERSION
    assert f"rubric <code>{RUBRIC_VERSION}</code>" in page and f"credit <code>{CREDIT_VERSION}</code>" in page
    # The labels the build stored for its runs are of that version too.
    assert set(Label.objects.filter(source="rubric").values_list("version", flat=True)) == {RUBRIC_VERSION}
