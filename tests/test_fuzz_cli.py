"""Fuzzing every CLI's ``main(argv)`` with random argument vectors.

The options come from each CLI's own argparse parser (captured at run time,
so a new option is fuzzed without touching this file); values come from a
domain per option: real input files of a tiny artifact (tests/fuzz_support.py),
missing paths, folders where files are expected and the reverse, files that
are not what they claim, junk text, boundary and absurd numbers, NaN and
infinities; plus unknown flags, stray words and missing required options.

Property (issue 9): ``main`` returns 0 or 2 (``executor_identity``: also 1, a comparison
that found differences), never raises; on 2 stderr holds
exactly one ``error: ...`` message (a parse error adds its echo and caret
lines); no file or folder of the example changes, inputs or not (issue 32: only outputs the
command line names may appear or change, and an artifact ``--overwrite`` replaces);
no temporary ``.building-``/``.part-`` leftovers; everything happens inside the
example's folder (cwd, HOME, XDG_CACHE_HOME, KGREASON_HOME, TMPDIR there).

Never fuzzed: the ``--llm*`` options of engine.answer, engine.ask and experiments.lgot_eval
(they call a model server; the experiment runs its own simulator), engine.ask without
``--encoder`` (it gets ``hashing``), experiments.linkeval's ``--embedding minilm``, and
engine.paths' model encoders (``minilm``, ``sentence-transformers`` download
models); ``kge.build`` only ever trains a few epochs at rank <= 8 on the
16-entity KG (or reuses embeddings); ``experiments.synthetic_kg``'s valid sizes stay below
60 entities and 200 edges (its absurd ones must be refused up front, by its
checks or its memory and disk estimates); ``experiments.lgot_eval`` samples
at most 3 queries per structure and runs one simulator configuration; the simulators never
enter their serving loop (``serve_forever`` returns at once); ``experiments.metaqa_ask`` never reads
the real MetaQA release, loads MiniLM or writes its default ``--md``/``--png`` (in the
repository); ``ops_cuda_bench.py`` always runs ``--quick`` and ``--root``/``executor_identity.py
--tree`` only ever name this checkout (another one's packages would be imported).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any, Callable

import pytest
from hypothesis import Phase, event, given, settings
from hypothesis.control import currently_in_test_context
from hypothesis import strategies as st

from fuzz_support import (
    REPO,
    TINY_ENTITIES,
    TINY_RELATIONS,
    check_cli_stderr,
    copy_inputs,
    fresh_dir,
    load_script,
    run_cli,
    snapshot,
    tiny_world,
)
from engine.lang.query import to_sexpr
from test_fuzz_query import any_text as query_texts
from test_fuzz_query import known_asts

SLOW = settings(settings.get_profile("slow"))


# ------------------------------------------------------------------------ the CLIs and their parsers
def _cli(module: str) -> Callable:
    """``main`` of a package CLI (``engine.answer``) or of a script (``benchmarks/....py``, loaded from its file)."""
    import importlib

    if module.endswith(".py"):
        return load_script(module).main
    return importlib.import_module(module).main


CLIS = {
    "engine.answer": "engine.answer",
    "engine.evaluate": "engine.evaluate",
    "engine.sample": "engine.sample",
    "engine.betae": "engine.betae",
    "engine.paths": "engine.paths.__main__",
    "kge.build": "kge.build",
    "experiments.synthetic_kg": "experiments.synthetic_kg",
    "experiments.train_curve": "experiments.train_curve",
    "kge.linkpred": "kge.linkpred",
    "kge.materialize": "kge.materialize",
    "experiments.lgot_eval": "experiments.lgot_eval",
    "engine.ask": "engine.ask",
    "experiments.linkeval": "experiments.linkeval",
    "experiments.simulate_ask": "experiments.simulate_ask",
    "experiments.simulate": "experiments.simulate",
    "experiments.metaqa_lgot": "experiments.metaqa_lgot",
    "experiments.metaqa_ask": "experiments.metaqa_ask",
    # the benchmark scripts the README and docs tell users to run
    "betae_1p_queries": "benchmarks/betae_1p_queries.py",
    "executor_memory": "benchmarks/executor_memory.py",
    "ops_cuda_bench": "benchmarks/ops_cuda_bench.py",
    "executor_identity": "benchmarks/executor_identity.py",
}
#: CLIs that may also return 1: a comparison found differences (executor_identity run/report).
_RC1 = ("executor_identity",)
#: CLIs that serve until Ctrl-C: their serving loop is not entered (``serve_forever`` returns at once), so a
#: run tests everything before it (arguments, the artifact, the questions, binding the port) and ends.
_SERVERS = ("experiments.simulate_ask", "experiments.simulate")
#: CLIs whose --artifact / --data / --metaqa are the tiny MetaQA world's (tests/fuzz_support.py).
_METAQA = ("experiments.simulate_ask", "experiments.metaqa_lgot", "experiments.metaqa_ask")


class _Captured(Exception):
    def __init__(self, parser: argparse.ArgumentParser) -> None:
        self.parser = parser


def capture_parser(module: str) -> argparse.ArgumentParser:
    """The argparse parser a CLI builds, caught when its ``main`` asks it to parse."""
    main = _cli(module)

    def grab(self, args=None, namespace=None):
        if not self.add_help:  # a pre-parser (executor_identity's --tree, read before the project is imported)
            return saved(self, args, namespace)
        raise _Captured(self)

    saved = argparse.ArgumentParser.parse_known_args
    argparse.ArgumentParser.parse_known_args = grab  # parse_args goes through parse_known_args
    try:
        main.__wrapped__([]) if hasattr(main, "__wrapped__") else main([])
    except _Captured as c:
        return c.parser
    finally:
        argparse.ArgumentParser.parse_known_args = saved
    raise AssertionError(f"{module}.main did not parse its arguments with argparse")


@pytest.fixture(scope="module")
def parsers():
    return {name: capture_parser(mod) for name, mod in CLIS.items()}


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return tiny_world(tmp_path_factory)


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    return tmp_path_factory.mktemp("fuzz-cli")


# ------------------------------------------------------------------------ value domains
_JUNK = st.sampled_from(["", " ", "x", "-1", "0", "1e3", "nan", "None", "--", "-", "é", "\x00", "a\nb", "{", "[]",
                         "../..", "/", "~", "$HOME", "%s", "\t"])
_INTS = st.one_of(st.integers(-3, 20).map(str), st.sampled_from(["0", "-1", "1000000000", str(2**63), str(-2**63),
                                                                  "99999999999999999999999", "1.5", "1e3", "x", ""]))
_FLOATS = st.one_of(st.floats(allow_nan=True, allow_infinity=True).map(repr),
                    st.sampled_from(["0", "0.5", "1", "3", "-1", "nan", "inf", "-inf", "1e400", "1e-400", "x", ""]))


class Layout:
    """An example's folder: ``inputs/`` (the world's files, a user's folder), outputs named in cwd."""

    def __init__(self, root: Path, world) -> None:
        self.root = root
        self.inputs = root / "inputs"
        paths = copy_inputs(world, self.inputs)
        self.kg = paths["kg"]
        self.art = paths["artifact_dir"]
        self.jsonl = paths["queries"]
        self.betae = paths["betae_folder"]
        self.pkl = paths["betae_queries"]
        self.metaqa = paths["metaqa"]
        self.mqa_art = paths["mqa_art"]
        self.mqa_questions = paths["mqa_questions"]
        self.mqa_exemplars = paths["mqa_exemplars"]
        self.mqa_results = paths["mqa_results"]
        self.identity_queries = paths["identity_queries"]
        self.identity_record = paths["identity_record"]
        user = self.inputs / "user"
        user.mkdir()
        (user / "notes.txt").write_text("keep me\n")
        (user / "sub").mkdir()
        (user / "sub" / "x").write_text("keep me too\n")
        self.user = user
        (self.inputs / "empty").mkdir()
        (self.inputs / "latin1.tsv").write_bytes("Zoë\tr\tb\n".encode("latin-1"))
        (self.inputs / "empty.tsv").write_bytes(b"")
        (self.inputs / "bad.pkl").write_bytes(b"\x80\x04not a pickle")
        (self.inputs / "list_meta").mkdir()
        (self.inputs / "list_meta" / "meta.json").write_text("[1, 2]")
        # A BetaE pickle whose structure key nests 2000 levels (20 bytes a level: 'r', TUPLE1, TUPLE2).
        (self.inputs / "deep.pkl").write_bytes(b"\x80\x04}X\x01\x00\x00\x00e\x85" + b"X\x01\x00\x00\x00r\x85\x86" * 2000
                                                + b"\x8f(J\x01\x00\x00\x00\x90s.")
        (self.inputs / "bad.jsonl").write_text('{"query": "(p r0 e0)", "structure": "2i"}\nnot json\n')
        # engine.ask: questions (plain and JSON lines with gold answers) and labelled exemplars of the tiny KG.
        self.ask_questions = self.inputs / "questions.jsonl"
        self.ask_questions.write_text('what does [e0] r0\n{"question": "who likes [e1]", "answers": ["e2"]}\n'
                                      '{"question": "[Zoë] is part of what"}\n', encoding="utf-8")
        self.exemplars = self.inputs / "exemplars.jsonl"
        self.exemplars.write_text('{"question": "what does [e3] r0", "path": ["r0"]}\n'
                                  '{"question": "who likes [e4]", "path": ["likes^-1"]}\n', encoding="utf-8")
        # experiments.linkeval: a MetaQA-style kb.txt (head|relation|tail) of 30 films, people and years.
        self.metaqa_kb = self.inputs / "kb.txt"
        self.metaqa_kb.write_text("".join(f"Film {i}|directed_by|Person {i % 7}\nFilm {i}|release_year|{1990 + i % 5}\n"
                                          for i in range(30)), encoding="utf-8")
        # The default artifact (engine.answer without --artifact) is the tiny one: nothing is ever trained.
        umls = root / "home" / "kgreason" / "artifacts" / "umls"
        umls.parent.mkdir(parents=True)
        shutil.copytree(self.art, umls)

    def rel(self, p: Path) -> str:
        return os.path.relpath(p, self.root)


