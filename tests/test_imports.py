"""Layering: what importing each package loads (fresh interpreters) and the project's import graph.

The layers, bottom to top::

    kgreason  <-  ops  <-  kge  <-  engine.lang, engine.paths  <-  engine.eval, engine.exec  <-  engine  <-  llm_bridge
        <-  experiments

(``experiments`` holds the research tools beside the library -- experiment runners, simulators, linkeval, the
synthetic KG, plots: no library package (:data:`LIBRARY`) imports it, eagerly or lazily, with no allow-list.
``engine``'s CLIs reach the LLM bridge through the provider registry it owns, :mod:`engine.providers`.)

(``kge`` sits above ``ops``: a calibration runs its post-GEMM step through ``ops.calibrate_rows``;
``engine.paths`` sits below ``engine.exec``: the executor's ask loop retrieves relation paths.)

A module may import a package of a strictly lower layer (or its own package), lazily (inside a function)
or not.  Entry points (``python -m`` modules: a ``__main__.py`` or an ``if __name__ == "__main__"`` block)
follow the same rule as the rest of their package, and no library module imports one (a CLI is the top:
``kge.artifact`` importing the build CLI made five kge modules one import circle).  No import cycle between
modules, lazy imports included.  What still breaks a rule and belongs to a larger move is listed, with its
issue, in :data:`ALLOWED_UPWARD` and :data:`ALLOWED_ENTRY_POINT_IMPORTS`; an entry that no longer matches an
import fails, so the lists only shrink.
"""
from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: The library: the packages ``pip install`` users import (the tools beside it, TOOLS, are not part of it).
LIBRARY = ("kgreason", "ops", "kge", "engine", "llm_bridge")
#: Top-level packages of tools beside the library: the top layer, imported by no library module.
TOOLS = ("experiments",)
TOP = LIBRARY + TOOLS
PACKAGES = ["kgreason", "ops", "kge", "engine", "engine.lang", "engine.exec", "engine.eval", "engine.paths",
            "llm_bridge", "experiments"]
#: Layer of each package (imports must go to a strictly lower layer).
LAYER = {"kgreason": 0, "ops": 1, "kge": 2, "engine.lang": 3, "engine.eval": 4, "engine.exec": 4,
         "engine.paths": 3, "engine": 5, "llm_bridge": 6, "experiments": 7}
#: Imports against the layering kept for now: (importing module, imported package) -> why, with its issue.
#: (Empty since issue 33: engine.answer / engine.ask reach llm_bridge through engine.providers.)
ALLOWED_UPWARD: dict[tuple[str, str], str] = {}
#: Library modules importing an entry point, kept for now: (library module, entry point) -> why, with its issue.
ALLOWED_ENTRY_POINT_IMPORTS: dict[tuple[str, str], str] = {}
#: Heavy or optional third-party packages no project package may load at import time.
NEVER_AT_IMPORT = {"pykeen", "sentence_transformers"}
#: Top-level modules importing (every module of) a package must not load, beyond NEVER_AT_IMPORT.
FORBIDDEN = {
    "ops": {"kge", "engine", "llm_bridge", "scipy"},
    "kge": {"ops", "engine", "llm_bridge"},
    "engine.lang": {"torch", "ops", "kge", "llm_bridge", "scipy"},
    "engine.eval": {"llm_bridge"},
    "engine.exec": {"llm_bridge"},
    "engine.paths": {"llm_bridge"},
    "engine": {"llm_bridge"},  # the CLIs find their LLM provider when called, not when imported
}
for _p in PACKAGES:  # no library package loads a tool
    if _p.split(".")[0] in LIBRARY:
        FORBIDDEN.setdefault(_p, set()).update(TOOLS)


