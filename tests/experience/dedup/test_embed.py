from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from experience.dedup.embed import LexicalEmbedder, MiniLMEmbedder, embedder_names, get_embedder

REPO = Path(__file__).resolve().parents[3]
EDIT = "task: marshmallow-1867\nactions:\n1. open src/marshmallow/fields.py <N>\n2. edit <N>:<N> return int(round(x))"
EDIT_VARIANT = (
    "task: marshmallow-1867\nactions:\n1. open src/marshmallow/fields.py <N>\n2. edit return int(round(x))"
)
UNRELATED = "task: pwn-warmup\nactions:\n1. disassemble warmup\n2. python exploit.py\n3. submit FLAG{x}"
TEXTS = [EDIT, EDIT_VARIANT, UNRELATED, ""]


def test_lexical_vectors_are_unit_length_and_an_empty_text_is_zero():
    vectors = LexicalEmbedder().embed(TEXTS)

    assert vectors.dtype == np.float32 and vectors.shape == (4, 384)
    np.testing.assert_allclose(np.linalg.norm(vectors[:3], axis=1), 1.0, rtol=1e-5)
    assert not vectors[3].any()


def test_lexical_puts_a_variant_closer_than_an_unrelated_run():
    edit, variant, unrelated, _ = LexicalEmbedder().embed(TEXTS)

    assert edit @ variant > 0.8
    assert edit @ unrelated < 0.4


def test_lexical_does_not_depend_on_the_batch_a_text_is_in():
    embedder = LexicalEmbedder(batch_size=2)

    together = embedder.embed(TEXTS)
    alone = np.vstack([embedder.embed([text]) for text in TEXTS])

    np.testing.assert_array_equal(together, alone)


def test_lexical_is_identical_across_processes_with_different_hash_seeds():
    script = (
        "import json, sys; from experience.dedup.embed import LexicalEmbedder; "
        "print(json.dumps(LexicalEmbedder().embed(json.loads(sys.argv[1])).tolist()))"
    )
    outputs = [
        subprocess.run(
            [sys.executable, "-c", script, json.dumps(TEXTS)],
            cwd=REPO,
            env={**os.environ, "PYTHONHASHSEED": seed},
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        for seed in ("1", "2")
    ]

    assert outputs[0] == outputs[1]
    np.testing.assert_array_equal(
        np.array(json.loads(outputs[0]), dtype=np.float32), LexicalEmbedder().embed(TEXTS)
    )


def test_the_registry_hands_out_one_instance_per_name_and_rejects_unknown_names():
    assert embedder_names() == ["lexical", "minilm"]
    assert get_embedder("lexical") is get_embedder("lexical")
    assert isinstance(get_embedder("minilm"), MiniLMEmbedder)  # constructing it loads nothing yet
    with pytest.raises(ValueError, match="unknown embedder 'word2vec'"):
        get_embedder("word2vec")


@pytest.fixture(scope="module")
def minilm_offline_run() -> dict:
    """Embed TEXTS twice with MiniLM in a fresh process that is forbidden to reach the Hugging Face Hub."""
    script = (
        "import json, sys; from experience.dedup.embed import MiniLMEmbedder; "
        "e = MiniLMEmbedder(batch_size=2); texts = json.loads(sys.argv[1]); "
        "print(json.dumps({'first': e.embed(texts).tolist(), 'second': e.embed(texts).tolist()}))"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    result = subprocess.run(
        [sys.executable, "-c", script, json.dumps(TEXTS)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_minilm_loads_offline_and_is_deterministic(minilm_offline_run):
    first = np.array(minilm_offline_run["first"], dtype=np.float32)

    assert first.shape == (4, 384)
    np.testing.assert_allclose(first, np.array(minilm_offline_run["second"]), atol=1e-6)


@pytest.mark.slow
def test_minilm_vectors_are_unit_length_and_a_variant_is_closer_than_an_unrelated_run(minilm_offline_run):
    edit, variant, unrelated, empty = np.array(minilm_offline_run["first"], dtype=np.float32)

    np.testing.assert_allclose(np.linalg.norm([edit, variant, unrelated], axis=1), 1.0, rtol=1e-5)
    assert not empty.any()
    assert edit @ variant > edit @ unrelated + 0.1