def _input_file_choices(lay: Layout) -> list[str]:
    return [lay.rel(p) for p in (lay.kg, lay.jsonl, lay.pkl, lay.inputs / "latin1.tsv", lay.inputs / "empty.tsv",
                                 lay.inputs / "bad.pkl", lay.inputs / "bad.jsonl", lay.inputs / "deep.pkl",
                                 lay.art / "meta.json", lay.mqa_questions, lay.mqa_exemplars, lay.mqa_results,
                                 lay.metaqa / "kb.txt", lay.metaqa / "1-hop" / "test.txt")]


def _folder_choices(lay: Layout) -> list[str]:
    return [lay.rel(p) for p in (lay.art, lay.betae, lay.user, lay.inputs / "empty", lay.inputs / "list_meta",
                                 lay.metaqa, lay.mqa_art)] + ["missing", "missing/deeper", "."]


# Hostile values (issue 32) besides the junk above: option-looking values, huge numbers, control characters and
# paths with '..' or absolute ones.  Paths that a run may *write* stay inside the example's folder (the property
# must see any write they cause; none may reach a real file of this machine); paths it only reads may be anywhere.
_HOSTILE_TEXT = st.sampled_from(["--output=x", "-h", "--help", "-x", "-1e309", "9" * 40, "-" + "9" * 40, "1e309",
                                 "\x1b[2J", "a\rb", "\u202e", "\u2028", "\x07", "x\x00y"])


def _hostile(lay: Layout, *, written: bool) -> st.SearchStrategy[str]:
    inside = [str(lay.root / "abs_out.json"), str(lay.user / "notes.txt"), str(lay.art), str(lay.inputs / "empty"),
              "inputs/../inputs/user/notes.txt", f"x/../../{lay.root.name}/o.json", "./inputs/user/../user/new.md"]
    read_only = ["/etc/passwd", "/", "/tmp", "../..", "../outside", "/dev/null", "/proc/self/status"]
    return st.one_of(_HOSTILE_TEXT, st.sampled_from(inside if written else inside + read_only))


_STRUCTURES = ["1p", "2p", "3p", "2i", "3i", "ip", "pi", "2in", "3in", "inp", "pin", "pni", "2u", "up"]
_ENTITIES = TINY_ENTITIES + ["#0", "#3", "#15"]
_RELATIONS = TINY_RELATIONS + [r + "^-1" for r in TINY_RELATIONS] + ["#0", "#7"]
# Valid numbers per option (dest): small enough that every run stays fast on the tiny KG.
_VALID_INTS = {"top_k": (1, 20), "seed": (0, 1000), "batch_size": (1, 64), "limit": (1, 5), "per_structure": (1, 3),
               "max_answers": (1, 100), "k": (1, 20), "beam_width": (1, 16), "max_hops": (1, 4),
               "max_sequences": (1, 1000), "max_entity_paths": (1, 5), "epochs": (1, 2), "rank": (1, 8),
               "num_negatives": (1, 4), "chunk_rows": (1, 4096), "eval_max_triples": (0, 50), "llm_inputs": (1, 3),
               "entities": (2, 60), "relations": (1, 5), "edges": (3, 200), "types": (1, 5), "answer_check": (0, 3),
               "answers": (1, 10), "candidate_relations": (1, 30), "max_context_tokens": (0, 2000),
               "exemplar_k": (1, 5), "per_kind": (1, 20), "max_names": (10, 40), "per_hop": (0, 3),
               "first": (0, 3), "ks": (1, 4), "samples": (1, 2)}
_VALID_FLOATS = {"neg_scale": (0.5, 5.0), "drop_edges": (0.0, 0.5), "lr": (0.001, 0.1), "regularizer_weight": (0.0, 0.1),
                 "threshold": (1e-4, 0.5), "max_matrix_gb": (0.01, 2.0), "delta": (0.0, 0.5), "sim_latency_ms": (0.0, 1.0),
                 "noise": (0.0, 0.3), "recall": (0.0, 1.0), "hallucination": (0.0, 0.9), "theta": (0.0, 1.0),
                 "alpha": (0.0, 1.0), "exemplar_weight": (0.0, 10.0), "held_out": (0.05, 0.5),
                 "min_precision": (0.5, 1.0), "errors": (0.0, 1.0), "weights": (0.0, 2.0),
                 "length_penalty": (0.0, 1.0), "latency_ms": (0.0, 5.0), "hang_s": (0.0, 1.0), "fail_rate": (0.0, 1.0),
                 "plan_error": (0.0, 1.0), "reason_error": (0.0, 1.0), "unknown": (0.0, 1.0), "empty": (0.0, 1.0),
                 "malformed": (0.0, 1.0), "synonym_rate": (0.0, 1.0), "input_ratio": (0.0, 1.0)}


