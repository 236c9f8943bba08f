"""Answer logical queries from the command line, with explanations.

Examples::

    python -m engine.answer --query pin                     # default KG (UMLS), a seeded pin query with answers
    python -m engine.answer --artifact artifacts/FB15k-237 --query 2p \\
        --anchors "Tom Hanks" --relations "/film/actor/film./film/performance/film" "/film/film/directed_by"
    python -m engine.answer --expr '(i (p r1 A) (np r2 B))' --json
    python -m engine.answer --queries queries.txt --top-k 5 --no-explain

One query per line in ``--queries`` files (blank lines are skipped); errors
name ``file:line:column``.  ``--json`` prints one JSON object per query, in
order: ``{"query": expr, "answers": [{"entity", "id", "score", "provenance",
"explanation"}], "trace": {"query", "nodes": [...]}}`` (see
:mod:`engine.exec.trace`; ``--trace-values`` adds each node's top entities).
``provenance`` is ``"kg"`` unless executor hooks merged evidence in
(``"llm"``, ``"both"``, ...); the text output then tags each answer with
it and lists the nodes hooks touched.
"""
from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass
from typing import Sequence

from kgreason.cli import ArgumentParser as _Parser, check_device, check_seed  # _Parser: one-line UserError, user text escaped
from kgreason.constants import QTO_NEG_SCALE
from kgreason.errors import UserError, cli_main
from kgreason.text import json_line, printable  # KG names and LLM text: escaped where printed

__all__ = ["AnswerConfig", "main", "run"]

_ID = re.compile(r"#(\d+)")


@dataclass(frozen=True)
class AnswerConfig:
    """Everything ``engine.answer`` was asked to do (see ``--help``)."""

    artifact: str | None = None
    query: str | None = None
    anchors: tuple[str, ...] | None = None
    relations: tuple[str, ...] | None = None
    expr: str | None = None
    queries: str | None = None
    top_k: int = 10
    explain: bool = True
    tnorm: str = "product"
    neg_scale: float = QTO_NEG_SCALE
    negation: str = "qto"
    device: str = "cpu"
    seed: int = 0
    json: bool = False
    trace_values: bool = False
    frontier_k: int | None = None
    row_cache_gb: float | None = None
    row_store_gb: float | None = None
    llm: object = None  # the LLM provider's options with --llm (llm_bridge.cli.LLMOptions), else None (KG only)
    verify: bool = True  # False: --skip-artifact-checksums (finite values and shapes are checked anyway)


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m engine.answer", description="Answer first-order logical queries over a knowledge graph "
                "(QTO: exact max-product over calibrated relation matrices) and explain each answer.")
    src = p.add_argument_group("what to ask (exactly one of --query, --expr, --queries)")
    src.add_argument("--query", metavar="STRUCTURE",
                     help="a BetaE structure (1p 2p 3p 2i 3i ip pi 2in 3in inp pin pni 2u up); without --anchors/"
                          "--relations a seeded example query with answers is picked from the KG")
    src.add_argument("--anchors", nargs="+", metavar="A", help="anchor entities for --query (names; #12 = id 12)")
    src.add_argument("--relations", nargs="+", metavar="R", help="relations for --query, in BetaE binding order")
    src.add_argument("--expr", help="a query expression, e.g. '(i (p r1 A) (np r2 B))'")
    src.add_argument("--queries", metavar="FILE", help="a file with one query expression per line")
    p.add_argument("--artifact", metavar="DIR", help="artifact folder (default: the bundled UMLS KG, built on first use)")
    p.add_argument("--top-k", type=int, default=10, help="answers per query (default 10)")
    p.add_argument("--explain", action=argparse.BooleanOptionalAction, default=True,
                   help="print why each answer holds (default on)")
    from ops.fuzzy import TNORMS
    from engine.lang.structures import NEGATION_MODES

    p.add_argument("--tnorm", choices=TNORMS, default="product", help="intersection t-norm (default product)")
    p.add_argument("--neg-scale", type=float, default=QTO_NEG_SCALE,
                   help=f"s in QTO's negation 1-min(1, s*M) (default {QTO_NEG_SCALE})")
    p.add_argument("--negation", choices=NEGATION_MODES, default="qto",
                   help="how --query structures negate: QTO's negated edge or the complement 1-x (default qto)")
    p.add_argument("--device", default="cpu", help="torch device: cpu, cuda or cuda:N (default cpu)")
    p.add_argument("--seed", type=int, default=0, help="seed of the example query for --query alone (default 0)")
    p.add_argument("--frontier-k", type=int, default=None, metavar="K",
                   help="keep the K best entities of every projection's input (as CQD-beam; default: all, exact)")
    p.add_argument("--row-cache-gb", type=float, default=None, metavar="G",
                   help="lazy artifacts: calibrated-row cache budget in GiB (default: as built)")
    p.add_argument("--row-store-gb", type=float, default=None, metavar="G",
                   help="lazy artifacts: disk budget of the rows persisted for later runs, in GiB under "
                        "$KGREASON_HOME/rows (default 4; 0: off)")
    p.add_argument("--json", action="store_true", help="print one JSON object per query (JSON lines)")
    p.add_argument("--trace-values", action="store_true",
                   help="keep every node's values in the trace (--json: each node's top 10 entities)")
    from engine.providers import llm_provider
    from kge.artifact import add_checksum_argument

    add_checksum_argument(p)
    llm_provider().add_answer_arguments(p)  # --llm and its --llm-* flags (LGOT: the LLM answers every sub-question too)
    return p


