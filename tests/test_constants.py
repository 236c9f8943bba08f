"""Each shared convention is defined once, in :mod:`kgreason.constants`, and every other site names it.

Issue 33: QTO's negation scale 3.0 was typed at nine library sites (function defaults, a settings
dataclass, two ``--neg-scale`` flags) and ``INVERSE_SUFFIX`` was defined four times.  These checks read the
source (AST), so a re-typed literal fails here even when its value is still right.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from kgreason.constants import INVERSE_SUFFIX, QTO_NEG_SCALE

ROOT = Path(__file__).resolve().parents[1]
#: The library packages, the benchmarks (which time the library at its defaults) and the tests.
SOURCES = ("kgreason", "ops", "kge", "engine", "llm_bridge", "benchmarks", "tests")
HOME = ROOT / "kgreason" / "constants.py"
#: Literals kept on purpose: code run against a checkout older than kgreason/constants.py (the before/after
#: worker of benchmarks/test_ops_bench.py is a string, so not seen here).
KEPT = {("benchmarks/ops_cuda_bench.py", "NEG_SCALE")}


def _files() -> list[Path]:
    return sorted(p for top in SOURCES for p in (ROOT / top).rglob("*.py") if p != HOME)


def _is_number(node: ast.AST | None) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool)


def violations(path: Path, source: str) -> list[str]:
    """``file:line: what`` for every re-definition of a shared constant or a neg_scale default typed as a number."""
    rel = path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else str(path)
    tree = ast.parse(source)
    bad = []

    def at(node: ast.AST, what: str) -> None:
        bad.append(f"{rel}:{getattr(node, 'lineno', '?')}: {what}")

    for node in ast.walk(tree):
        targets = (node.targets if isinstance(node, ast.Assign)
                   else [node.target] if isinstance(node, ast.AnnAssign) else [])
        for t in targets:
            name = t.id if isinstance(t, ast.Name) else t.attr if isinstance(t, ast.Attribute) else None
            if name in ("INVERSE_SUFFIX", "QTO_NEG_SCALE"):
                at(node, f"defines {name} (import it from kgreason.constants)")
            if name is not None and "neg_scale" in name.lower() and _is_number(node.value) \
                    and node.value.value == QTO_NEG_SCALE and (rel, name) not in KEPT:
                at(node, f"{name} = {ast.unparse(node.value)} (use kgreason.constants.QTO_NEG_SCALE)")
        if isinstance(node, ast.Constant) and node.value == INVERSE_SUFFIX and not rel.startswith("tests/"):
            at(node, f"the literal {INVERSE_SUFFIX!r} (use kgreason.constants.INVERSE_SUFFIX)")
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            a = node.args
            pos = a.posonlyargs + a.args
            pairs = list(zip(pos[len(pos) - len(a.defaults):], a.defaults)) + list(zip(a.kwonlyargs, a.kw_defaults))
            for arg, default in pairs:
                if arg.arg == "neg_scale" and _is_number(default):
                    at(default, f"neg_scale={ast.unparse(default)} (use kgreason.constants.QTO_NEG_SCALE)")
        if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) \
                and node.args[0].value == "--neg-scale":
            for kw in node.keywords:
                if kw.arg == "default" and _is_number(kw.value):
                    at(kw.value, f"--neg-scale default {ast.unparse(kw.value)} (use kgreason.constants.QTO_NEG_SCALE)")
        if isinstance(node, ast.keyword) and node.arg == "neg_scale" and _is_number(node.value) \
                and node.value.value == QTO_NEG_SCALE:
            at(node.value, f"neg_scale={ast.unparse(node.value)} (QTO's: use kgreason.constants.QTO_NEG_SCALE)")
    return bad


def test_shared_constants_are_defined_once():
    bad = [v for p in _files() for v in violations(p, p.read_text(encoding="utf-8"))]
    assert not bad, "shared constants typed outside kgreason.constants:\n" + "\n".join(bad)


def test_the_constants_hold_the_documented_values():
    assert (INVERSE_SUFFIX, QTO_NEG_SCALE) == ("^-1", 3.0)


@pytest.mark.parametrize("snippet", [
    'INVERSE_SUFFIX = "^-1"\n',
    'def f(name):\n    return name.endswith("^-1")\n',
    "def project(x, *, neg_scale: float = 3.0):\n    pass\n",
    "from dataclasses import dataclass\n@dataclass\nclass C:\n    neg_scale: float = 3.0\n",
    'p.add_argument("--neg-scale", type=float, default=3)\n',
    "NEG_SCALE = 3.0\n",
    "f(x, negate=True, neg_scale=3.0)\n",
])
def test_a_planted_literal_is_found(snippet):
    assert violations(ROOT / "ops" / "planted.py", snippet), snippet


def test_other_values_and_the_named_constant_pass():
    ok = ("from kgreason.constants import QTO_NEG_SCALE\n"
          "def project(x, *, neg_scale: float = QTO_NEG_SCALE):\n    pass\n"
          "project(x, neg_scale=0.5)\n")
    assert violations(ROOT / "ops" / "planted.py", ok) == []