@st.composite
def valid_value(draw, cli: str, action: argparse.Action, lay: Layout) -> list[str]:
    """Values that the option documents as fine (the run may still fail on a combination)."""
    dest = action.dest
    one: st.SearchStrategy[str]
    if cli == "executor_identity" and dest == "artifact" and isinstance(action, argparse._AppendAction):
        one = st.sampled_from(["a=" + lay.rel(lay.art), "b=" + lay.rel(lay.art)])  # run --artifact NAME=DIR
    elif cli == "executor_identity" and dest in ("out", "save"):
        one = st.sampled_from(["q.jsonl", "rec.json", "rep.md"])
    elif cli == "executor_identity" and dest == "queries":
        one = st.just(lay.rel(lay.identity_queries))
    elif cli == "executor_identity" and dest in ("before", "after", "determinism", "determinism_with", "compare"):
        one = st.just(lay.rel(lay.identity_record))
    elif cli == "executor_identity" and dest == "tree":
        one = st.just(str(REPO))  # never another checkout: its packages would be imported into this process
    elif cli == "executor_identity" and dest == "threads":
        one = st.just("1")
    elif cli in _METAQA and dest == "artifact":
        one = st.just(lay.rel(lay.mqa_art))
    elif dest in ("data", "metaqa"):
        one = st.just(lay.rel(lay.metaqa))
    elif cli == "experiments.simulate_ask" and dest == "questions":
        one = st.just(lay.rel(lay.mqa_questions))
    elif cli == "experiments.metaqa_ask" and dest in ("exemplars", "labels", "tune_exemplars"):
        one = st.just(lay.rel(lay.mqa_exemplars))
    elif cli == "experiments.metaqa_ask" and dest == "report":
        one = st.just(lay.rel(lay.mqa_results))
    elif cli == "experiments.metaqa_ask" and dest in ("export", "make_exemplars", "out", "trace_out"):
        one = st.sampled_from(["q.jsonl", "r.json", "outdir/x.json"])
    elif cli == "experiments.metaqa_ask" and dest == "build_kg_only":
        one = st.sampled_from(["new_art", "deep/new_art", lay.rel(lay.inputs / "empty"), lay.rel(lay.mqa_art)])
    elif dest in ("md", "png"):
        one = st.sampled_from([f"t.{dest}", f"outdir/t.{dest}"])
    elif dest == "cache":
        one = st.sampled_from(["c.sqlite", "cache/c.sqlite"])
    elif cli == "experiments.metaqa_lgot" and dest == "out":
        one = st.sampled_from([lay.rel(lay.inputs / "empty"), "."])
    elif cli == "experiments.metaqa_lgot" and dest == "name":
        one = st.sampled_from(["metaqa", "run1", "a.b-c_d"])
    elif dest == "quality":
        one = st.sampled_from(["1/0", "0.5/0.2", "0.9/0.05"])
    elif dest == "settings":
        one = st.sampled_from(["{}", '{"k": 4}', '{"empty_variants": true}', '{"vote_paths": 2}'])
    elif dest == "host":
        one = st.just("127.0.0.1")
    elif dest == "port":
        one = st.just("0")
    elif dest == "api_key_env":
        one = st.just("HOME")
    elif dest == "root":  # ops_cuda_bench: the checkout whose ops is timed (never another: it would be imported)
        one = st.just(str(REPO))
    elif dest == "artifact":
        one = st.just(lay.rel(lay.art))
    elif dest == "kg":
        # kge.linkpred ranks a split: the BetaE folder has them, the TSV only training edges.
        one = st.sampled_from([lay.rel(lay.kg)] * (1 if cli == "kge.linkpred" else 3) + [lay.rel(lay.betae)])
    elif dest == "out" and cli in ("betae_1p_queries", "ops_cuda_bench"):
        one = st.sampled_from(["out.jsonl", "o.md"])
    elif dest == "out":
        one = st.sampled_from(["out.jsonl", "outdir"] if cli == "engine.sample" else
                              ["new_art", lay.rel(lay.inputs / "empty")] + (
                                  [lay.rel(lay.art)] if cli == "kge.build" else []))
    elif dest == "json":
        one = st.sampled_from(["out.json", "r.json"])
    elif dest == "stats_json":
        one = st.sampled_from(["stats.json", "s.json"])
    elif dest == "questions_dir":
        one = st.sampled_from(["qdir", "cache/q"])
    elif dest == "queries":
        if cli == "engine.answer":
            qf = lay.root / "queries.txt"
            qf.write_text("\n".join(to_sexpr(q) for q in draw(st.lists(known_asts, min_size=1, max_size=4))) + "\n",
                          encoding="utf-8")
            one = st.just(lay.rel(qf))
        else:
            one = st.just(lay.rel(lay.jsonl if cli == "engine.evaluate" else lay.pkl))
    elif dest == "betae_queries":
        one = st.just(lay.rel(lay.pkl))
    elif dest == "questions":  # engine.ask
        one = st.just(lay.rel(lay.ask_questions))
    elif dest == "exemplars":
        one = st.just(lay.rel(lay.exemplars))
    elif dest == "kb":  # experiments.linkeval
        one = st.just(lay.rel(lay.metaqa_kb))
    elif dest == "baseline":  # linkeval: an earlier run's results (none in the layout: refused, one line)
        one = st.just("base.json")
    elif dest == "save_results":
        one = st.sampled_from(["res.json", "r/res.json"])
    elif dest == "embedding":  # linkeval's encoder: never a model (downloads)
        one = st.just("hashing")
    elif dest in ("betae_folder", "folder"):
        one = st.just(lay.rel(lay.betae))
    elif dest == "embeddings":
        one = st.just(lay.rel(lay.art))
    elif dest == "expr":
        one = known_asts.map(to_sexpr)
    elif dest in ("query", "structures"):
        one = st.sampled_from(_STRUCTURES)
    elif dest in ("anchors", "topics"):
        one = st.sampled_from(_ENTITIES)
    elif dest == "relations" and cli != "experiments.synthetic_kg":  # experiments.synthetic_kg --relations is a count
        one = st.sampled_from(_RELATIONS)
    elif dest == "plan":
        one = st.lists(st.sampled_from(_RELATIONS[:8]), min_size=1, max_size=3).map(", ".join)
    elif dest == "encoder":
        one = st.just("hashing")
    elif dest == "encoder_kwargs":
        one = st.sampled_from(["{}", '{"dim": 16}', '{"dim": 8, "seed": 3}'])
    elif dest == "device":
        one = st.just("cpu")
    elif dest == "loss":
        one = st.sampled_from(["crossentropy", "softplus", "marginranking"])
    elif dest in _VALID_INTS:
        one = st.integers(*_VALID_INTS[dest]).map(str)
    elif dest in _VALID_FLOATS:
        one = st.floats(*_VALID_FLOATS[dest]).map(repr)
    elif action.choices:
        one = st.sampled_from([str(c) for c in action.choices])  # --hops 1 2 3: int choices
    elif action.type is int:
        one = st.integers(1, 10).map(str)
    elif action.type is float:
        one = st.floats(0.1, 1.0).map(repr)
    else:
        one = st.text(min_size=1, max_size=8)
    return [draw(one) for _ in range(_count(draw, action))]


def _count(draw, action: argparse.Action) -> int:
    n = action.nargs
    if n == "+":
        return draw(st.sampled_from([1, 1, 2, 3]))
    if n == "*":
        return draw(st.integers(0, 3))
    if n == "?":
        return draw(st.integers(0, 1))
    return n if isinstance(n, int) else 1