def parse_args(argv: Sequence[str] | None) -> AnswerConfig:
    from engine.providers import llm_provider

    ns = _parser().parse_args(argv)
    given = [name for name in ("query", "expr", "queries") if getattr(ns, name) is not None]
    if len(given) != 1:
        raise UserError("give exactly one of --query, --expr, --queries" + (f" (got {', '.join('--' + g for g in given)})" if given else ""))
    if (ns.anchors or ns.relations) and ns.query is None:
        raise UserError("--anchors/--relations go with --query STRUCTURE")
    if ns.query is not None and bool(ns.anchors) != bool(ns.relations):
        raise UserError(f"--query {ns.query}: give both --anchors and --relations, or neither (for an example query)")
    if ns.top_k < 1:
        raise UserError(f"--top-k must be >= 1, got {ns.top_k}")
    check_seed(ns.seed)
    check_device(ns.device)
    if ns.frontier_k is not None and ns.frontier_k < 1:
        raise UserError(f"--frontier-k must be >= 1, got {ns.frontier_k}")
    if ns.row_cache_gb is not None:
        from kge.lazy import check_row_cache_gb

        check_row_cache_gb(ns.row_cache_gb, "--row-cache-gb")
    if ns.row_store_gb is not None:
        from kge.lazy import check_row_store_gb

        check_row_store_gb(ns.row_store_gb, "--row-store-gb")
    if getattr(ns, "llm_cache", None):  # the LLM's response cache is written: never into the artifact
        from kgreason.files import check_not_input

        check_not_input(ns.llm_cache, what="--llm-cache", inputs=[("--artifact", ns.artifact)])
    return AnswerConfig(
        artifact=ns.artifact, query=ns.query, anchors=tuple(ns.anchors) if ns.anchors else None,
        relations=tuple(ns.relations) if ns.relations else None, expr=ns.expr, queries=ns.queries,
        top_k=ns.top_k, explain=ns.explain, tnorm=ns.tnorm, neg_scale=ns.neg_scale, negation=ns.negation,
        device=ns.device, seed=ns.seed, json=ns.json, trace_values=ns.trace_values,
        frontier_k=ns.frontier_k, row_cache_gb=ns.row_cache_gb, row_store_gb=ns.row_store_gb, llm=llm_provider().answer_options(ns, top_k=ns.top_k),
        verify=not ns.skip_artifact_checksums,
    )


def _token(value: str) -> str | int:
    """A command-line name: ``#12`` is id 12, anything else a name (as in the query language)."""
    m = _ID.fullmatch(value)
    return int(m.group(1)) if m else value


def read_queries(path: str) -> list[tuple[str, str]]:
    """``(where, text)`` for each non-blank line of ``path`` (``where`` = ``path:line``)."""
    from kgreason.files import read_lines  # UTF-8 (BOM tolerated); errors name file:line, a folder is refused

    out = [(f"{path}:{k}", line) for k, line in read_lines(path, what="--queries") if line.strip()]
    if not out:
        raise UserError(f"--queries: {path} has no queries")
    return out


