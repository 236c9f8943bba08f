"""The embedded default KG: UMLS (bundled with pykeen), compiled once and cached.

``default_artifact()`` loads ``$KGREASON_HOME/artifacts/umls`` (``KGREASON_HOME``
defaults to ``~/.cache/kgreason``).  The first call builds it with
``kge.build`` (ComplEx training + calibration, with progress bars) into a
temporary sibling folder and renames it into place, so an interrupted build
never leaves a half-built cache behind.  Later calls only load (and verify
checksums), without importing pykeen.
"""
from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

from kge.artifact import Artifact
from kge.errors import UserError

__all__ = ["kgreason_home", "default_artifact_path", "default_artifact", "DEFAULT_KG"]

DEFAULT_KG = "umls"


def kgreason_home() -> Path:
    """``$KGREASON_HOME`` or ``~/.cache/kgreason``."""
    return Path(os.environ.get("KGREASON_HOME") or Path.home() / ".cache" / "kgreason").expanduser()


def default_artifact_path() -> Path:
    return kgreason_home() / "artifacts" / DEFAULT_KG


def _build(out: Path) -> None:
    """Build the default KG's artifact into ``out`` (imports pykeen: only on the first run)."""
    try:
        from kge import build
    except ImportError as exc:
        raise UserError(f"cannot build the default knowledge graph ({exc}); pass --artifact DIR instead") from None
    build.build_artifact(build.BuildConfig(kg=DEFAULT_KG, out=str(out)))


def default_artifact(*, verify: bool = True, load_embeddings: bool = True, builder=None) -> Artifact:
    """The default KG's artifact, building and caching it on first use.

    ``builder(out_dir)`` replaces the real build (tests use it); it must write a
    complete artifact folder to ``out_dir``.
    """
    path = default_artifact_path()
    if (path / "meta.json").is_file():
        return Artifact.load(path, verify=verify, load_embeddings=load_embeddings)
    path.parent.mkdir(parents=True, exist_ok=True)
    print(f"building the default knowledge graph ({DEFAULT_KG}) into {path} (first run only)", file=sys.stderr)
    tmp = Path(tempfile.mkdtemp(prefix=f".{DEFAULT_KG}.building-", dir=path.parent))
    try:
        (builder or _build)(tmp)
        if not (tmp / "meta.json").is_file():
            raise RuntimeError(f"the build of {DEFAULT_KG} finished without writing {tmp / 'meta.json'}")
        try:
            if path.exists() and not (path / "meta.json").is_file():
                shutil.rmtree(path)  # a stray folder without meta.json is not a usable cache
            os.rename(tmp, path)
        except OSError:
            # Another process finished first: use its cache, drop ours.
            if not (path / "meta.json").is_file():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return Artifact.load(path, verify=verify, load_embeddings=load_embeddings)