@st.composite
def junk_value(draw, cli: str, action: argparse.Action, lay: Layout) -> list[str]:
    """Values a user might get wrong: wrong kinds of paths, junk text, absurd numbers, NaN, no value at all."""
    dest = action.dest
    files, folders = _input_file_choices(lay), _folder_choices(lay)
    paths = st.sampled_from(files + folders)
    outputs = st.sampled_from(["out.jsonl", "missing/x.json", ".", "..", "", "outdir/",
                               lay.rel(lay.inputs / "empty"), lay.rel(lay.user), lay.rel(lay.art), lay.rel(lay.kg),
                               lay.rel(lay.jsonl), lay.rel(lay.art / "meta.json"), lay.rel(lay.user / "notes.txt")])
    one: st.SearchStrategy[str]
    if dest == "root":  # ops_cuda_bench --root: anything but another checkout (whose ops would be imported)
        one = st.one_of(st.sampled_from(folders), _JUNK)
    elif dest in ("host", "port"):  # the simulators: never a real address other than the loopback
        one = st.sampled_from(["256.0.0.1", "localhost", "x y", "\x00", "-", "::1", "-1", "65536", "99999999999",
                               "x", ""])
    elif dest in _INPUT_DESTS:
        one = st.one_of(paths, _JUNK, st.sampled_from(["pykeen:nope", "notadataset"]),
                        *([_hostile(lay, written=False)] if cli in _NEW else []))
        if dest == "queries" and cli == "engine.answer":
            qf = lay.root / "queries.txt"  # query lines from the query-language fuzzer
            qf.write_text("\n".join(draw(st.lists(query_texts, max_size=4))), encoding="utf-8", errors="surrogatepass")
            one = st.one_of(st.just(lay.rel(qf)), one)
    elif dest in _OUTPUT_DESTS + _CACHE_DESTS:
        one = st.one_of(outputs, _hostile(lay, written=True)) if cli in _NEW else outputs
    elif dest == "expr":
        one = query_texts
    elif cli == "experiments.synthetic_kg" and dest in ("entities", "relations", "edges", "types"):
        # Absurd sizes must be refused up front (checks, memory and disk estimates), never generated;
        # a mid-size valid one (300 entities, 900 edges) appears only with the others valid.
        one = st.sampled_from(["0", "1", "-1", "x", "1.5", "", "-99999999999", "1000000000", "100000000", str(2**63),
                               "99999999999999999999999", "300", "900"])
    elif dest in ("anchors", "topics", "relations", "query", "structures", "plan"):
        one = st.one_of(_JUNK, st.text(max_size=6), st.sampled_from(["4p", "1P", "2u-DNF", "up-DM", "#99", "#-1"]))
    elif dest in ("encoder", "embedding"):
        one = st.sampled_from(["nope", "", "HASHING"])  # never the model encoders (they download models)
    elif dest == "encoder_kwargs":
        one = st.one_of(st.sampled_from(['{"dim": 0}', '{"dim": -3}', '{"dim": "x"}', '{"seed": 1.5}', '{"bogus": 1}',
                                         '[1]', '3', 'null', '{', '{"dim": 1e999}', '{"dim": 100000000}']),
                        st.dictionaries(st.sampled_from(["dim", "seed", "x"]), st.integers(-5, 64)).map(json.dumps))
    elif dest == "device":
        one = st.sampled_from(["cuda", "cuda:7", "meta", "mps", "bogus", "", "cpu:0", "auto"])
    elif dest == "loss":
        one = st.sampled_from(["bogus", "", "BCE", "nssa"])
    # kge.build trains for real: junk epochs/rank never parse as large numbers.
    elif cli == "kge.build" and dest in ("epochs", "rank", "batch_size", "num_negatives"):
        one = st.sampled_from(["0", "-1", "x", "1.5", "", "-99999999999"])
    elif cli == "engine.sample" and dest == "per_structure":
        # 100000 on a tiny KG: the sampler must notice exhaustion (issue 9 item 4) instead of hanging;
        # that takes up to a minute per structure, so only the slow run asks for it.
        one = st.sampled_from(["0", "-1", "x"] + (["100000"] if _SLOW_RUN else []))
    elif cli == "engine.paths" and dest in ("max_sequences", "k", "beam_width", "max_hops", "max_entity_paths"):
        one = st.sampled_from(["0", "-1", "x", "", "100", "-99999999999"])
    elif cli == "experiments.lgot_eval" and dest in ("per_structure", "batch_size", "max_answers"):
        one = st.sampled_from(["0", "-1", "x", "", "1", "2", "-99999999999"])
    elif cli == "experiments.metaqa_lgot" and dest in ("per_hop", "samples", "batch_size"):
        one = st.sampled_from(["0", "-1", "x", "", "1", "2", "-99999999999", "99999999999", "9" * 40])
    elif cli == "experiments.metaqa_ask" and dest in ("per_hop", "first", "ks"):  # never a valid huge sample
        one = st.sampled_from(["-1", "x", "", "1.5", "-99999999999", "99999999999", "9" * 40])
    elif dest == "name" and cli in _NEW:  # issue 32: a name with a folder part wrote outside --out
        one = st.one_of(_JUNK, _HOSTILE_TEXT, st.sampled_from(["../inputs/user/notes", "../user/notes",
                                                               str(lay.user / "notes"), "sub/x", "..", ".x", "a b"]))
    elif action.type is int:
        one = st.one_of(_INTS, _HOSTILE_TEXT) if cli in _NEW else _INTS
    elif action.type is float:
        one = st.one_of(_FLOATS, _HOSTILE_TEXT) if cli in _NEW else _FLOATS
    elif action.choices:
        one = st.one_of(_JUNK, st.sampled_from([str(c).upper() for c in action.choices]))
    else:
        one = st.one_of(_JUNK, st.text(max_size=8), paths, *([_HOSTILE_TEXT, _hostile(lay, written=True)]
                                                             if cli in _NEW else []))
    count = draw(st.sampled_from([_count(draw, action)] * 4 + [0, 2]))
    return [draw(one) for _ in range(count)]


def _fuzzable(action: argparse.Action) -> bool:
    if not action.option_strings or isinstance(action, argparse._HelpAction):
        return False
    return not action.dest.startswith("llm") and not any("llm" in o for o in action.option_strings)


# Options of which a valid command line gives exactly one group.
_EXCLUSIVE = {"engine.answer": [("query", "anchors", "relations"), ("expr",), ("queries",)],
              "engine.evaluate": [("queries",), ("betae_queries", "betae_folder")],
              # experiments.metaqa_ask's actions (argparse refuses two); () = the method rows
              "experiments.metaqa_ask": [("build_kg_only",), ("export",), ("make_exemplars",), ("tune_exemplars",), ("report",),
                             ()]}
#: Issue 32's CLIs (engine.ask and linkeval were here before): their junk values include the hostile ones.
_NEW = ("engine.ask", "experiments.linkeval", "experiments.simulate_ask", "experiments.simulate", "experiments.metaqa_lgot", "experiments.metaqa_ask",
        "betae_1p_queries", "executor_memory", "ops_cuda_bench", "executor_identity")


