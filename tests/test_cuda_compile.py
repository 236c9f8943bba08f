"""Every csrc/cuda/*.cu compiles with nvcc against the installed torch's headers.

The project's machines have a CPU-only torch, so the CUDA kernels cannot be
linked or run there; compiling each file with ``nvcc -c`` still catches syntax
and type errors (host and device code).  Skipped when nvcc is absent.  The
files compile concurrently (each nvcc run parses the ATen headers, ~25 s of
CPU); -O0 because only the diagnostics matter here.
"""
from __future__ import annotations

import os
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CU_FILES = sorted((ROOT / "csrc" / "cuda").glob("*.cu"))


def _nvcc() -> str | None:
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    candidates = [Path(home) / "bin" / "nvcc"] if home else []
    candidates.append(Path("/usr/local/cuda/bin/nvcc"))
    for c in candidates:
        if c.is_file():
            return str(c)
    return shutil.which("nvcc")


NVCC = _nvcc()


def _compile(src: Path, out_dir: Path) -> subprocess.CompletedProcess:
    from torch.utils.cpp_extension import include_paths

    cuda_include = Path(NVCC).resolve().parent.parent / "include"
    cmd = [NVCC, "-c", str(src), "-o", str(out_dir / (src.stem + ".o")), "-std=c++17", "--expt-relaxed-constexpr",
           "-O0", "-Xcompiler", "-O0", "-DWITH_CUDA", "-diag-suppress", "3306",
           "-I", str(ROOT / "csrc"), "-I", str(cuda_include)]
    for p in include_paths():
        cmd += ["-I", p]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    out = tmp_path_factory.mktemp("nvcc")
    with ThreadPoolExecutor(max_workers=max(1, min(len(CU_FILES), os.cpu_count() or 1))) as pool:
        results = list(pool.map(lambda f: _compile(f, out), CU_FILES))
    return dict(zip([f.name for f in CU_FILES], results))


@pytest.mark.skipif(NVCC is None, reason="nvcc not found (set CUDA_HOME)")
@pytest.mark.parametrize("name", [f.name for f in CU_FILES])
def test_cu_file_compiles(compiled, name):
    res = compiled[name]
    assert res.returncode == 0, f"nvcc failed on csrc/cuda/{name}:\n{res.stderr[-6000:]}"


def test_there_are_cuda_sources():
    assert CU_FILES, "csrc/cuda/ holds no .cu files"
