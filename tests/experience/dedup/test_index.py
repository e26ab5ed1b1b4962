from __future__ import annotations

import numpy as np
import pytest

from experience.dedup import index as index_module
from experience.dedup.index import VectorIndex, recall_at_k

DIM = 48


def clustered(count: int, *, seed: int = 0, families: int = 400, spread: float = 0.6) -> np.ndarray:
    """Unit vectors around `families` random centres: the shape real embeddings have."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((families, DIM))
    vectors = centres[rng.integers(0, families, count)] + spread * rng.standard_normal((count, DIM))
    return unit(vectors)


def unit(vectors: np.ndarray) -> np.ndarray:
    vectors = np.asarray(vectors, dtype=np.float32)
    return vectors / np.linalg.norm(vectors, axis=-1, keepdims=True)


def brute_force(ids: np.ndarray, vectors: np.ndarray, queries: np.ndarray, k: int):
    scores = queries @ vectors.T
    order = np.argsort(-scores, axis=1)[:, :k]
    return np.take_along_axis(scores, order, axis=1), ids[order]


@pytest.fixture(scope="module")
def data() -> tuple[np.ndarray, np.ndarray]:
    vectors = clustered(30_000)
    return np.arange(1, len(vectors) + 1, dtype=np.int64) * 3, vectors  # sparse ids, as a database hands out


def test_a_small_index_is_exact(data):
    ids, vectors = data[0][:3000], data[1][:3000]
    index = VectorIndex(DIM)
    index.add(ids, vectors)
    queries = clustered(50, seed=7)

    scores, found = index.search(queries, 10)
    truth_scores, truth_ids = brute_force(ids, vectors, queries, 10)

    assert index.kind == "flat"
    np.testing.assert_array_equal(found, truth_ids)
    np.testing.assert_allclose(scores, truth_scores, rtol=1e-5)


def test_past_the_threshold_it_becomes_a_scan_with_recall_of_99_percent_on_new_queries(data):
    ids, vectors = data
    index = VectorIndex(DIM, exact_threshold=5_000)
    for start in range(0, len(ids), 2_500):  # grown the way ingest grows it
        index.add(ids[start : start + 2_500], vectors[start : start + 2_500])
    queries = unit(vectors[::300] + 0.05 * np.random.default_rng(3).standard_normal((100, DIM)))  # near-dups

    scores, found = index.search(queries, 10)
    truth_scores, truth_ids = brute_force(ids, vectors, queries, 10)

    assert index.kind == "scan" and len(index) == len(ids)
    assert index.trained_size == 17_500  # built past 5,000 (7,500), rebuilt past twice that; 30,000 is not
    assert index.measured_recall >= 0.99
    assert recall_at_k(found, scores, truth_ids, truth_scores, k=10) >= 0.98


def test_growth_keeps_every_vector_and_retrains_for_the_larger_size(data):
    ids, vectors = data
    index = VectorIndex(DIM, exact_threshold=2_000)
    index.add(ids[:3_000], vectors[:3_000])
    first_build = index.trained_size
    index.add(ids[3_000:], vectors[3_000:])

    held_ids, held_vectors = index.contents()
    order = np.argsort(held_ids)

    assert first_build == 3_000 and index.trained_size == len(ids)
    np.testing.assert_array_equal(held_ids[order], ids)
    np.testing.assert_array_equal(held_vectors[order], vectors)


@pytest.mark.parametrize("threshold", [100_000, 5_000], ids=["flat", "scan"])
def test_removed_ids_are_never_returned_and_absent_ids_are_ignored(data, threshold):
    ids, vectors = data[0][:12_000], data[1][:12_000]
    index = VectorIndex(DIM, exact_threshold=threshold)
    index.add(ids, vectors)
    gone = ids[:500]

    removed = index.remove(np.concatenate([gone, [10**12]]))
    _, found = index.search(vectors[:500], 5)

    assert removed == 500 and len(index) == len(ids) - 500
    assert not np.isin(found, gone).any()
    with pytest.raises(KeyError):
        index.vectors(gone[:1])


def test_adding_an_id_again_replaces_its_vector(data):
    ids, vectors = data[0][:100], data[1][:100]
    index = VectorIndex(DIM)
    index.add(ids, vectors)

    index.add(ids[:1], vectors[50:51])

    assert len(index) == 100
    np.testing.assert_array_equal(index.vectors(ids[:1]), vectors[50:51])


def test_the_high_water_mark_is_the_largest_id_ever_added():
    index = VectorIndex(DIM)
    assert index.high_water_mark == -1

    index.add(np.array([7, 3]), clustered(2))
    index.add(np.array([5]), clustered(1, seed=1))
    assert index.high_water_mark == 7

    index.remove(np.array([7]))
    assert index.high_water_mark == 7  # the store must not hand back what was removed on purpose

    index.rebuild(np.array([2, 4]), clustered(2, seed=2))
    assert index.high_water_mark == 4 and len(index) == 2


@pytest.mark.parametrize("threshold", [100_000, 5_000], ids=["flat", "scan"])
def test_save_and_load_round_trip_search_results_and_state(tmp_path, data, threshold):
    ids, vectors = data[0][:8_000], data[1][:8_000]
    index = VectorIndex(DIM, exact_threshold=threshold)
    index.add(ids, vectors)
    path = tmp_path / "cache" / "dedup.index"

    index.save(path)
    loaded = VectorIndex.load(path)

    assert (loaded.kind, len(loaded), loaded.high_water_mark, loaded.rerank) == (
        index.kind,
        len(index),
        index.high_water_mark,
        index.rerank,
    )
    np.testing.assert_array_equal(loaded.search(vectors[:20], 10)[1], index.search(vectors[:20], 10)[1])
    assert [p.name for p in path.parent.iterdir()] == ["dedup.index"]  # no temp file left behind


def test_missing_neighbours_come_back_as_minus_one_with_minus_infinity():
    index = VectorIndex(DIM)
    index.add(np.array([1, 2]), clustered(2))

    scores, found = index.search(clustered(1, seed=5), 4)

    assert found[0, 2:].tolist() == [-1, -1] and np.isneginf(scores[0, 2:]).all()


def test_vectors_of_the_wrong_shape_are_refused():
    index = VectorIndex(DIM)
    with pytest.raises(ValueError, match="dim 48"):
        index.add(np.array([1]), np.zeros((1, DIM + 1), dtype=np.float32))
    with pytest.raises(ValueError, match="unique"):
        index.add(np.array([1, 1]), clustered(2))


def test_a_recall_floor_is_a_second_target_for_the_close_neighbours(data):
    ids, vectors = data
    plain = VectorIndex(DIM, exact_threshold=5_000, seed=1)
    floored = VectorIndex(DIM, exact_threshold=5_000, recall_floor=0.9, seed=1)
    plain.rebuild(ids, vectors)
    floored.rebuild(ids, vectors)
    queries = unit(vectors[::300] + 0.02 * np.random.default_rng(4).standard_normal((100, DIM)))

    scores, found = floored.search(queries, 10)
    truth_scores, truth_ids = brute_force(ids, vectors, queries, 10)

    assert floored.rerank >= plain.rerank  # the floor adds a requirement, never relaxes the plain one
    assert (truth_scores >= 0.9).sum() > 100  # the floor is tested on real close pairs
    assert recall_at_k(found, scores, truth_ids, truth_scores, k=10, floor=0.9) >= 0.99


def test_a_search_can_ask_for_more_candidates_than_the_tuned_count(data, tmp_path):
    ids, vectors = data
    index = VectorIndex(DIM, exact_threshold=5_000, recall_floor=0.9)
    index.rebuild(ids, vectors)
    queries = clustered(200, seed=9)
    truth_scores, truth_ids = brute_force(ids, vectors, queries, 10)

    narrow_scores, narrow = index.search(queries, 10, rerank=10)
    wide_scores, wide = index.search(queries, 10, rerank=5_000)

    assert recall_at_k(narrow, narrow_scores, truth_ids, truth_scores, k=10) < 0.99
    assert recall_at_k(wide, wide_scores, truth_ids, truth_scores, k=10) >= 0.999
    index.save(tmp_path / "index")
    assert VectorIndex.load(tmp_path / "index").recall_floor == 0.9


def test_a_scan_index_shrunk_by_removals_goes_back_to_exact_and_keeps_the_rest(data):
    ids, vectors = data[0][:6_000], data[1][:6_000]
    index = VectorIndex(DIM, exact_threshold=5_000)
    index.add(ids, vectors)
    assert index.kind == "scan"

    index.remove(ids[:4_000])

    kept_ids, kept_vectors = index.contents()
    order = np.argsort(kept_ids)
    assert index.kind == "flat" and len(index) == 2_000
    np.testing.assert_array_equal(kept_ids[order], ids[4_000:])
    np.testing.assert_array_equal(kept_vectors[order], vectors[4_000:])


@pytest.fixture(scope="module")
def built_scan(data) -> tuple[VectorIndex, np.ndarray, np.ndarray]:
    """A scan index over 12,000 vectors, built once; tests that change it take a copy (`fresh`)."""
    ids, vectors = data[0][:12_000], data[1][:12_000]
    index = VectorIndex(DIM, exact_threshold=5_000)
    index.rebuild(ids, vectors)
    return index, ids, vectors


@pytest.fixture
def fresh(built_scan, tmp_path) -> tuple[VectorIndex, np.ndarray, np.ndarray]:
    index, ids, vectors = built_scan
    index.save(tmp_path / "scan")
    return VectorIndex.load(tmp_path / "scan"), ids, vectors


def test_removal_from_the_scan_is_a_tombstone_that_no_search_returns(fresh):
    index, ids, vectors = fresh
    gone = ids[::7]

    removed = index.remove(gone)
    _, found = index.search(vectors[::7][:200], 50)
    _, everything = index.search(vectors[:5], 1_000, rerank=2_000)

    assert removed == len(gone) and index.tombstones == len(gone) and len(index) == len(ids) - len(gone)
    assert index.kind == "scan" and not np.isin(found, gone).any() and not np.isin(everything, gone).any()
    assert (found[:, 0] >= 0).all()  # a removed run's nearest live neighbour is still found
    assert index.remove(gone) == 0  # removing again removes nothing
    assert set(index.contents()[0].tolist()) == set(ids.tolist()) - set(gone.tolist())
    with pytest.raises(KeyError):
        index.vectors(gone[:1])


def test_a_removed_id_added_again_is_found_again(fresh):
    index, ids, vectors = fresh
    index.remove(ids[:10])

    index.add(ids[:10], vectors[:10])
    _, found = index.search(vectors[:10], 1)

    assert found[:, 0].tolist() == ids[:10].tolist() and len(index) == len(ids)


def test_an_upsert_into_the_scan_replaces_the_vector_and_leaves_one_copy(fresh):
    index, ids, vectors = fresh

    index.add(ids[:1], vectors[50:51])
    _, found = index.search(vectors[50:51], 3)

    assert len(index) == len(ids) and index.tombstones == 1
    np.testing.assert_array_equal(index.vectors(ids[:1]), vectors[50:51])
    assert sorted(found[0, :2].tolist()) == sorted([ids[0], ids[50]])  # both hold the vector: score 1.0
    assert found[0].tolist().count(ids[0]) == 1


def test_tombstones_past_the_fraction_rebuild_the_scan_without_them(fresh):
    index, ids, vectors = fresh
    assert index_module.TOMBSTONE_FRACTION == 0.2
    index.remove(ids[:2_000])
    assert index.tombstones == 2_000  # 17% of the positions: kept as tombstones

    index.remove(ids[2_000:2_500])  # 21%: rebuilt

    held_ids, held_vectors = index.contents()
    order = np.argsort(held_ids)
    assert index.kind == "scan" and index.tombstones == 0 and index.trained_size == len(ids) - 2_500
    np.testing.assert_array_equal(held_ids[order], ids[2_500:])
    np.testing.assert_array_equal(held_vectors[order], vectors[2_500:])
    assert not np.isin(index.search(vectors[:100], 10)[1], ids[:2_500]).any()


def test_tombstones_survive_save_and_load(fresh, tmp_path):
    index, ids, vectors = fresh
    index.remove(ids[:300])

    index.save(tmp_path / "again")
    loaded = VectorIndex.load(tmp_path / "again")
    _, found = loaded.search(vectors[:300], 10)

    assert (loaded.tombstones, len(loaded), loaded.measured_recall) == (300, len(index), index.measured_recall)
    assert not np.isin(found, ids[:300]).any()
    loaded.add(ids[:1], vectors[:1])  # and the loaded copy stays writable
    assert loaded.search(vectors[:1], 1)[1][0, 0] == ids[0]


def test_the_rerank_count_is_tuned_on_vectors_held_out_of_the_scan(built_scan):
    index, ids, vectors = built_scan

    assert index.measured_recall >= 0.99
    assert index.rerank >= index_module.MIN_RERANK
    assert len(index) == len(ids) and index.tombstones == 0  # the held-out vectors were added afterwards
    np.testing.assert_array_equal(np.sort(index.contents()[0]), ids)


def test_a_file_of_the_old_format_is_refused(tmp_path):
    path = tmp_path / "old"
    index = VectorIndex(DIM)
    index.add(np.array([1]), clustered(1))
    index.save(path)
    with np.load(path) as archive:
        parts = dict(archive)
    parts["meta"] = np.frombuffer(b'{"format": 1}', dtype=np.uint8)
    with path.open("wb") as out:
        np.savez(out, **parts)

    with pytest.raises(ValueError, match="rebuild"):
        VectorIndex.load(path)