@st.composite
def argvs(draw, cli: str, parser: argparse.ArgumentParser, lay: Layout) -> list[str]:
    """A random argument vector: a valid one, a valid one with one thing wrong, or chaos."""
    mode = draw(st.sampled_from(["valid", "valid", "one-wrong", "one-wrong", "chaos"]))
    head: list[str] = []
    subs = _subcommands(parser)
    if subs:  # a subcommand first (executor_identity sample/run/report/memory), then its options
        name = draw(st.sampled_from(list(subs) + (["bogus", "--help"] if mode == "chaos" else [])))
        head = [name]
        parser = subs.get(name, parser)
    actions = [a for a in parser._actions if _fuzzable(a)]
    skip: set[str] = set()
    must: set[str] = set()  # the chosen exclusive group (engine.answer's --anchors/--relations stay optional)
    if cli in _EXCLUSIVE and mode != "chaos":
        groups = _EXCLUSIVE[cli]
        keep = draw(st.sampled_from(groups))
        skip = {d for g in groups if g is not keep for d in g}
        must = set(keep) - {"anchors", "relations"}
    wrong = draw(st.sampled_from([a.dest for a in actions])) if mode == "one-wrong" else None
    argv: list[str] = []
    for a in draw(st.permutations(actions)):
        if a.dest in skip:
            continue
        if mode == "chaos":
            present = draw(st.integers(0, 9)) < (9 if a.required else 4)
        elif a.dest == wrong:
            present = not (a.required or a.dest in must) or draw(st.integers(0, 3)) > 0  # or goes missing
        else:
            present = a.required or a.dest in must or draw(st.integers(0, 2)) == 0
        if not present:
            continue
        flag = draw(st.sampled_from(a.option_strings))
        argv.append(flag)
        if a.nargs == 0:  # store_true / BooleanOptionalAction: the flag alone
            continue
        bad = mode == "chaos" and draw(st.booleans()) or a.dest == wrong
        argv.extend(draw((junk_value if bad else valid_value)(cli, a, lay)))
    strays = draw(st.sampled_from([0, 0, 0, 1, 2])) if mode == "chaos" else int(mode == "one-wrong" and wrong is None)
    for _ in range(strays):
        k = draw(st.integers(0, len(argv)))
        argv.insert(k, draw(st.sampled_from(["--bogus", "stray", "-x", "--artifact", "--", "-", "--help",
                                             "--top-k=3", "--json=", "=x"])))
    argv = head + argv
    if cli == "executor_identity" and head == ["sample"] and "--per-structure" not in argv:
        argv += ["--per-structure", "1"]  # the default samples 72 per structure
    if cli == "engine.sample" and "--per-structure" not in argv:
        # The default (1000 per structure) exhausts all 14 structures of the tiny KG: ~35 s a run.
        argv += ["--per-structure", "2"]
    if cli == "experiments.lgot_eval":
        # One simulator configuration on at most 3 queries per structure: a few seconds a run.
        for flag, value in (("--per-structure", "2"), ("--recall", "0.5"), ("--hallucination", "0.2"),
                            ("--structures", "1p"), ("--theta", "0.3"), ("--alpha", "0.1")):
            if flag not in argv:
                argv += [flag, value]
        argv += ["--no-replay"] if "--sim-latency-ms" not in argv else []
    if cli == "engine.ask":
        # The default encoder is MiniLM (a model load per run): the hashing one unless the vector names one.
        argv += ["--encoder", "hashing"] if "--encoder" not in argv else []
        if mode != "chaos" and "--questions" not in argv:
            argv.append(draw(st.sampled_from(["what does [e0] r0", "who likes e1", "[nope] r1", "what is part of [a b]"])))
    if cli == "experiments.metaqa_ask":
        # Never the defaults that read the real MetaQA release, load MiniLM, run three simulated LLMs, or
        # write the committed tables in the repository (--md/--png default there).
        for flag, value in (("--data", lay.rel(lay.metaqa)), ("--encoder", "hashing"), ("--per-hop", "2"), ("--hops", "1"),
                            ("--errors", "0.2"), ("--labels", lay.rel(lay.mqa_exemplars)), ("--md", "t.md"),
                            ("--png", "t.png"), ("--quiet", None)):
            if flag not in argv:
                argv += [flag] if value is None else [flag, value]
        if mode != "chaos" and "--artifact" not in argv:  # optional to argparse, needed by three of its actions
            argv += ["--artifact", lay.rel(lay.mqa_art)]
    if cli == "experiments.metaqa_lgot":
        # One simulated quality on a few questions, a cache in the example's folder: a few seconds a run.
        for flag, value in (("--per-hop", "2"), ("--quality", "1/0"), ("--cache", "c.sqlite"), ("--samples", "2"),
                            ("--quiet", None)):
            if flag not in argv:
                argv += [flag] if value is None else [flag, value]
    if cli in _SERVERS and "--port" not in argv:
        argv += ["--port", "0"]  # the default 8099 may be taken by a neighbour's simulator
    if cli == "ops_cuda_bench" and "--quick" not in argv:
        argv.append("--quick")  # the full grid takes minutes
    if cli == "kge.build":
        # Every vector that reaches training trains a tiny model: never a size preset.
        if "--epochs" not in argv:
            argv += ["--epochs", "1"]
        if "--rank" not in argv:
            argv += ["--rank", "2"]
        argv += ["--eval-max-triples", "0"] if "--eval-max-triples" not in argv else []
    return argv


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """name -> parser of each subcommand (empty for a CLI without subcommands)."""
    for a in parser._actions:
        if isinstance(a, argparse._SubParsersAction):
            return dict(a.choices)
    return {}


# ------------------------------------------------------------------------ the property
_OUTPUT_DESTS = ("out", "json", "stats_json", "export", "make_exemplars", "md", "png", "trace_out", "build_kg_only",
                 "cache", "save_results")
# Options naming files or folders a run reads (never changed).
_INPUT_DESTS = ("artifact", "kg", "queries", "betae_queries", "betae_folder", "folder", "embeddings", "questions",
                "exemplars", "kb", "data", "metaqa", "labels", "tune_exemplars", "report", "root", "tree", "before",
                "after", "determinism", "determinism_with", "compare", "notes", "memory", "baseline")
# Folders a run may add files to (a cache the user names), unless it lies inside one of the run's inputs.
_CACHE_DESTS = ("questions_dir",)


def _named_paths(parser: argparse.ArgumentParser, argv: list[str], lay: Layout, cli: str) -> tuple[list[Path], list[Path]]:
    """(outputs the command line names, inputs it reads) as absolute paths (argv read leniently);
    cache folders (:data:`_CACHE_DESTS`) count as outputs whatever they hold, and an experiment's
    ``--out`` folder as an output folder."""
    outs, ins = [], []
    subs = _subcommands(parser)
    if subs and argv and argv[0] in subs:
        parser = subs[argv[0]]
    by_flag = {s: a for a in parser._actions for s in a.option_strings}
    for k, tok in enumerate(argv):
        a = by_flag.get(tok)
        if a is None or a.nargs == 0 or k + 1 >= len(argv) or not argv[k + 1]:
            continue
        p = Path(os.path.abspath(lay.root / argv[k + 1]))
        if a.dest == "out" and cli == "experiments.metaqa_lgot":  # --out DIR: DIR/NAME.{md,json,png}
            name = argv[argv.index("--name") + 1] if "--name" in argv[:-1] else "metaqa"
            outs += [p / f"{name}.{ext}" for ext in ("md", "json", "png")]
        elif a.dest == "save":  # executor_identity: the record and its scores file beside it
            outs += [p, p.with_name(p.name + ".scores.npz")]
        elif a.dest in _OUTPUT_DESTS:
            outs.append(p)
            plot = p.with_suffix(".png")
            if cli == "experiments.linkeval" and a.dest == "out" and plot != p and not plot.exists():
                outs.append(plot)  # its documented plot next to --out, when new (replacing a file is not allowed)
        elif a.dest in _CACHE_DESTS:
            outs.append(_Cache(p))
        elif a.dest in _INPUT_DESTS:
            ins.append(p)
    return outs, ins


class _Cache(type(Path())):
    """A cache folder named on the command line (:data:`_CACHE_DESTS`)."""


def _may_change(outs: list[Path], ins: list[Path], overwrite: bool) -> list[Path]:
    """Paths whose content may change: a named output that is new, an existing regular file or an empty
    folder (never one of the run's inputs, nor inside one), or an artifact ``kge.build --overwrite`` replaces."""
    allowed = []
    for o in outs:
        if isinstance(o, _Cache) and not any(o == i or i in o.parents for i in ins):
            allowed.append(Path(o))
        elif overwrite and o.is_dir() and (o / "meta.json").is_file():
            allowed.append(o)  # asked for, even when it is also the --embeddings source
        elif any(o == i or i in o.parents for i in ins):
            continue
        elif not o.exists() or o.is_file() or (o.is_dir() and not any(o.iterdir())):
            allowed.append(o)
    return allowed


def _time_limit(cli: str, argv: list[str]) -> int:
    """Seconds a run may take.  F9: ``engine.sample --per-structure 100000`` samples every distinct query
    of the tiny KG (~28,000 over the 14 structures, each structure stopping once exhausted, see
    engine.eval.sampling): ~70 s on 2 idle cores, ~140 s on busy ones; that is work, not a hang."""
    if cli == "engine.sample" and "100000" in argv:
        return 600
    return 120


def _tree(lay: Layout) -> dict[str, bytes]:
    """:func:`snapshot` of the example's whole folder but ``home/`` (the per-user caches and TMPDIR of the run)."""
    return {k: v for k, v in snapshot(lay.root).items() if not (k == "home/" or k.startswith("home/"))}


