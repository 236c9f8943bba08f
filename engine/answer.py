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

import dataclasses
import re
import sys
from dataclasses import dataclass
from typing import Sequence

from kgreason.cli import (SEED_MAX, ArgumentParser as _Parser, Settings, add_settings_arguments, setting,  # _Parser: one-line UserError, user text escaped
                          settings_from_args, verify_setting)
from kgreason.errors import UserError, cli_main
from kgreason.text import json_line, printable  # KG names and LLM text: escaped where printed

from engine.cli_fields import (device_setting, frontier_k_setting, neg_scale_setting, row_cache_gb_setting,
                               row_store_gb_setting, tnorm_setting)
from engine.lang.structures import NEGATION_MODES, STRUCTURES

__all__ = ["AnswerSettings", "AnswerConfig", "main", "run"]

_ID = re.compile(r"#(\d+)")
#: The flags that say what to ask (exactly one of them).
_SOURCES = ("query", "expr", "queries")


@dataclass(frozen=True, kw_only=True)
class AnswerSettings(Settings):
    """Everything ``engine.answer`` was asked to do; each field's flag is declared with it (see ``--help``)."""

    artifact: str | None = setting(None, metavar="DIR", shown_default="the bundled UMLS KG, built on first use",
                                   help="artifact folder")
    query: str | None = setting(None, metavar="STRUCTURE",
                                help=f"a BetaE structure ({' '.join(STRUCTURES)}); without --anchors/--relations a "
                                     "seeded example query with answers is picked from the KG")
    anchors: tuple[str, ...] | None = setting(None, metavar="A", help="anchor entities for --query (names; #12 = id 12)")
    relations: tuple[str, ...] | None = setting(None, metavar="R", help="relations for --query, in BetaE binding order")
    expr: str | None = setting(None, help="a query expression, e.g. '(i (p r1 A) (np r2 B))'")
    queries: str | None = setting(None, metavar="FILE", help="a file with one query expression per line")
    top_k: int = setting(10, low=1, integer=True, help="answers per query")
    explain: bool = setting(True, boolean_optional=True, help="print why each answer holds (default on)")
    tnorm: str = tnorm_setting()
    neg_scale: float = neg_scale_setting()
    negation: str = setting("qto", choices=NEGATION_MODES,
                            help="how --query structures negate: QTO's negated edge or the complement 1-x")
    device: str = device_setting()
    seed: int = setting(0, low=0, high=SEED_MAX, integer=True, help="seed of the example query for --query alone")
    json: bool = setting(False, help="print one JSON object per query (JSON lines)")
    trace_values: bool = setting(False, help="keep every node's values in the trace (--json: each node's top 10 "
                                             "entities)")
    frontier_k: int | None = frontier_k_setting()
    row_cache_gb: float | None = row_cache_gb_setting()
    row_store_gb: float | None = row_store_gb_setting()
    llm: object = None  # the LLM provider's settings with --llm (llm_bridge.cli.LLMSettings), else None (KG only)
    verify: bool = verify_setting()
    # -- sharded runs: torchrun --nproc-per-node P -m engine.answer ... (engine.exec.sharded, docs/distributed.md)
    dist_timeout: float | None = setting(None, low=0, low_open=True, high=1e7, metavar="S", shown_default="120",
                                         help="under torchrun: seconds a rank waits for the others in an exchange "
                                              "before it stops with an error (joining waits at least 60 s)")

    def __post_init__(self) -> None:
        given = [name for name in _SOURCES if getattr(self, name) is not None]
        if len(given) != 1:
            raise UserError("give exactly one of --query, --expr, --queries"
                            + (f" (got {', '.join('--' + g for g in given)})" if given else ""))
        if (self.anchors or self.relations) and self.query is None:
            raise UserError("--anchors/--relations go with --query STRUCTURE")
        if self.query is not None and bool(self.anchors) != bool(self.relations):
            raise UserError(f"--query {self.query}: give both --anchors and --relations, or neither (for an example query)")
        super().__post_init__()


#: The former name of :class:`AnswerSettings` (settings classes are named by docs/cli.md's rule).
AnswerConfig = AnswerSettings


def _parser() -> _Parser:
    p = _Parser(prog="python -m engine.answer", description="Answer first-order logical queries over a knowledge graph "
                "(QTO: exact max-product over calibrated relation matrices) and explain each answer.")
    src = p.add_argument_group("what to ask (exactly one of --query, --expr, --queries)")
    add_settings_arguments(src, AnswerSettings, only=("query", "anchors", "relations", "expr", "queries"))
    add_settings_arguments(p, AnswerSettings, skip=("query", "anchors", "relations", "expr", "queries"))
    from engine.providers import llm_provider

    llm_provider().add_answer_arguments(p)  # --llm and its --llm-* flags (LGOT: the LLM answers every sub-question too)
    return p


def parse_args(argv: Sequence[str] | None) -> AnswerSettings:
    from engine.providers import llm_provider

    ns = _parser().parse_args(argv)
    settings = settings_from_args(AnswerSettings, ns)  # its checks first: a bad --top-k before the LLM flags
    if getattr(ns, "llm_cache", None):  # the LLM's response cache is written: never into the artifact
        from kgreason.files import check_not_input

        check_not_input(ns.llm_cache, what="--llm-cache", inputs=[("--artifact", ns.artifact)])
    return dataclasses.replace(settings, llm=llm_provider().answer_options(ns, top_k=settings.top_k))


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


def run(cfg: AnswerSettings, out=None, *, hooks: Sequence = ()) -> int:
    """Answer the queries ``cfg`` describes and print them (text or JSON lines) to ``out`` (default stdout).

    ``hooks``: per-node executor hooks (:mod:`engine.exec.hooks`), e.g. an LLM
    bridge's; their evidence shows as provenance, their notes in the trace.
    """
    out = sys.stdout if out is None else out
    from engine.exec.api import Engine
    from engine.lang.query import describe, named, parse, resolve, to_sexpr
    from engine.lang.structures import get_structure

    from engine.exec.sharded_load import rank_zero_output, sharded_row_options, torchrun_group

    group = torchrun_group(cfg.device, cfg.dist_timeout)  # None unless torchrun started several ranks
    artifact, sharded = cfg.artifact, {}
    if group is not None:
        sharded = sharded_row_options(cfg.row_cache_gb, cfg.row_store_gb)
    elif artifact is not None and (cfg.row_cache_gb is not None or cfg.row_store_gb is not None):
        from kge.artifact import Artifact

        artifact = Artifact.load(artifact, verify=cfg.verify, load_embeddings=False, row_cache_gb=cfg.row_cache_gb,
                                 row_store_gb=cfg.row_store_gb)
    out = rank_zero_output(group, out)
    engine = Engine.load(artifact, verify=cfg.verify, negation=cfg.negation, tnorm=cfg.tnorm, neg_scale=cfg.neg_scale,
                         device=cfg.device, hooks=hooks, frontier_k=cfg.frontier_k, process_group=group, **sharded)
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
    from engine.exec.sharded_load import rank_zero_hooks, torchrun_group

    # Under torchrun only rank 0 builds the LLM client and opens --llm-cache (it alone runs the hooks)
    group = torchrun_group(cfg.device, cfg.dist_timeout) if cfg.llm is not None else None
    with rank_zero_hooks(group, lambda: llm_provider().answer_hooks(cfg.llm)) as hooks:  # () without --llm
        return run(cfg, hooks=hooks)


if __name__ == "__main__":
    raise SystemExit(main())