def run(cfg: AnswerConfig, out=None, *, hooks: Sequence = ()) -> int:
    """Answer the queries ``cfg`` describes and print them (text or JSON lines) to ``out`` (default stdout).

    ``hooks``: per-node executor hooks (:mod:`engine.exec.hooks`), e.g. an LLM
    bridge's; their evidence shows as provenance, their notes in the trace.
    """
    out = sys.stdout if out is None else out
    from engine.exec.api import Engine
    from engine.lang.query import describe, named, parse, resolve, to_sexpr
    from engine.lang.structures import get_structure

    artifact = cfg.artifact
    if artifact is not None and (cfg.row_cache_gb is not None or cfg.row_store_gb is not None):
        from kge.artifact import Artifact

        artifact = Artifact.load(artifact, verify=cfg.verify, load_embeddings=False, row_cache_gb=cfg.row_cache_gb,
                                 row_store_gb=cfg.row_store_gb)
    engine = Engine.load(artifact, verify=cfg.verify, negation=cfg.negation, tnorm=cfg.tnorm, neg_scale=cfg.neg_scale,
                         device=cfg.device, hooks=hooks, frontier_k=cfg.frontier_k)
    art = engine.artifact
    if cfg.query is not None:
        structure = get_structure(cfg.query)
        if cfg.anchors is None:
            nodes = [engine.example(structure.name, seed=cfg.seed)]
        else:
            node = structure.build([_token(a) for a in cfg.anchors], [_token(r) for r in cfg.relations or ()],
                                   negation=cfg.negation)
            nodes = [resolve(node, art, where=f"--query {structure.name}")]
    elif cfg.expr is not None:
        nodes = [resolve(parse(cfg.expr, where="--expr"), art, where="--expr")]
    else:
        nodes = []
        for where, text in read_queries(cfg.queries):
            nodes.append(resolve(parse(text, where=where), art, where=where))
    results = engine.executor.answer(nodes, k=cfg.top_k, explain=cfg.explain, trace_values=cfg.trace_values)
    for node, res in zip(nodes, results):
        if cfg.json:
            out.write(json_line(res.to_json()) + "\n")
            continue
        out.write(f"query: {printable(to_sexpr(named(node, art)))}\n")
        out.write(f"  in words: {printable(describe(node, art))}\n")
        if not res.answers:
            out.write("  no answers (every entity scores 0)\n\n")
            continue
        names = [printable(a.entity) for a in res.answers]
        width = max(len(n) for n in names)
        # Provenance only when something other than the KG contributed: plain KG runs print as before.
        tagged = any(a.provenance != "kg" for a in res.answers)
        for rank, (a, name) in enumerate(zip(res.answers, names), 1):
            tag = f"  [{printable(a.provenance)}]" if tagged else ""
            out.write(f"  {rank:>3}. {a.score:.4f}  {name:<{width}}  (id {a.id}){tag}\n")
            if a.explanation is not None:
                for line in a.explanation.lines():
                    out.write(f"         {printable(line)}\n")
        for line in _trace_lines(res.trace):
            out.write(f"  {printable(line)}\n")
        out.write("\n")
    out.flush()
    return 0


def _trace_lines(trace) -> list[str]:
    """The trace's nodes that hooks touched, one compact line each (none for a plain KG run)."""
    if trace is None:
        return []
    lines = []
    for nt in trace.nodes:
        if not (nt.hooks or nt.notes or nt.evidence or nt.row_evidence):
            continue
        what = nt.op + (f" {nt.relation_name}" if nt.relation_name is not None else "") + \
            (f" {nt.entity_name}" if nt.entity_name is not None else "")
        parts = []
        if nt.hooks:
            parts.append("hooks " + ", ".join(nt.hooks))
        if nt.evidence:
            by_source: dict[str, int] = {}
            for ev in nt.evidence.values():
                by_source[ev.source] = by_source.get(ev.source, 0) + 1
            parts.append("evidence " + ", ".join(f"{k} {v}" for k, v in sorted(by_source.items())))
        if nt.row_evidence is not None:
            parts.append(f"row replaced by {nt.row_evidence.source} (others {nt.row_evidence.score:g})")
        if nt.notes:
            from engine.providers import llm_provider  # the provider's notes in one line (--json has them in full)

            parts.append(llm_provider().compact_notes(nt.notes))
        lines.append(f"node {list(nt.path)} ({what}): " + "; ".join(parts))
    return ["trace:"] + ["  " + l for l in lines] if lines else []


@cli_main
def main(argv: Sequence[str] | None = None) -> int:
    from engine.providers import llm_provider

    cfg = parse_args(argv)
    with llm_provider().answer_hooks(cfg.llm) as hooks:  # () without --llm
        return run(cfg, hooks=hooks)


if __name__ == "__main__":
    raise SystemExit(main())