@contextlib.contextmanager
def _no_serving():
    """The simulators' ``serve_forever`` returns at once (see :data:`_SERVERS`)."""
    from experiments.simulate import SimulatorServer

    saved = SimulatorServer.serve_forever
    SimulatorServer.serve_forever = lambda self, *a, **k: None  # type: ignore[method-assign]
    try:
        yield
    finally:
        SimulatorServer.serve_forever = saved  # type: ignore[method-assign]


def check_cli(cli: str, parser: argparse.ArgumentParser, argv: list[str], lay: Layout, hits: set[str]) -> None:
    before = _tree(lay)
    outs, ins = _named_paths(parser, argv, lay, cli)
    may_change = _may_change(outs, ins, cli in ("kge.build", "experiments.metaqa_ask") and "--overwrite" in argv)
    t0 = time.perf_counter()
    import torch

    threads = torch.get_num_threads()  # executor_identity run/memory set torch's threads for their process
    try:
        with _no_serving() if cli in _SERVERS else contextlib.nullcontext():
            res = run_cli(_cli(CLIS[cli]), argv, lay.root, time_limit=_time_limit(cli, argv))
    finally:
        torch.set_num_threads(threads)
    elapsed = time.perf_counter() - t0
    if currently_in_test_context():  # hypothesis statistics (not in the fixed examples)
        event(f"rc={res.rc}" if res.exception is None else f"exception {type(res.exception).__name__}")
        if res.rc == 2 and res.exception is None:
            event("error: " + res.stderr.partition("error: ")[2][:30].split("\n")[0])
    if os.environ.get("FUZZ_CLI_LOG"):  # outcome log for looking at what the fuzzer reaches
        with open(os.environ["FUZZ_CLI_LOG"], "a", encoding="utf-8") as log:
            log.write(json.dumps({"cli": cli, "argv": argv, "rc": res.rc, "s": round(elapsed, 2), "exception": repr(res.exception),
                                  "error": res.stderr.partition("error: ")[2].split("\n")[0][:120]}) + "\n")
    known = _known_finding(cli, argv, res)
    if known is not None:
        hits.add(known)
        return
    if res.exception is not None:
        raise AssertionError(f"{cli} {argv!r} raised {type(res.exception).__name__}: {res.exception}\n"
                             f"stderr:\n{res.stderr[-3000:]}") from res.exception
    assert res.rc in ((0, 1, 2) if cli in _RC1 else (0, 2)), \
        f"{cli} {argv!r}: return code {res.rc}\nstderr:\n{res.stderr[-3000:]}"
    quiet = cli == "kge.build" and "--quiet" in argv
    if res.rc == 2:
        check_cli_stderr(res.stderr, only_error=quiet)
    else:
        assert "Traceback" not in res.stderr, res.stderr
        if quiet:
            assert res.stderr == "", f"kge.build --quiet printed:\n{res.stderr}"
    after = _tree(lay)

    def allowed(key: str) -> bool:
        """Under a named output, or a new folder made to hold one (``--out missing/deeper/x``)."""
        p = Path(os.path.abspath(lay.root / key))
        if any(p == o or o in p.parents for o in may_change):
            return True
        return key.endswith("/") and key not in before and any(p in o.parents for o in may_change)

    # The whole example folder (issue 32): nothing but the named outputs may appear or change, in the inputs
    # or beside them (a --name with a folder part, a default output in the current folder, a stray temporary).
    changed = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k) and not allowed(k))
    assert not changed, f"{cli} {argv!r} (rc {res.rc}) changed files it does not name as outputs: {changed[:8]}"
    leftovers = [str(Path(d) / n) for d, dirs, files in os.walk(lay.root) for n in dirs + files
                 if ".building-" in n or ".part-" in n or ".old-" in n]
    assert not leftovers, f"{cli} {argv!r} left temporaries: {leftovers}"


def _run_example(cli: str, parsers, world, scratch, data, hits: set[str]) -> None:
    root = fresh_dir(scratch, cli.replace(".", "-") + "-")
    try:
        lay = Layout(root, world)
        argv = data.draw(argvs(cli, parsers[cli], lay), label="argv")
        check_cli(cli, parsers[cli], argv, lay, hits)
    finally:
        shutil.rmtree(root, ignore_errors=True)


# ------------------------------------------------------------------------ known findings
# Bugs the fuzzer found and that are not fixed yet (none at present: F1-F12 are fixed).  An example
# that fails in exactly that way is recorded instead of failing, and the test is then reported as xfail (strict=False)
# naming the finding; any other failure still fails.  Drop an entry once it is fixed.
KNOWN: dict[str, Callable[[str, list[str], Any], bool]] = {
    # F1-F10 are fixed (regression examples below and in tests/test_bad_input.py).
    # F12 is fixed: kgreason.files refuses an output path through a missing folder and back out with '..'
    # before any work (test_bad_input.py::test_output_path_through_a_missing_folder_is_one_error).
}


def _known_finding(cli: str, argv: list[str], res) -> str | None:
    for name, matches in KNOWN.items():
        if matches(cli, argv, res):
            return name
    return None


# ------------------------------------------------------------------------ the tests
# Each CLI gets a share of the profile's budget by its cost per example.
_SHARE = {"engine.answer": 1.0, "engine.evaluate": 0.5, "engine.sample": 0.5, "engine.betae": 0.5,
          "engine.paths": 0.75, "kge.build": 0.4, "experiments.synthetic_kg": 0.4, "experiments.train_curve": 0.3, "kge.linkpred": 0.3, "kge.materialize": 0.2,
          "experiments.lgot_eval": 0.25, "engine.ask": 0.5, "experiments.linkeval": 0.3,
          "experiments.simulate_ask": 0.3, "experiments.simulate": 0.2, "experiments.metaqa_lgot": 0.125,
          "experiments.metaqa_ask": 0.3, "executor_identity": 0.25, "betae_1p_queries": 0.2, "executor_memory": 0.2, "ops_cuda_bench": 0.15}


FAST_LANE_SCALE = 0.25  # the share of the ci profile's budget a CLI gets outside the slow run

_SLOW_RUN = False  # set while a slow-profile CLI test runs (enables the expensive values)


def _fuzz(cli: str, parsers, world, scratch, profile: settings) -> None:
    global _SLOW_RUN
    hits: set[str] = set()
    _SLOW_RUN = profile is not settings.default or os.environ.get("HYPOTHESIS_PROFILE") == "slow"

    # The normal run does not shrink a failing vector (shrinking CLI runs can take minutes; the
    # failure message holds the whole argv); the slow run does.
    phases = profile.phases if _SLOW_RUN else tuple(p for p in profile.phases if p != Phase.shrink)

    # The fast lane's run gets a quarter of the ci profile's share (FAST_LANE_SCALE; at least 5 examples per CLI,
    # the same derandomized ones every run): the file was the lane's largest (~36 s of CPU at 1.0; 45.9 -> 33.5 s
    # user + sys for the file alone from 0.5 to 0.25, stop 41); the full run's *_slow twin keeps 500 x share
    # examples and shrinking.
    scale = 1.0 if _SLOW_RUN else FAST_LANE_SCALE
    @settings(profile, max_examples=max(5, int(profile.max_examples * _SHARE[cli] * scale)), phases=phases)
    @given(data=st.data())
    def run(data):
        _run_example(cli, parsers, world, scratch, data, hits)

    try:
        run()
    finally:
        _SLOW_RUN = False
    if hits:
        pytest.xfail("known finding(s): " + "; ".join(sorted(hits)))


