"""Issue 22 items 1, 2, 4: every tool loads artifacts verified, writers refuse outputs inside inputs,
generators refuse sizes that cannot fit, and OS errors about the user's paths are one line.

One tiny UMLS artifact per session (tests/conftest.py ``umls_tiny_artifact``); every test that damages
an artifact works on its own copy.
"""
from __future__ import annotations

import errno
import hashlib
import json
import os
import shlex
import shutil
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from kge.artifact import Artifact, read_embeddings, rebuild_command
from kgreason.errors import UserError, cli_main, os_error_message
from kgreason.files import check_not_input, open_output


def _main(module: str):
    import importlib

    return importlib.import_module(module).main


def one_error(capsys) -> str:
    """The run's stderr, asserted to be exactly one ``error: `` line (no traceback)."""
    err = capsys.readouterr().err
    lines = err.rstrip("\n").split("\n")
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


def snapshot(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def leftovers(folder: Path) -> list[str]:
    return [p.name for p in folder.rglob("*") if ".part-" in p.name or ".building-" in p.name or ".old-" in p.name]


# ------------------------------------------------------------------ damaged artifacts
@pytest.fixture(scope="module")
def damaged(umls_tiny_artifact, tmp_path_factory) -> dict[str, Path]:
    """Copies of the tiny artifact: 0-byte matrices.npz / embeddings.npz (checksums then disagree), and NaN
    embeddings / NaN calibrated values saved with fresh checksums (only the value checks can tell)."""
    root = tmp_path_factory.mktemp("damaged")
    out = {}
    for name in ("zero-matrices", "zero-embeddings"):
        shutil.copytree(umls_tiny_artifact, root / name)
        (root / name / f"{name.split('-')[1]}.npz").write_bytes(b"")
        out[name] = root / name
    art = Artifact.load(umls_tiny_artifact)
    art.embeddings["entity"][7, 1] = np.nan
    art.save(root / "nan-embeddings")
    out["nan-embeddings"] = root / "nan-embeddings"
    art = Artifact.load(umls_tiny_artifact)
    art.matrices.data[::5] = np.nan
    art.save(root / "nan-matrices")
    out["nan-matrices"] = root / "nan-matrices"
    return out


@pytest.fixture(scope="module")
def queries(umls_tiny_artifact, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("queries") / "q.jsonl"
    assert _main("engine.sample")(["--artifact", str(umls_tiny_artifact), "--out", str(out), "--structures", "1p",
                                   "2p", "--per-structure", "3", "--no-progress"]) == 0
    return out


TOOLS = {
    "engine.answer": lambda art, q, tmp: ["--artifact", art, "--query", "1p"],
    "engine.evaluate": lambda art, q, tmp: ["--artifact", art, "--queries", q, "--no-progress"],
    "engine.sample": lambda art, q, tmp: ["--artifact", art, "--out", str(tmp / "o.jsonl"), "--per-structure", "2",
                                          "--no-progress"],
    "engine.paths.__main__": lambda art, q, tmp: ["--artifact", art, "--from", "C0", "--plan", "isa",
                                                  "--encoder", "hashing"],
    "experiments.lgot_eval": lambda art, q, tmp: ["--artifact", art, "--out", str(tmp / "exp"), "--quiet"],
    "kge.linkpred": lambda art, q, tmp: ["--artifact", art, "--kg", "umls", "--limit", "5", "--quiet"],
}
# What each damage reports: the file, and (unverified) why.
DAMAGE = {"zero-matrices": ("matrices.npz", "empty file"), "zero-embeddings": ("embeddings.npz", "empty file"),
          "nan-embeddings": ("embeddings.npz", "NaN or infinite"), "nan-matrices": ("matrices.npz", "NaN or infinite")}


@pytest.mark.parametrize("skip", [False, True], ids=["verified", "skip-checksums"])
@pytest.mark.parametrize("damage", list(DAMAGE))
@pytest.mark.parametrize("tool", list(TOOLS))
def test_every_tool_refuses_a_damaged_artifact(tool, damage, skip, damaged, queries, tmp_path, capsys):
    art = damaged[damage]
    file, why = DAMAGE[damage]
    if tool == "kge.linkpred" and file == "matrices.npz" and (skip or damage.startswith("nan")):
        pytest.skip("kge.linkpred reads only the embeddings: a matrices.npz that its checksum vouches for (or "
                    "unverified) is not its input")
    before = snapshot(art)
    argv = TOOLS[tool](str(art), str(queries), tmp_path) + (["--skip-artifact-checksums"] if skip else [])
    assert _main(tool)(argv) == 2
    line = one_error(capsys)
    assert file in line, line
    assert f"python -m kge.build --kg umls --out {art} --drop-edges 0.5 --rank 8 --epochs 2" in line, line
    assert line.rstrip().endswith("--overwrite") or "--skip-artifact-checksums" in line, line
    if damage.startswith("zero"):
        assert ("checksum mismatch" in line) != skip and (why in line) == skip, line
    else:  # fresh checksums: the value check catches it either way
        assert why in line, line
    assert snapshot(art) == before
    assert not (tmp_path / "o.jsonl").exists() and not (tmp_path / "exp").exists()


def test_skip_artifact_checksums_skips_only_the_checksums(umls_tiny_artifact, tmp_path, capsys):
    art = tmp_path / "art"
    shutil.copytree(umls_tiny_artifact, art)
    lines = (art / "missing.tsv").read_text().splitlines()
    (art / "missing.tsv").write_text("\n".join(reversed(lines)) + "\n")  # same triples, other bytes
    sample = _main("engine.sample")
    argv = ["--artifact", str(art), "--out", str(tmp_path / "q.jsonl"), "--per-structure", "2", "--no-progress"]
    assert sample(argv) == 2
    assert "checksum mismatch for 'missing.tsv'" in one_error(capsys)
    assert sample(argv + ["--skip-artifact-checksums"]) == 0
    assert (tmp_path / "q.jsonl").stat().st_size > 0
    with pytest.raises(UserError, match="checksum mismatch"):
        Artifact.load(art)
    assert Artifact.load(art, verify=False).num_entities == 135


def test_plots_verifies_too(damaged, tmp_path, capsys):
    pytest.importorskip("matplotlib")
    plots = _main("experiments.train_curve")
    assert plots(["--artifact", str(damaged["zero-matrices"]), "--out", str(tmp_path / "c.png")]) == 2
    assert "checksum mismatch for 'matrices.npz'" in one_error(capsys)
    assert not (tmp_path / "c.png").exists()


def test_read_embeddings_checks_shapes_and_values(umls_tiny_artifact, damaged):
    emb = read_embeddings(umls_tiny_artifact)
    assert emb["entity"].shape == (135, 8) and emb["relation"].shape == (92, 8)
    with pytest.raises(UserError, match=r"1 of the 135 entity embeddings hold NaN"):
        read_embeddings(damaged["nan-embeddings"])


def test_a_bad_csr_is_one_line(umls_tiny_artifact, tmp_path):
    """Structure, not only values: a column index out of range would index past a row in the kernels."""
    folder = tmp_path / "a"
    shutil.copytree(umls_tiny_artifact, folder)
    z = dict(np.load(folder / "matrices.npz"))
    z["indices"][3] = 135
    np.savez(folder / "matrices.npz", **z)
    with pytest.raises(UserError, match=r"matrices\.npz: column indices outside \[0, 135\); rebuild it with "):
        Artifact.load(folder, verify=False)
    z["indptr"][5] = z["indptr"][7] + 1
    np.savez(folder / "matrices.npz", **z)
    with pytest.raises(UserError, match=r"matrices\.npz: indptr is not non-decreasing; rebuild it with "):
        Artifact.load(folder, verify=False)


def test_rebuild_command_rebuilds_the_same_config(umls_tiny_artifact):
    """The printed command parses back (kge.build's own parser) into the recorded build configuration."""
    from kge.build import parse_args

    meta = json.loads((umls_tiny_artifact / "meta.json").read_text())
    cmd = rebuild_command("/some where/umls", meta)
    argv = shlex.split(cmd)
    assert argv[:3] == ["python", "-m", "kge.build"]
    config, _ = parse_args(argv[3:])
    expected = dict(meta["build_config"], out="/some where/umls", overwrite=True)
    assert config.to_json() == expected
    assert rebuild_command("x", {"source": "pykeen:umls"}) == "python -m kge.build --kg pykeen:umls --out x --overwrite"


def test_linkpred_errors_name_only_its_flags(umls_tiny_artifact, capsys):
    rc = _main("kge.linkpred")(["--artifact", str(umls_tiny_artifact), "--kg", "nations", "--quiet"])
    assert rc == 2
    line = one_error(capsys)
    assert "--artifact" in line and "--kg nations" in line and "built from --kg umls" in line, line
    assert "--embeddings" not in line


# ------------------------------------------------------------------ outputs never inside inputs
def test_plots_out_inside_the_artifact_is_refused(umls_tiny_artifact, tmp_path, capsys):
    art = tmp_path / "art"
    shutil.copytree(umls_tiny_artifact, art)
    (tmp_path / "link").symlink_to(art)
    before = snapshot(art)
    plots = _main("experiments.train_curve")
    for out in (art / "entities.tsv", art / "new.png", tmp_path / "link" / "entities.tsv",
                tmp_path / "x" / ".." / "art" / "meta.json"):
        assert plots(["--artifact", str(art), "--out", str(out)]) == 2
        line = one_error(capsys)
        assert "is inside the --artifact folder" in line and "nothing was touched" in line, line
    assert snapshot(art) == before


def test_experiment_out_inside_the_artifact_is_refused(umls_tiny_artifact, tmp_path, capsys):
    art = tmp_path / "art"
    shutil.copytree(umls_tiny_artifact, art)
    before = snapshot(art)
    experiment = _main("experiments.lgot_eval")
    for flag, extra, says in (("--out", ["--out", art], "is the --artifact input"),
                              ("--out", ["--out", art / "results"], "inside"),
                              ("--questions-dir", ["--out", tmp_path / "res", "--questions-dir", art / "q"], "inside")):
        argv = ["--artifact", str(art), "--quiet", *map(str, extra)]
        assert experiment(argv) == 2
        line = one_error(capsys)
        assert line.startswith(f"error: {flag} ") and says in line, line
    assert snapshot(art) == before


def test_build_out_inside_the_kg_folder_is_refused(tmp_path, capsys):
    kg = tmp_path / "kg"
    kg.mkdir()
    (kg / "train.txt").write_text("a\tr\tb\nb\tr\tc\n")
    before = snapshot(kg)
    assert _main("kge.build")(["--kg", str(kg), "--out", str(kg / "art"), "--quiet"]) == 2
    assert "is inside the --kg folder" in one_error(capsys)
    assert snapshot(kg) == before and sorted(p.name for p in kg.iterdir()) == ["train.txt"]


def test_check_not_input(tmp_path):
    folder = tmp_path / "in"
    folder.mkdir()
    (folder / "f.txt").write_text("x")
    (tmp_path / "ln").symlink_to(folder)
    for out in (folder, folder / "f.txt", folder / "new", tmp_path / "ln" / "new", tmp_path / "in" / ".." / "in" / "a"):
        with pytest.raises(UserError, match="--in"):
            check_not_input(out, what="--out", inputs=[("--in", folder)])
    # beside an input, a file's "inside", a name that is no path (a dataset name) and None are fine
    for out, src in ((tmp_path / "other", folder), (folder / "f.txt" / "x", folder / "f.txt"),
                     (tmp_path / "umls" / "x", "umls"), (tmp_path / "x", None)):
        assert check_not_input(out, what="--out", inputs=[("--in", src)]) == Path(out)


# ------------------------------------------------------------------ generator sizes
def test_synthetic_refuses_sizes_that_cannot_fit_up_front(tmp_path, capsys, monkeypatch):
    import tracemalloc

    import experiments.synthetic_kg as syn

    main = _main("experiments.synthetic_kg")
    out = tmp_path / "big.tsv"
    monkeypatch.setattr(syn, "_mem_available", lambda: 16 * 2**30)  # the refusal must not depend on the machine
    tracemalloc.start()
    t = time.perf_counter()
    try:
        rc = main(["--entities", "100000000", "--relations", "100", "--edges", "200000000", "--out", str(out)])
        elapsed = time.perf_counter() - t
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert rc == 2 and elapsed < 1.0 and peak < 20 * 2**20, (elapsed, peak)
    line = one_error(capsys)
    assert "--entities 100,000,000 and --edges 200,000,000 need at least" in line and "--skip-size-check" in line
    assert "16.00 GiB available (MemAvailable)" in line
    assert not out.exists() and not leftovers(tmp_path)


def test_synthetic_size_check_override_and_disk_estimate(tmp_path, capsys, monkeypatch):
    import experiments.synthetic_kg as syn

    cfg = syn.SyntheticConfig(num_entities=300, num_relations=4, num_edges=900, seed=1)
    need = syn.estimate_peak_bytes(cfg)
    monkeypatch.setattr(syn, "_mem_available", lambda: need - 1)
    argv = ["--entities", "300", "--relations", "4", "--edges", "900", "--seed", "1", "--out", str(tmp_path / "s.tsv"),
            "--quiet"]
    assert syn.main(argv) == 2 and "MemAvailable" in one_error(capsys)
    assert syn.main(argv + ["--skip-size-check"]) == 0
    size = (tmp_path / "s.tsv").stat().st_size
    # the TSV estimate errs low (never refuses a file that fits): 0.75 of the real size here, 1.02 at 100k entities
    assert 0.5 * size < syn.estimate_tsv_bytes(cfg) < 1.1 * size, (syn.estimate_tsv_bytes(cfg), size)
    monkeypatch.setattr(syn, "_mem_available", lambda: None)  # no /proc/meminfo: no memory check

    class Usage:
        free = 1000

    monkeypatch.setattr(shutil, "disk_usage", lambda p: Usage())
    assert syn.main(argv) == 2
    line = one_error(capsys)
    assert "make a TSV of about" in line and "free in" in line and "--skip-size-check" in line, line


# ------------------------------------------------------------------ OS errors: one line, one place
@pytest.mark.parametrize("code, words", [(errno.ENOSPC, "no space left"), (errno.EDQUOT, "quota"),
                                         (errno.EROFS, "read-only"), (errno.EACCES, "permission denied")])
def test_cli_main_maps_os_errors_to_one_line(code, words, capsys):
    @cli_main
    def main(argv):
        raise OSError(code, os.strerror(code), "/data/out.tsv")

    assert main([]) == 2
    line = one_error(capsys)
    assert line.startswith("error: /data/out.tsv: ") and words in line and errno.errorcode[code] in line, line


def test_cli_main_keeps_tracebacks_for_other_os_errors():
    @cli_main
    def main(argv):
        raise ConnectionResetError(errno.ECONNRESET, "reset")

    assert os_error_message(ConnectionResetError(errno.ECONNRESET, "reset")) is None
    with pytest.raises(ConnectionResetError):
        main([])


class _FullDisk:
    """A text/binary file object whose writes fail with ENOSPC once ``limit`` bytes went through."""

    def __init__(self, f, limit: int) -> None:
        self._f, self._left = f, limit

    def write(self, data):
        self._left -= len(data)
        if self._left < 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return self._f.write(data)

    def __getattr__(self, name):
        return getattr(self._f, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._f.close()


@pytest.fixture
def disk_full_after(monkeypatch):
    """``disk_full_after(n)``: files that kgreason.files.open_output opens fail after n bytes (ENOSPC)."""
    import kgreason.files as files

    def arm(limit: int) -> None:
        real = os.fdopen
        monkeypatch.setattr(files.os, "fdopen", lambda fd, *a, **k: _FullDisk(real(fd, *a, **k), limit))

    return arm


def test_enospc_in_open_output_names_the_output(tmp_path, disk_full_after):
    disk_full_after(10)
    with pytest.raises(OSError) as exc:
        with open_output(tmp_path / "o.txt") as f:
            f.write("x" * 100)
    assert exc.value.filename == str(tmp_path / "o.txt")
    assert os.listdir(tmp_path) == []


def test_enospc_in_engine_sample(umls_tiny_artifact, tmp_path, capsys, disk_full_after):
    disk_full_after(500)
    out = tmp_path / "q.jsonl"
    rc = _main("engine.sample")(["--artifact", str(umls_tiny_artifact), "--out", str(out), "--per-structure", "50",
                                 "--no-progress"])
    assert rc == 2
    line = one_error(capsys)
    assert line == f"error: {out}: no space left on the device (ENOSPC); free space there or write the output elsewhere"
    assert os.listdir(tmp_path) == []


def test_enospc_in_kge_synthetic(tmp_path, capsys, disk_full_after):
    disk_full_after(1000)
    out = tmp_path / "s.tsv"
    rc = _main("experiments.synthetic_kg")(["--entities", "300", "--relations", "4", "--edges", "900", "--out", str(out),
                                 "--quiet"])
    assert rc == 2
    assert one_error(capsys).startswith(f"error: {out}: no space left on the device (ENOSPC)")
    assert os.listdir(tmp_path) == []


def test_enospc_in_kge_build(umls_tiny_artifact, tmp_path, capsys, monkeypatch):
    """A write into the build's temporary folder fails: the message names the file at --out, nothing is left."""
    import kge.artifact as artifact

    def full(path, triples):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))

    monkeypatch.setattr(artifact, "_write_triples", full)
    out = tmp_path / "sub" / "umls"
    rc = _main("kge.build")(["--kg", "umls", "--out", str(out), "--drop-edges", "0.5", "--embeddings",
                             str(umls_tiny_artifact), "--quiet"])
    assert rc == 2
    line = one_error(capsys)
    assert line.startswith(f"error: {out / 'observed.tsv'}: no space left on the device (ENOSPC)"), line
    assert os.listdir(tmp_path) == []  # the temporary folder and the parent it created are gone


def _mount_tmpfs(folder: Path, size: str) -> bool:
    if os.geteuid() != 0 or shutil.which("mount") is None:
        return False
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)], capture_output=True)
    return r.returncode == 0


