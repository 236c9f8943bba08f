"""Every csrc/cuda/*.cu compiles with nvcc against the installed torch's headers, and registers
kernels only for schemas csrc/*.cpp defines, with matching C++ signatures.

The project's machines have a CPU-only torch, so the CUDA kernels cannot be
linked or run there; compiling each file with ``nvcc -c`` still catches syntax
and type errors (host and device code).  Skipped when nvcc is absent.  The
files compile concurrently (each nvcc run parses the ATen headers); -O0 because
only the diagnostics matter here.

Two depths: ``-c`` (the full run, every file) runs every nvcc phase, the host
compiler's pass over the host code included (~38 s of CPU for project_cuda.cu);
``-ptx`` (the fast lane, project_cuda.cu) runs the device side only, whose C++
front end still parses and checks the whole file, host functions and the
templates instantiated from them included (a planted ``y.no_such_method()`` in
a host function fails it), and generates the device code (~16 s of CPU).

What compiling cannot see is a CUDA kernel registered under a name or with parameters the
schema does not have: torch rejects it when the extension loads on a GPU machine, so the whole
extension fails there while every CPU run passes.  test_cuda_registrations_match_schemas reads
the ``m.def`` schemas and the CUDA ``m.impl`` registrations as text (no nvcc needed) and compares
each registered function's parameter types with its schema's.
"""
from __future__ import annotations

import os
import re
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


#: nvcc's output option and file suffix per depth (see the module docstring).
DEPTHS = {"c": ("-c", ".o"), "ptx": ("-ptx", ".ptx")}


def _compile(src: Path, depth: str, out_dir: Path) -> subprocess.CompletedProcess:
    from torch.utils.cpp_extension import include_paths

    flag, suffix = DEPTHS[depth]
    cuda_include = Path(NVCC).resolve().parent.parent / "include"
    cmd = [NVCC, flag, str(src), "-o", str(out_dir / (src.stem + suffix)), "-std=c++17", "--expt-relaxed-constexpr",
           "-O0", "-Xcompiler", "-O0", "-DWITH_CUDA", "-diag-suppress", "3306",
           "-I", str(ROOT / "csrc"), "-I", str(cuda_include)]
    for p in include_paths():
        cmd += ["-I", p]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600)


# The fast lane (-m "not slow") takes the projection kernel, the file most edits touch, through nvcc's device
# side (-ptx); the full run (CI) compiles every file completely (-c), project_cuda.cu included: the fast case
# is the twin of project_cuda.cu's -c, test_cuda_registrations_match_schemas (every file, no nvcc) the twin of
# the other files' (calibrate_rows_cuda.cu alone takes ~110 s of CPU with -c).
CASES = [pytest.param("project_cuda.cu", "ptx", id="project_cuda.cu-ptx")] + [
    pytest.param(f.name, "c", marks=pytest.mark.slow, id=f.name) for f in CU_FILES]


@pytest.fixture(scope="module")
def compiled(request, tmp_path_factory):
    """nvcc results per (file, depth) this session selected, compiled concurrently once."""
    wanted = sorted({(item.callspec.params["name"], item.callspec.params["depth"]) for item in request.session.items
                     if getattr(item, "originalname", None) == "test_cu_file_compiles" and hasattr(item, "callspec")})
    out = tmp_path_factory.mktemp("nvcc")
    with ThreadPoolExecutor(max_workers=max(1, min(len(wanted), os.cpu_count() or 1))) as pool:
        results = list(pool.map(lambda case: _compile(ROOT / "csrc" / "cuda" / case[0], case[1], out), wanted))
    return dict(zip(wanted, results))


@pytest.mark.skipif(NVCC is None, reason="nvcc not found (set CUDA_HOME)")
@pytest.mark.parametrize("name,depth", CASES)
def test_cu_file_compiles(compiled, name, depth):
    res = compiled[(name, depth)]
    assert res.returncode == 0, f"nvcc {DEPTHS[depth][0]} failed on csrc/cuda/{name}:\n{res.stderr[-6000:]}"


def test_there_are_cuda_sources():
    assert CU_FILES, "csrc/cuda/ holds no .cu files"


# ------------------------------------------------------------------ registrations vs schemas
# Schema argument type -> the C++ parameter type torch's schema inference wants for it.
_CPP_TYPE = {"Tensor": "Tensor", "Tensor[]": "TensorList", "int": "int64_t", "float": "double", "bool": "bool"}


def _schemas() -> dict[str, list[str]]:
    """{op name: [C++ parameter type per argument]} of every m.def in csrc/*.cpp."""
    out = {}
    for cpp in sorted((ROOT / "csrc").glob("*.cpp")):
        for call in re.finditer(r"m\.def\(\s*((?:\"[^\"]*\"\s*)+)\)", cpp.read_text()):
            schema = "".join(re.findall(r'"([^"]*)"', call.group(1)))
            m = re.fullmatch(r"\s*(\w+)\((.*)\)\s*->.*", schema)
            assert m, f"{cpp.name}: cannot parse schema {schema!r}"
            args = [a.strip() for a in m.group(2).split(",") if a.strip()]
            types = []
            for a in args:
                t = re.sub(r"\(\w!?\)", "", a.split()[0])  # Tensor(a!) -> Tensor
                assert t in _CPP_TYPE, f"{cpp.name}: schema {m.group(1)}: unknown argument type {t!r}"
                types.append(_CPP_TYPE[t])
            out[m.group(1)] = types
    return out


def _param_type(param: str) -> str:
    for t in ("TensorList", "Tensor", "int64_t", "double", "bool"):
        if re.search(rf"\b{t}\b", param):
            return t
    return param.strip()


def _cuda_registrations() -> list[tuple[str, str, list[str]]]:
    """[(file, op name, [C++ parameter types of the registered function])] of every CUDA m.impl."""
    out = []
    for cu in CU_FILES:
        text = cu.read_text()
        for name, func in re.findall(r'm\.impl\(\s*"(\w+)"\s*,\s*&[\w:]*?(\w+)\s*\)', text):
            defs = re.findall(rf"\b{func}\(([^)]*)\)\s*\{{", text)
            assert len(defs) == 1, f"{cu.name}: expected one definition of {func}, found {len(defs)}"
            out.append((cu.name, name, [_param_type(p) for p in defs[0].split(",") if p.strip()]))
    return out


def test_cuda_registrations_match_schemas():
    schemas = _schemas()
    regs = _cuda_registrations()
    assert {"project", "project_out", "project_strategy"} <= {name for _, name, _ in regs}
    for file, name, params in regs:
        assert name in schemas, f"csrc/cuda/{file} registers kgreason::{name}, which no csrc/*.cpp defines"
        assert params == schemas[name], (f"csrc/cuda/{file}: kgreason::{name} takes {params}, "
                                         f"its schema wants {schemas[name]}")