def _make(cli: str):
    def test(parsers, world, scratch):
        _fuzz(cli, parsers, world, scratch, settings.default)

    @pytest.mark.slow
    def test_slow(parsers, world, scratch):
        _fuzz(cli, parsers, world, scratch, settings(SLOW, max_examples=SLOW.max_examples // 4))

    return test, test_slow


test_fuzz_cli_answer, test_fuzz_cli_answer_slow = _make("engine.answer")
test_fuzz_cli_evaluate, test_fuzz_cli_evaluate_slow = _make("engine.evaluate")
test_fuzz_cli_sample, test_fuzz_cli_sample_slow = _make("engine.sample")
test_fuzz_cli_betae, test_fuzz_cli_betae_slow = _make("engine.betae")
test_fuzz_cli_paths, test_fuzz_cli_paths_slow = _make("engine.paths")
test_fuzz_cli_build, test_fuzz_cli_build_slow = _make("kge.build")
test_fuzz_cli_synthetic, test_fuzz_cli_synthetic_slow = _make("experiments.synthetic_kg")
test_fuzz_cli_plots, test_fuzz_cli_plots_slow = _make("experiments.train_curve")
test_fuzz_cli_linkpred, test_fuzz_cli_linkpred_slow = _make("kge.linkpred")
test_fuzz_cli_materialize, test_fuzz_cli_materialize_slow = _make("kge.materialize")
test_fuzz_cli_experiment, test_fuzz_cli_experiment_slow = _make("experiments.lgot_eval")
test_fuzz_cli_ask, test_fuzz_cli_ask_slow = _make("engine.ask")
test_fuzz_cli_linkeval, test_fuzz_cli_linkeval_slow = _make("experiments.linkeval")
test_fuzz_cli_simulate_ask, test_fuzz_cli_simulate_ask_slow = _make("experiments.simulate_ask")
test_fuzz_cli_simulate, test_fuzz_cli_simulate_slow = _make("experiments.simulate")
test_fuzz_cli_metaqa_experiment, test_fuzz_cli_metaqa_experiment_slow = _make("experiments.metaqa_lgot")
test_fuzz_cli_metaqa_ask, test_fuzz_cli_metaqa_ask_slow = _make("experiments.metaqa_ask")
test_fuzz_cli_betae_1p_queries, test_fuzz_cli_betae_1p_queries_slow = _make("betae_1p_queries")
test_fuzz_cli_executor_memory, test_fuzz_cli_executor_memory_slow = _make("executor_memory")
test_fuzz_cli_ops_cuda_bench, test_fuzz_cli_ops_cuda_bench_slow = _make("ops_cuda_bench")
test_fuzz_cli_executor_identity, test_fuzz_cli_executor_identity_slow = _make("executor_identity")


# ------------------------------------------------------------------------ fixed examples
# The same property on chosen vectors: issue 9's reproductions, and every finding of this
# fuzzer (open ones xfail(strict=False) with their id in KNOWN: an XPASS means it was fixed and the
# mark can go).
def _open(finding: str):
    return pytest.mark.xfail(reason=f"{finding} (open)", strict=False)


_EXAMPLES = [
    # issue 9 item 1: --out a user's folder (must be refused, nothing deleted)
    ("kge.build", "--kg {kg} --out {user} --rank 2 --epochs 1 --quiet", None),
    ("kge.build", "--kg {kg} --out . --rank 2 --epochs 1 --quiet", None),
    ("kge.build", "--kg {kg} --out {art} --embeddings {art} --quiet", None),  # existing artifact, no --overwrite
    ("kge.build", "--kg {kg} --out {art} --embeddings {art} --overwrite --quiet", None),
    ("kge.build", "--kg {latin1} --out new_art --rank 2 --epochs 1 --quiet", None),  # item 3: non-UTF-8 TSV
    ("kge.build", "--kg {kg} --out new_art --rank 2 --epochs 1 --loss bogus --quiet", None),
    ("kge.build", "--kg {kg} --out new_art --rank 2 --epochs 1 --drop-edges 0.99 --quiet", None),
    ("kge.build", "--kg {kg} --out new_art --embeddings {empty_tsv} --quiet", None),  # F2 (fixed)
    ("engine.answer", "--artifact {list_meta} --expr e0", None),  # meta.json holding a list
    ("engine.answer", "--artifact {art} --queries {empty}", None),  # --queries DIR
    ("engine.sample", "--artifact {art} --out {empty} --per-structure 1 --no-progress", None),  # --out DIR
    ("engine.evaluate", "--no-progress", None),  # F1 (fixed): usage error
    ("engine.answer", "--artifact {art} --expr " + "(n " * 989 + "e0" + ")" * 989, None),  # item 3: deep query
    ("engine.answer", "--artifact {art} --expr " + "(p r0 " * 500 + "e0" + ")" * 500, None),
    ("engine.paths", "--artifact {art} --from e0 --plan r0 --encoder hashing --encoder-kwargs [1]", None),
    ("kge.build", "--kg {kg} --out new_art --rank 2 --epochs 2 --loss marginranking --lr 7e16 --quiet", None),  # F3 (fixed)
    ("engine.betae", "--queries {deep_pkl} --folder {betae} --no-progress", None),  # F6 (fixed)
    ("engine.evaluate", "--artifact {art} --betae-queries {deep_pkl} --betae-folder {betae} --no-progress", None),  # F6 (fixed)
    ("engine.answer", "--artifact {art} --expr e0 a\rb\u2028c", None),  # F4 (fixed)
    ("engine.evaluate", "--artifact {art} --queries {jsonl} --no-progress --device meta", None),  # F7 (fixed)
    ("engine.answer", "--artifact {art} --query 1p --device mps", None),  # F7 (fixed)
    ("engine.sample", "--artifact {art} --out o.jsonl --per-structure 1 --no-progress --seed -1", None),  # F8 (fixed)
    ("kge.build", "--kg {kg} --out new_art --rank 2 --epochs 1 --quiet --seed -1", None),  # F8 (fixed)
    ("kge.build", "--kg {kg} --out new_art --rank 2 --epochs 1 --training-loop lcwa --optimizer 0 --quiet", None),  # F11 (fixed)
    ("kge.build", "--kg {kg} --out new_art --rank 2 --epochs 1 --optimizer sgd --quiet", None),  # F11: 1n takes adagrad/adam
    ("kge.build", "--kg {kg} --out new_art --embeddings {art} --quiet --max-matrix-gb inf", None),  # F10 (fixed)
    ("kge.build", "--kg {kg} --out new_art --embeddings {art} --quiet --max-matrix-gb nan", None),  # F10 (fixed)
    ("kge.build", "--kg {kg} --out new_art --embeddings {art} --quiet --max-matrix-gb 1e-163", None),  # F10 (fixed)
    ("kge.build", "--kg {kg} --out new_art --embeddings {art} --quiet --max-matrix-gb 1e300", None),
    ("kge.build", "--kg {kg} --out new_art --rank 2 --epochs 1 --quiet --lr inf", None),
    ("kge.build", "--kg {kg} --out new_art --rank 2 --epochs 1 --quiet --seed 99999999999999999999999", None),
    ("kge.build", "--kg {kg} --out new_art --embeddings {art} --quiet --device meta", None),
    ("kge.build", "--kg {kg} --out missing/deeper/new_art --embeddings {art} --quiet", None),  # parents created
    ("engine.answer", "--artifact {art} --expr e0 --device cuda:7", None),
    ("engine.answer", "--artifact {art} --query 1p --seed -5", None),
    ("engine.evaluate", "--artifact {art} --queries {jsonl} --no-progress --device cpu:0", None),
    ("engine.sample", "--artifact {art} --out o.jsonl --per-structure 1 --no-progress --bogus \x1b[2J", None),
    # slow-profile finding: an output file inside an input (the artifact's own meta.json was overwritten)
    ("engine.sample", "--out {art}/meta.json --artifact {art} --no-progress --per-structure 2", None),
    ("engine.evaluate", "--artifact {art} --queries {jsonl} --no-progress --json {jsonl}", None),
    ("engine.betae", "--queries {pkl} --folder {betae} --no-progress --json {betae}/train.txt", None),
    # issue 22: outputs inside the artifact, sizes that cannot fit, damaged artifacts
    ("experiments.train_curve", "--artifact {art} --out {art}/entities.tsv", None),
    ("experiments.lgot_eval", "--artifact {art} --out {art} --per-structure 1 --structures 1p --quiet", None),
    ("experiments.lgot_eval", "--artifact {art} --out {art}/results --per-structure 1 --structures 1p --quiet", None),
    ("kge.linkpred", "--artifact {art} --kg {betae} --json {art}/metrics.json --quiet", None),
    ("kge.linkpred", "--artifact {art} --kg {kg} --split missing --quiet", None),
    ("experiments.synthetic_kg", "--entities 1000000000 --relations 4 --edges 2000000000 --out big.tsv --quiet", None),
    ("experiments.synthetic_kg", "--entities 40 --relations 3 --edges 120 --out s.tsv --stats-json s.tsv --quiet", None),
    ("engine.evaluate", "--artifact {list_meta} --queries {jsonl} --no-progress --skip-artifact-checksums", None),
    # engine.ask and experiments.linkeval: wrong kinds of files, unknown topics, bad numbers
    ("engine.ask", "--artifact {art} --encoder hashing --questions {empty}", None),
    ("engine.ask", "--artifact {art} --encoder hashing --questions {empty_tsv}", None),
    ("engine.ask", "--artifact {art} --encoder hashing --questions {bad_jsonl}", None),
    ("engine.ask", "--artifact {art} --encoder hashing [nope]", None),
    ("engine.ask", "--artifact {art} --encoder hashing --exemplars {jsonl} [e0]", None),
    ("engine.ask", "--artifact {art} --encoder hashing --exemplars {bad_jsonl} [e0]", None),
    ("engine.ask", "--artifact {art} --encoder hashing --exemplar-weight nan [e0]", None),
    ("engine.ask", "--artifact {art} --encoder hashing --max-hops 99 [e0]", None),
    ("engine.ask", "--artifact {art} --encoder hashing --encoder-kwargs {{ [e0]", None),
    ("engine.ask", "--artifact {list_meta} --encoder hashing [e0]", None),
    ("engine.ask", "--artifact {art} --encoder hashing --questions {questions} --exemplars {exemplars} --json", None),
    ("experiments.linkeval", "--kb {metaqa_kb} --out {metaqa_kb}", None),
    ("experiments.linkeval", "--kb {empty_tsv} --out r.md --per-kind 2", None),
    ("experiments.linkeval", "--kb {kg} --out r.md --per-kind 2", None),
    ("experiments.linkeval", "--kb {metaqa_kb} --out r.md --per-kind 2 --baseline nope", None),
    ("experiments.linkeval", "--kb {metaqa_kb} --out r.md --per-kind 2 --baseline {metaqa_kb}", None),  # not JSON
    ("experiments.linkeval", "--kb {metaqa_kb} --out r.md --per-kind 2 --embedding nope", None),
    ("experiments.linkeval", "--kb {metaqa_kb} --out r.md --per-kind 2 --held-out nan", None),
    ("experiments.linkeval", "--kb {metaqa_kb} --out r.md --per-kind 2 --max-names 12", None),
    # The slow fuzz run's find (CI rehearsal, stop 26): --out inputs/tiny.tsv writes its documented plot
    # inputs/tiny.png, a new file; replacing an existing one is refused (tests/test_llm_linking.py).
    ("experiments.linkeval", "--kb {metaqa_kb} --seed 0 --per-kind 2 --embedding hashing --out {kg}", None),
    # issue 32: data loss, writes outside the output, argument injection, tracebacks of the research scripts
    ("experiments.metaqa_ask", "--data {metaqa} --export {metaqa}/1-hop/test.txt --hops 1 --overwrite", None),
    ("experiments.metaqa_ask", "--data {metaqa} --export {empty} --hops 1", None),
    ("experiments.metaqa_ask", "--data {metaqa} --export q.jsonl --hops 7", None),
    ("experiments.metaqa_ask", "--data {metaqa} --build-kg-only {user} --overwrite", None),
    ("experiments.metaqa_ask", "--data {metaqa} --build-kg-only {metaqa}/art", None),
    ("experiments.metaqa_ask", "--data {metaqa} --build-kg-only {mqa_art}", None),
    ("experiments.metaqa_ask", "--data {metaqa} --build-kg-only {mqa_art} --overwrite", None),
    ("experiments.metaqa_ask", "--data {metaqa} --artifact {mqa_art} --encoder hashing --per-hop 2 --errors 0.2 --out {mqa_art}/r.json", None),
    ("experiments.metaqa_ask", "--data {metaqa} --artifact {mqa_art} --encoder hashing --per-hop 2 --errors --out r.json --quiet", None),
    ("experiments.metaqa_lgot", "--artifact {mqa_art} --metaqa {metaqa} --out {empty} --per-hop 2 --quality 1/0 "
                                     "--cache c.sqlite --quiet --overwrite --name ../user/notes", None),
    ("experiments.metaqa_lgot", "--artifact {mqa_art} --metaqa {metaqa} --out {empty} --per-hop 2 --quality 1/0 "
                                     "--cache c.sqlite --quiet --overwrite --name {user}/notes", None),
    ("experiments.linkeval", "--kb {metaqa_kb} --out r.md --per-kind 2 --save-results {metaqa_kb}", None),
    ("experiments.simulate", "--artifact {mqa_art} --port 0 --host a\\x00b", None),  # a NUL: TypeError in bind
    ("experiments.simulate_ask", "--artifact {mqa_art} --questions {mqa_questions} --port 0 --skip-artifact-checksums", None),
    ("experiments.simulate_ask", "--artifact {mqa_art} --questions {mqa_questions} --port 99999999999", None),
    ("executor_memory", "--artifact {art} --json x/../o.json", None),  # F12 (fixed)
    ("engine.sample", "--artifact {art} --per-structure 1 --structures 1p --no-progress --out x/../o.jsonl", None),  # F12 (fixed)
]


@pytest.mark.parametrize("cli, line, finding", [
    pytest.param(c, line, f, marks=[_open(f)] if f else [], id=f"{c}:{(f or '') + ':' if f else ''}{line[:60]}")
    for c, line, f in _EXAMPLES])
def test_cli_examples(parsers, world, scratch, cli, line, finding):
    root = fresh_dir(scratch, "example-")
    try:
        lay = Layout(root, world)
        names = {"kg": lay.kg, "art": lay.art, "jsonl": lay.jsonl, "pkl": lay.pkl, "betae": lay.betae,
                 "user": lay.user, "empty": lay.inputs / "empty", "list_meta": lay.inputs / "list_meta",
                 "latin1": lay.inputs / "latin1.tsv", "empty_tsv": lay.inputs / "empty.tsv",
                 "deep_pkl": lay.inputs / "deep.pkl", "bad_jsonl": lay.inputs / "bad.jsonl",
                 "questions": lay.ask_questions, "exemplars": lay.exemplars, "metaqa_kb": lay.metaqa_kb,
                 "metaqa": lay.metaqa, "mqa_art": lay.mqa_art, "mqa_questions": lay.mqa_questions}
        argv = [tok.format(**{k: lay.rel(v) for k, v in names.items()}).encode().decode("unicode_escape")
                if "{" in tok or "\\" in tok else tok for tok in line.split(" ")]
        hits: set[str] = set()
        check_cli(cli, parsers[cli], argv, lay, hits)
        assert not hits, f"hits known finding(s): {hits}"
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_parsers_are_captured(parsers):
    """Every CLI parses with argparse and has options to fuzz, or subcommands that have (guards the capture trick)."""
    for name, p in parsers.items():
        for q in list(_subcommands(p).values()) or [p]:
            assert [a for a in q._actions if _fuzzable(a)], name