def test_real_full_tmpfs(tmp_path, capsys):
    """A 1 MiB tmpfs: experiments.synthetic_kg's disk estimate refuses up front; past it (--skip-size-check) the real
    ENOSPC is one line naming the output, and the partial file is gone."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    if not _mount_tmpfs(mnt, "1m"):
        pytest.skip("cannot mount a tmpfs here (needs root and CAP_SYS_ADMIN)")
    try:
        out = mnt / "s.tsv"
        argv = ["--entities", "20000", "--relations", "5", "--edges", "40000", "--out", str(out), "--quiet"]
        main = _main("experiments.synthetic_kg")
        assert main(argv) == 2
        assert "free in" in one_error(capsys)
        assert main(argv + ["--skip-size-check"]) == 2
        line = one_error(capsys)
        assert line.startswith(f"error: {out}: no space left on the device (ENOSPC)"), line
        assert os.listdir(mnt) == []
    finally:
        subprocess.run(["umount", str(mnt)], check=False)


def test_llm_cache_inside_the_artifact_is_refused(umls_tiny_artifact, tmp_path, capsys):
    art = tmp_path / "art"
    shutil.copytree(umls_tiny_artifact, art)
    before = snapshot(art)
    cache = art / "llm-cache.sqlite"
    assert _main("engine.answer")(["--artifact", str(art), "--query", "1p", "--llm", "--llm-cache", str(cache)]) == 2
    assert "error: --llm-cache " in one_error(capsys)
    assert _main("experiments.lgot_eval")(["--artifact", str(art), "--out", str(tmp_path / "r"), "--llm-cache",
                                           str(cache), "--quiet"]) == 2
    assert "is inside the --artifact folder" in one_error(capsys)
    assert snapshot(art) == before


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.complex64])
def test_value_checks_equal_their_reference(dtype, seed):
    """The min/max shortcuts of the load checks against the plain element-wise definitions."""
    from kge.artifact import _all_finite, _all_within

    rng = np.random.default_rng(seed)
    for _ in range(200):
        a = rng.random(int(rng.integers(0, 50))).astype(dtype)
        if np.iscomplexobj(a):
            a = a + 1j * rng.random(a.shape).astype(np.float32)
        for _ in range(int(rng.integers(0, 3))):
            if a.size:
                bad = rng.choice([np.nan, np.inf, -np.inf, -0.5, 1.5])
                k = int(rng.integers(a.size))
                a[k] = complex(0.0, bad) if np.iscomplexobj(a) and rng.random() < 0.5 else bad
        assert _all_finite(a) == bool(np.isfinite(a).all())
        if not np.iscomplexobj(a):
            assert _all_within(a, 0.0, 1.0) == bool(((a >= 0) & (a <= 1)).all())


def test_text_files_out_of_range_or_malformed_are_one_line_with_the_rebuild(umls_tiny_artifact, tmp_path, capsys):
    art = tmp_path / "art"
    shutil.copytree(umls_tiny_artifact, art)
    with open(art / "observed.tsv", "a") as f:
        f.write("0\t0\t135\n")
    with pytest.raises(UserError, match=r"observed\.tsv: row \d+: tail id 135 out of range \[0, 135\); rebuild it "
                                        r"with python -m kge.build --kg umls"):
        Artifact.load(art, verify=False)
    shutil.copy(umls_tiny_artifact / "observed.tsv", art / "observed.tsv")
    (art / "relations.tsv").write_text("0\tonly\n2\tgap\n")
    assert _main("engine.sample")(["--artifact", str(art), "--out", str(tmp_path / "q.jsonl"),
                                   "--skip-artifact-checksums", "--no-progress"]) == 2
    line = one_error(capsys)
    assert "relations.tsv:2: expected id 1, got 2; rebuild it with python -m kge.build --kg umls" in line, line
