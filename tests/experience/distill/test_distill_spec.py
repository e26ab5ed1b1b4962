import json

import pytest

from experience.distill.errors import SpecError
from experience.distill.spec import DatasetSpec
from experience.errors import ValidationError


def test_it_fills_the_documented_defaults():
    spec = DatasetSpec(kind="value")

    assert spec.gamma == 0.95
    assert spec.context_budget_tokens == 8192
    assert spec.neg_pos_ratio is None
    assert spec.splits == {"train": 0.8, "val": 0.1, "test": 0.1}
    assert (spec.include_duplicates, spec.include_rejected) == (False, False)
    assert spec.sft_mode == "truncate"


@pytest.mark.parametrize(
    ("fields", "bad_field"),
    [
        ({"kind": "reward"}, "kind"),
        ({"kind": "value", "gamma": 0}, "gamma"),
        ({"kind": "value", "gamma": 1.5}, "gamma"),
        ({"kind": "value", "gamma": "0.9"}, "gamma"),
        ({"kind": "value", "context_budget_tokens": 0}, "context_budget_tokens"),
        ({"kind": "value", "context_budget_tokens": 10.5}, "context_budget_tokens"),
        ({"kind": "value", "neg_pos_ratio": -1}, "neg_pos_ratio"),
        ({"kind": "value", "splits": {"train": 0.9, "val": 0.1}}, "splits"),
        ({"kind": "value", "splits": {"train": 0.9, "val": 0.1, "test": 0.1}}, "splits"),
        ({"kind": "value", "splits": {"train": 1.2, "val": -0.1, "test": -0.1}}, "splits.train"),
        ({"kind": "value", "include_duplicates": "yes"}, "include_duplicates"),
        ({"kind": "value", "include_rejected": 1}, "include_rejected"),
        ({"kind": "sft", "sft_mode": "cut"}, "sft_mode"),
        ({"kind": "value", "group_by": "org"}, "group_by"),
        ({"kind": "value", "seed": True}, "seed"),
        ({"kind": "value", "seed": -3}, "seed"),
        ({"kind": "pairwise", "max_pairs_per_task": 0}, "max_pairs_per_task"),
        ({"kind": "value", "filters": []}, "filters"),
    ],
)
def test_a_bad_field_raises_an_error_that_names_it(fields, bad_field):
    with pytest.raises(SpecError) as raised:
        DatasetSpec.from_dict(fields)

    assert raised.value.field == bad_field
    assert str(raised.value).startswith(f"{bad_field}: ")
    assert isinstance(raised.value, ValidationError)  # so the API maps it to a 400 naming the field


def test_an_unknown_field_or_a_missing_kind_is_named():
    with pytest.raises(SpecError) as unknown:
        DatasetSpec.from_json('{"kind": "value", "gama": 0.9}')
    with pytest.raises(SpecError) as missing:
        DatasetSpec.from_json('{"gamma": 0.9}')
    with pytest.raises(SpecError) as garbled:
        DatasetSpec.from_json("{kind: value")

    assert (unknown.value.field, missing.value.field, garbled.value.field) == ("gama", "kind", "spec")


def test_json_is_canonical_and_round_trips():
    spec = DatasetSpec(
        kind="sft", sft_mode="mask", neg_pos_ratio=2, seed=7, filters={"task_set": "lite", "a": 1}
    )
    text = spec.to_json()

    assert DatasetSpec.from_json(text) == spec
    assert text == json.dumps(json.loads(text), sort_keys=True, separators=(",", ":"))
    reordered = DatasetSpec(
        kind="sft", filters={"a": 1, "task_set": "lite"}, seed=7, neg_pos_ratio=2, sft_mode="mask"
    )
    assert reordered.to_json() == text
    assert DatasetSpec(kind="sft", sft_mode="mask", seed=8).to_json() != text