# ------------------------------------------------------------------ the project's modules
@lru_cache(maxsize=None)
def project_modules() -> dict[str, Path]:
    """Dotted name -> file of every project module (packages by their ``__init__``)."""
    out = {}
    for top in TOP:
        for path in sorted((ROOT / top).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = path
    return out


def _is_package(name: str) -> bool:
    return project_modules()[name].name == "__init__.py"


def package_of(name: str) -> str:
    """The package a module belongs to (a package is its own)."""
    return name if _is_package(name) else name.rsplit(".", 1)[0]


@lru_cache(maxsize=None)  # asked once per import edge by the package-graph tests
def is_entry_point(name: str) -> bool:
    path = project_modules()[name]
    if path.name == "__main__.py":
        return True
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return any(isinstance(n, ast.If) and ast.unparse(n.test).replace("'", '"') == '__name__ == "__main__"'
               for n in tree.body)


def _owner(target: str) -> str | None:
    """The project module an imported dotted name refers to (a name inside a module -> the module)."""
    mods = project_modules()
    while target and target not in mods:
        target = target.rpartition(".")[0]
    return target or None


def _resolve(module: str, node: ast.Import | ast.ImportFrom) -> list[str]:
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    else:
        if node.level:
            base = module.split(".") if _is_package(module) else module.split(".")[:-1]
            base = base[: len(base) - node.level + 1]
            prefix = ".".join(base + ([node.module] if node.module else []))
        else:
            prefix = node.module or ""
        # `from pkg import sub` imports the submodule when there is one, else a name of pkg
        names = [f"{prefix}.{a.name}" if f"{prefix}.{a.name}" in project_modules() else prefix for a in node.names]
    return [o for n in names if n.split(".")[0] in TOP and (o := _owner(n)) is not None]


@lru_cache(maxsize=None)
def imports_of(module: str) -> tuple[tuple[str, bool], ...]:
    """(imported project module, at import time?) for every import statement of ``module``.

    Imports inside functions run later (lazy); imports under ``if TYPE_CHECKING:`` never run.
    """
    tree = ast.parse(project_modules()[module].read_text(encoding="utf-8"))
    found: list[tuple[str, bool]] = []

    def walk(nodes, lazy: bool) -> None:
        for n in nodes:
            if isinstance(n, (ast.Import, ast.ImportFrom)):
                found.extend((t, not lazy) for t in _resolve(module, n))
                continue
            if isinstance(n, ast.If) and "TYPE_CHECKING" in ast.unparse(n.test):
                walk(n.orelse, lazy)
                continue
            inner = lazy or isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            for child in ast.iter_child_nodes(n):
                walk([child], inner)

    walk(tree.body, False)
    return tuple(found)


def _find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(u: str) -> list[str] | None:
        state[u] = 1
        stack.append(u)
        for v in sorted(graph.get(u, ())):
            if state.get(v) == 1:
                return stack[stack.index(v):] + [v]
            if v not in state and (cycle := visit(v)):
                return cycle
        stack.pop()
        state[u] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


Imports = dict[str, tuple[tuple[str, bool], ...]]


def project_imports() -> Imports:
    """``imports_of`` of every project module."""
    return {m: imports_of(m) for m in project_modules()}


def module_cycle(imports: Imports) -> list[str] | None:
    """A cycle of module imports, lazy ones included (a module importing its own package's ``__init__`` apart)."""
    graph = {m: {t for t, _ in ts if t != m and not m.startswith(t + ".")} for m, ts in imports.items()}
    return _find_cycle(graph)


def package_cycle(imports: Imports) -> list[str] | None:
    """A cycle between packages, every import counted (lazy ones, entry points') but the allowed upward ones."""
    graph: dict[str, set[str]] = {}
    for m, ts in imports.items():
        src = package_of(m)
        graph.setdefault(src, set()).update(
            dst for t, _ in ts if (dst := package_of(t)) != src and (m, _top_package(dst)) not in ALLOWED_UPWARD)
    return _find_cycle(graph)


def _top_package(package: str) -> str:
    return package.split(".")[0]


def layer_violations(imports: Imports) -> list[str]:
    """Imports of any module (entry points included) into a package not strictly below its own."""
    bad = []
    for m in sorted(imports):
        src = package_of(m)
        for t, eager in imports[m]:
            dst = package_of(t)
            if dst != src and not LAYER[dst] < LAYER[src] and (m, _top_package(dst)) not in ALLOWED_UPWARD:
                bad.append(f"{m} ({src}, layer {LAYER[src]}) imports {t} ({dst}, layer {LAYER[dst]})"
                           f"{'' if eager else ' lazily'}")
    return bad


def library_imports_of_tools(imports: Imports) -> list[str]:
    """Imports of a tool package (:data:`TOOLS`) by a library module, lazy ones included (no allow-list)."""
    return [f"{m} imports the tool {t}{'' if eager else ' lazily'}"
            for m in sorted(imports) if m.split(".")[0] in LIBRARY
            for t, eager in imports[m] if t.split(".")[0] in TOOLS]


def entry_point_imports(imports: Imports) -> list[str]:
    """Imports of an entry point by a module that is not one (a library reaching up into a CLI)."""
    return [f"{m} imports the entry point {t}{'' if eager else ' lazily'}"
            for m in sorted(imports) if not is_entry_point(m)
            for t, eager in imports[m] if t != m and is_entry_point(t) and (m, t) not in ALLOWED_ENTRY_POINT_IMPORTS]


# ------------------------------------------------------------------ static checks
def test_every_package_has_a_layer():
    packages = {package_of(m) for m in project_modules()}
    assert packages == set(LAYER), f"packages without a layer: {packages - set(LAYER)}"


def test_no_import_cycle_between_modules():
    """Imports between modules form no cycle, lazy (function-level) imports included."""
    cycle = module_cycle(project_imports())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_no_cycle_between_packages():
    """Every import between packages, lazy ones and entry points' included, goes one way."""
    cycle = package_cycle(project_imports())
    assert cycle is None, "package cycle: " + " -> ".join(cycle)


def test_imports_go_down_the_layers():
    bad = layer_violations(project_imports())
    assert not bad, "imports against the layering:\n" + "\n".join(bad)


def test_library_imports_no_tool():
    """kgreason, ops, kge, engine and llm_bridge import nothing from experiments (eagerly or lazily)."""
    bad = library_imports_of_tools(project_imports())
    assert not bad, "library modules importing the tools beside it:\n" + "\n".join(bad)


def test_no_library_module_imports_an_entry_point():
    bad = entry_point_imports(project_imports())
    assert not bad, "library modules importing a CLI:\n" + "\n".join(bad)


def test_every_allowed_exception_is_still_needed():
    """The allow-lists only shrink: each entry still matches an import (else it hides nothing and goes)."""
    imports = project_imports()
    up = {(m, _top_package(package_of(t))) for m, ts in imports.items() for t, _ in ts}
    entry = {(m, t) for m, ts in imports.items() for t, _ in ts}
    stale = sorted(set(ALLOWED_UPWARD) - up) + sorted(set(ALLOWED_ENTRY_POINT_IMPORTS) - entry)
    assert not stale, f"allow-list entries that match no import any more: {stale}"


def _planted(module: str, target: str, *, eager: bool) -> Imports:
    imports = dict(project_imports())
    imports[module] = imports[module] + ((target, eager),)
    return imports


def test_the_rules_find_planted_violations():
    """Each rule fails on one planted import of the kind it missed before issue 33."""
    # an entry point importing upward (entry points were exempt): engine.evaluate -> llm_bridge
    assert any("engine.evaluate" in v for v in layer_violations(_planted("engine.evaluate", "llm_bridge.cli", eager=False)))
    # a library module importing a CLI (invisible before): kge.artifact -> kge.build, lazily as it did
    planted = _planted("kge.artifact", "kge.build", eager=False)
    assert entry_point_imports(planted) == ["kge.artifact imports the entry point kge.build lazily"]
    # the circle that lazy import closed (lazy imports were left out of the cycle search)
    cycle = module_cycle(planted)
    assert cycle is not None and "kge.artifact" in cycle and "kge.build" in cycle
    # a package cycle through an entry point (entry points' imports were not counted): ops -> kge.build
    assert package_cycle(_planted("ops.projection", "kge.build", eager=False)) is not None
    # an allowed upward import counts for its own module only
    assert layer_violations(_planted("engine.evaluate", "llm_bridge.config", eager=True))
    # issue 33: a library module reaching into the tools beside it, lazily (as the simulator's users did)
    planted = _planted("llm_bridge.lgot", "experiments.simulate", eager=False)
    assert library_imports_of_tools(planted) == ["llm_bridge.lgot imports the tool experiments.simulate lazily"]
    assert any(v.startswith("llm_bridge.lgot (llm_bridge, layer 6) imports experiments.simulate")
               for v in layer_violations(planted))
    # and the arrow issue 33 removed: engine's CLI importing the LLM bridge again (no allow-list entry now)
    assert layer_violations(_planted("engine.answer", "llm_bridge.cli", eager=False)) == [
        "engine.answer (engine, layer 5) imports llm_bridge.cli (llm_bridge, layer 6) lazily"]


def test_cycle_finder_finds_cycles():
    assert _find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


# ------------------------------------------------------------------ fresh interpreters
def _modules_of(package: str) -> list[str]:
    """The package and its own modules (not its subpackages' modules)."""
    return [m for m in project_modules() if m == package or (package_of(m) == package and not _is_package(m))]


def loaded_after_import(modules: list[str]) -> set[str]:
    """Top-level names in ``sys.modules`` after importing ``modules`` in a fresh interpreter."""
    code = ("import importlib, json, sys\n"
            f"for m in {modules!r}:\n    importlib.import_module(m)\n"
            "print(json.dumps(sorted({k.split('.')[0] for k in sys.modules})))")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, f"importing {modules} failed:\n{proc.stderr[-3000:]}"
    return set(json.loads(proc.stdout.strip().splitlines()[-1]))


def _check_loaded(package: str, loaded: set[str]) -> None:
    heavy = loaded & NEVER_AT_IMPORT
    assert not heavy, f"importing {package} loads {sorted(heavy)}"
    bad = loaded & FORBIDDEN.get(package, set())
    assert not bad, f"importing {package} loads {sorted(bad)}"
    if package == "kgreason":  # the base of every layer: the standard library only
        extra = {m for m in loaded if m not in sys.stdlib_module_names and not m.startswith("_")} - {"kgreason"}
        assert not extra, f"importing kgreason loads {sorted(extra)}"


@pytest.mark.slow  # ~2.5 s of CPU per package (torch imported nine times); fast twin: test_import_in_shared_interpreter
@pytest.mark.parametrize("package", PACKAGES)
def test_import_in_fresh_interpreter(package):
    _check_loaded(package, loaded_after_import(_modules_of(package)))


# ------------------------------------------------------------------ one interpreter, a fork per package
# Importing torch is most of each fresh interpreter's cost.  One interpreter imports it once and forks a
# child per package, which imports that package's modules and reports sys.modules.  A child sees what
# its parent had loaded, so its set is a superset of a fresh interpreter's: the checks can only fail
# more, never less.  For that reason the packages that must not load torch (and kgreason, which may
# load nothing outside the standard library) fork before torch is imported; the others after, and
# test_import_in_shared_interpreter fails (instead of blaming the package) if torch itself loads a
# module forbidden to one of them.
_FORK_DRIVER = r"""
import importlib, json, os, sys, traceback

def loaded():
    return sorted({k.split('.')[0] for k in sys.modules})

def in_child(modules):
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            for m in modules:
                importlib.import_module(m)
            out = {"loaded": loaded()}
        except BaseException:
            out = {"error": traceback.format_exc()}
        with os.fdopen(w, "w") as f:
            f.write(json.dumps(out))
        os._exit(0)
    os.close(w)
    with os.fdopen(r) as f:
        data = f.read()
    _, status = os.waitpid(pid, 0)
    return json.loads(data) if data else {"error": f"child exited with status {status} and no report"}

results = {}
for preload, packages in json.loads(sys.argv[1]):
    for m in preload:
        importlib.import_module(m)
    pre = loaded()
    for package, modules in packages:
        results[package] = dict(in_child(modules), preloaded=pre)
print(json.dumps(results))
"""
#: Packages forked from the bare interpreter: those that must not load torch, and the stdlib-only base.
BARE = ["kgreason"] + [p for p in PACKAGES if "torch" in FORBIDDEN.get(p, ())]


@pytest.fixture(scope="module")
def shared_interpreter_imports() -> dict[str, dict]:
    """{package: {"loaded" or "error", "preloaded"}} from one interpreter forking a child per package."""
    if not hasattr(os, "fork"):  # no fork (Windows): one fresh interpreter per package, as the slow twin
        return {p: {"loaded": sorted(loaded_after_import(_modules_of(p))), "preloaded": []} for p in PACKAGES}
    plan = [[[], [[p, _modules_of(p)] for p in BARE]],
            [["torch"], [[p, _modules_of(p)] for p in PACKAGES if p not in BARE]]]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-c", _FORK_DRIVER, json.dumps(plan)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"the import driver failed:\n{proc.stderr[-3000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("package", PACKAGES)
def test_import_in_shared_interpreter(shared_interpreter_imports, package):
    """What importing each package loads, from a fork of one interpreter (torch imported once)."""
    res = shared_interpreter_imports[package]
    assert "error" not in res, f"importing {package} failed:\n{res['error'][-3000:]}"
    pre = set(res["preloaded"])
    inherited = pre & (NEVER_AT_IMPORT | FORBIDDEN.get(package, set()))
    assert not inherited, (f"the shared interpreter had loaded {sorted(inherited)} before forking for {package}, "
                        f"which {package} must not load: add {package} to BARE")
    _check_loaded(package, set(res["loaded"]))
