"""The embedded default KG: UMLS (bundled with pykeen), compiled once and cached.

``default_artifact()`` loads ``$KGREASON_HOME/artifacts/umls`` (``KGREASON_HOME``
defaults to ``~/.cache/kgreason``).  The first call builds it with
``kge.build`` (ComplEx training + calibration, with progress bars) into a
temporary sibling folder and renames it into place
(:class:`kgreason.files.OutputFolder`), so an interrupted build (Ctrl-C or
SIGTERM) never leaves a half-built cache or a temporary folder behind.  A
cache of another artifact format version is rebuilt the same way.  Later calls
only load (and verify checksums), without importing pykeen.
"""
from __future__ import annotations

import sys
from pathlib import Path

from kge.artifact import Artifact, ArtifactVersionError
from kgreason.errors import UserError
from kgreason.files import OutputExists, OutputFolder, user_cache_dir

__all__ = ["kgreason_home", "default_artifact_path", "default_artifact", "DEFAULT_KG"]

DEFAULT_KG = "umls"


def kgreason_home() -> Path:
    """``$KGREASON_HOME`` or ``~/.cache/kgreason``."""
    return user_cache_dir()


def default_artifact_path() -> Path:
    return kgreason_home() / "artifacts" / DEFAULT_KG


def _build(out: Path) -> None:
    """Build the default KG's artifact into the (empty) folder ``out`` (imports pykeen: only on the first run)."""
    try:
        from kge import builder  # the library code of python -m kge.build
    except ImportError as exc:
        raise UserError(f"cannot build the default knowledge graph ({exc}); pass --artifact DIR instead") from None
    builder.build_artifact(builder.BuildConfig(kg=DEFAULT_KG, out=str(out)))


def default_artifact(*, verify: bool = True, load_embeddings: bool = True, builder=None) -> Artifact:
    """The default KG's artifact, building and caching it on first use.

    ``builder(out_dir)`` replaces the real build (tests use it); it must write a
    complete artifact folder to ``out_dir``.
    """
    path = default_artifact_path()
    stale = False
    if (path / "meta.json").is_file():
        try:
            return Artifact.load(path, verify=verify, load_embeddings=load_embeddings)
        except ArtifactVersionError as exc:
            print(f"note: {exc}; rebuilding the cached default knowledge graph", file=sys.stderr)
            stale = True
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"cannot create the cache folder {path.parent} ({exc.strerror}); set KGREASON_HOME "
                        "to a writable folder or pass --artifact DIR") from None
    # Replaces only an artifact of ours (stale version); any other folder there is an error naming it.
    output = OutputFolder(path, overwrite=stale, what="default artifact")
    print(f"building the default knowledge graph ({DEFAULT_KG}) into {path} (first run only)", file=sys.stderr)
    try:
        with output as tmp:
            (builder or _build)(tmp)
            if not (tmp / "meta.json").is_file():
                raise RuntimeError(f"the build of {DEFAULT_KG} finished without writing {tmp / 'meta.json'}")
    except OutputExists:
        # Another process finished first: use its cache, drop ours (already removed).
        if not (path / "meta.json").is_file():
            raise
    return Artifact.load(path, verify=verify, load_embeddings=load_embeddings)
