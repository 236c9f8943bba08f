"""MetaQA Hits@1 of the ask loop (engine.exec.ask) against its baselines; writes a JSON of the runs.

    python -m experiments.metaqa_ask --build-kg-only artifacts/metaqa-kgonly   # ~10 s
    python -m experiments.metaqa_ask --artifact artifacts/metaqa-kgonly --label "full KG" \\
        --per-hop 1000 --errors 0.2 0.5 --out benchmarks/results/ask/metaqa_full.json
    python -m experiments.metaqa_ask --report benchmarks/results/ask/metaqa_*.json --overwrite  # tables + plot
    python -m experiments.metaqa_ask --export questions.jsonl --hops 2 --per-hop 100  # a questions file
    python -m experiments.metaqa_ask --artifact artifacts/metaqa-kgonly --make-exemplars \
        artifacts/metaqa-dev-exemplars.jsonl --split dev --per-hop 3000     # weakly supervised exemplars
    python -m experiments.metaqa_ask --artifact artifacts/metaqa-kgonly \
        --tune-exemplars artifacts/metaqa-dev-exemplars.jsonl              # k / weight on held-out dev exemplars
    python -m experiments.metaqa_ask --artifact artifacts/metaqa-drop50 --split dev --per-hop 300 \
        --labels artifacts/metaqa-dev-exemplars.jsonl --errors 0.2 --karpa-only --out /tmp/dev.json  # choose settings

Methods, on the same ``--per-hop`` test questions per hop (engine.eval.metaqa, seeded sample):

* ``embedding``: no LLM; embedding-only retrieval (KARPA-H with the question as the plan, per-hop
  cost AskSettings.length_penalty), the answers by the vote of the top candidate paths
  (AskSettings.vote_paths / vote_temperature); paths read as their relations' questions
  (llm_bridge.prompts.fallback_template, centred embeddings; ``--path-text names``: the relation names);
* ``karpa-eE``: the loop with the simulated planner/reasoner (experiments.simulate_ask) over HTTP on
  127.0.0.1, plan error = reason error = E; paraphrased plans (synonym rate 0.5), one re-plan;
* ``embedding+exemplars (dev)`` (with ``--exemplars FILE``): the same, plus the kNN vote of exemplar
  questions (Asker(exemplars=...)); the exemplars come from ``--make-exemplars`` on the DEV split;
* ``gold-lf``: the executor on the gold logical form (engine.eval.metaqa's expression): the upper
  bound of the logic side.

``--split dev``: the same rows on weakly labelled DEV questions (the labels of ``--make-exemplars``, ``--labels``;
``--per-hop`` of them per hop, seed 100 + hops; no gold-lf row): where settings are chosen, never on test.
The karpa rows also say what the reasoner was shown (``candidate_stats``): the gold path among the candidates,
first, path 1's first answer right, the first answer picked by the LLM, candidates per question.

Outputs follow the CLI rules of every tool (docs/cli.md): a mistake is one ``error:`` line (status 2), every
output is checked before any work, is never one of the inputs (``--data``, ``--artifact``, ``--exemplars``,
``--labels``, the ``--report`` files) nor inside one, is written to a temporary sibling and renamed into place
(nothing is truncated before the inputs are read), and an existing file or artifact is replaced only with
``--overwrite`` (``--out`` also with ``--merge``, which keeps its other rows).  ``--trace-out`` appends.

Hits@1: the first answer is a gold answer.  LLM calls and tokens are per question (the simulator
counts words as tokens); wall time per question includes retrieval, the executor and HTTP.
Explanations are off (not needed for Hits@1).
"""
from __future__ import annotations

import argparse
import io
import json
import math
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from kgreason.cli import ArgumentParser, check_seed
from kgreason.errors import UserError, cli_main
from kgreason.files import OutputFolder, check_output_file, json_object, loads_json, open_output, write_output
from kgreason.text import json_line  # JSON lines: controls, bidi and U+2028/9 escaped

#: The checkout the defaults are relative to (MetaQA beside it in ../shared/data, results in benchmarks/).
ROOT = Path(__file__).resolve().parents[1]
#: Where the committed MetaQA results, tables and plot live.
RESULTS = ROOT / "benchmarks" / "results" / "ask"


def run(args) -> dict:
    from engine.eval.metaqa import load_metaqa_questions
    from engine.exec.api import Engine
    from engine.exec.ask import Asker
    from llm_bridge.client import LLMClient
    from llm_bridge.config import LLMConfig
    from llm_bridge.karpa_loop import LLMPlanner, LLMReasoner
    from experiments.simulate import KnowledgeBase
    from experiments.simulate_ask import AskSimConfig, start_ask_server

    eng = Engine.load(args.artifact, verify=args.verify)
    ret = eng.retriever(encoder=args.encoder)
    from llm_bridge.prompts import fallback_template

    from engine.exec.ask import read_exemplars

    verbalizer = None if args.path_text == "names" else fallback_template
    overrides = args.overrides
    settings = ask_settings(args)
    asker = Asker(eng, ret, settings=settings, verbalizer=verbalizer)
    ex_asker = None
    if args.exemplars:
        ex_asker = Asker(eng, ret, settings=settings, verbalizer=verbalizer,
                         exemplars=read_exemplars(args.exemplars, eng.artifact.relations))
    out = {"artifact": str(args.artifact), "label": args.label, "per_hop": args.per_hop,
           "split": args.split or "test", "runs": []}
    dev = args.split == "dev"
    for hops in args.hops:
        if dev:  # settings are chosen here: weakly labelled DEV questions, never the test ones
            qs = dev_questions(Path(args.data), args.labels, hops, args.per_hop, seed=100)
        else:
            qs = load_metaqa_questions(args.data, hops=hops, limit=args.per_hop or None, seed=0)
        if args.first:  # the first N of the same seeded --per-hop sample the other rows use
            qs = qs[: args.first]
        gold = [set(q.answers) for q in qs]
        texts = [q.question for q in qs]

        def score(results, method, seconds, extra=None):
            hits = [bool(r.answers) and r.answers[0].entity in g for r, g in zip(results, gold)]
            row = {"hops": hops, "method": method, "questions": len(qs), "hits@1": sum(hits) / len(qs),
                   "llm_calls": sum(r.llm_calls for r in results) / len(qs),
                   "tokens": sum(r.llm_tokens for r in results) / len(qs), "seconds": seconds / len(qs),
                   "fallbacks": sum(r.retrieval == "embedding" for r in results) / len(qs),
                   "by_type": hits_by_type(hits, qs)}
            row.update(extra or {})
            out["runs"].append(row)
            print(json.dumps(row), flush=True)

        if not (args.exemplars_only or args.karpa_only):
            t = time.perf_counter()
            res = asker.ask(texts, progress=not args.quiet)
            score(res, "embedding", time.perf_counter() - t)
        if ex_asker is not None:
            t = time.perf_counter()
            res = ex_asker.ask(texts, progress=not args.quiet)
            score(res, "embedding+exemplars (dev)", time.perf_counter() - t, {"exemplars": str(args.exemplars)})
        for e in args.errors:
            server = start_ask_server(KnowledgeBase.from_artifact(args.artifact, verify=args.verify), {q.question: q.relations for q in qs},
                                      AskSimConfig(plan_error=e, reason_error=e, synonym_rate=0.5))
            try:
                cfg = LLMConfig(base_url=server.base_url, model="sim", n=1, temperature=0.0, use_cache=False,
                                concurrency=8, max_retries=1, timeout_s=30.0)
                with LLMClient(cfg) as client:
                    t = time.perf_counter()
                    res = asker.ask(texts, planner=LLMPlanner(client), reasoner=LLMReasoner(client), progress=not args.quiet)
                    score(res, f"karpa-e{e:g}" + (f" {args.settings}" if overrides else ""), time.perf_counter() - t,
                          {"error": e, **candidate_stats(res, [q.relations for q in qs], gold),
                           **({"settings": overrides} if overrides else {})})
            finally:
                server.stop()
        if args.llm_url:
            # A real model behind an OpenAI-compatible server (e.g. python -m llm_bridge.local): one request at a
            # time by default (llama.cpp's server runs one), and a whole-stage deadline that a slow CPU model
            # answering every question of the stage can meet.
            cfg = LLMConfig(base_url=args.llm_url, model=args.llm_model, n=1, temperature=0.0, use_cache=False,
                            concurrency=args.llm_concurrency, max_retries=1, timeout_s=args.llm_timeout,
                            deadline_s=args.llm_timeout * (len(qs) + 1), max_tokens=args.llm_max_tokens)
            with LLMClient(cfg) as client:
                t = time.perf_counter()
                res = asker.ask(texts, planner=LLMPlanner(client, json_output=args.llm_ask_json),
                                reasoner=LLMReasoner(client, json_output=args.llm_ask_json), progress=not args.quiet)
                score(res, f"karpa-{args.llm_model}", time.perf_counter() - t,
                      {"model": args.llm_model, "llm_url": args.llm_url, "llm_ask_json": args.llm_ask_json,
                       "warnings": warning_counts(res),
                       "selected_by_llm": sum(bool(r.answers) and r.answers[0].selected_by == "llm"
                                              for r in res) / len(qs),
                       "http": client.stats.to_json()})
            if args.trace_out:  # appended (never truncated): one file can gather several runs' traces
                with open(args.trace_out, "a", encoding="utf-8") as f:
                    for r, g in zip(res, gold):
                        f.write(json_line({"hops": hops, "gold": sorted(g), **r.to_json()}, default=str) + "\n")
        if args.exemplars_only or args.karpa_only or dev:  # no gold logical form on dev (weak labels only)
            continue
        t = time.perf_counter()
        rs = eng.executor.answer(eng.queries([q.expression for q in qs]), k=1, explain=False)
        secs = time.perf_counter() - t
        hits = [bool(r.answers) and r.answers[0].entity in g for r, g in zip(rs, gold)]
        row = {"hops": hops, "method": "gold-lf", "questions": len(qs), "hits@1": sum(hits) / len(qs),
               "llm_calls": 0.0, "tokens": 0.0, "seconds": secs / len(qs), "fallbacks": 0.0}
        out["runs"].append(row)
        print(json.dumps(row), flush=True)
    return out


def path_type(q) -> str:
    """A question's path type: MetaQA's qtype on test (``movie_to_director_to_movie``), the weakly labelled
    relation path on dev (``directed_by,directed_by^-1``)."""
    return getattr(q, "qtype", None) or ",".join(q.relations)


def hits_by_type(hits: Sequence[bool], qs: Sequence[Any]) -> dict[str, list[int]]:
    """Path type (:func:`path_type`) -> [questions, Hits@1 hits], by type."""
    out: dict[str, list[int]] = {}
    for h, q in zip(hits, qs):
        c = out.setdefault(path_type(q), [0, 0])
        c[0] += 1
        c[1] += int(h)
    return dict(sorted(out.items()))


#: What a trace warning says, by kind (the first pattern that matches; "other" otherwise).
_WARNING_KINDS = (
    ("llm-timeout", r"LLM timeout"), ("llm-error", r"LLM \w+:"),
    ("plan-malformed", r"malformed planner reply"), ("plan-empty", r"empty plan|proposed no plan"),
    ("plan-unknown-relation", r"names no relation"), ("plan-too-long", r"more than max_hops"),
    ("plan-none-usable", r"no usable plan"), ("plan-no-path", r"plans match no path"),
    ("reason-malformed", r"malformed reasoner reply"), ("reason-bad-numbers", r"out of range"),
    ("reason-invented-answers", r"not among the candidates"), ("reason-best-path", r"picked nothing usable"),
)


def warning_counts(results) -> dict[str, float]:
    """The fraction of questions whose trace has each kind of warning (a question counts once per kind)."""
    import re

    out: dict[str, float] = {}
    for r in results:
        kinds = set()
        for w in r.warnings:
            kinds.add(next((k for k, pat in _WARNING_KINDS if re.search(pat, w)), "other"))
        for k in kinds:
            out[k] = out.get(k, 0.0) + 1 / len(results)
    return dict(sorted(out.items()))


def candidate_stats(results, gold_paths, gold_answers) -> dict[str, float]:
    """What the reasoner was shown, per question (fractions of the questions, means over them): the gold
    relation path among the candidates (``gold_shown``) and first (``gold_first``); path 1 with a gold
    first answer (``first_path_hits``); the first answer picked by the LLM (``by_llm``); candidates shown."""
    n = max(len(results), 1)
    shown = first = p1 = llm = cands = 0
    for r, gp, ga in zip(results, gold_paths, gold_answers):
        names = [tuple(p.names) for p in r.paths]
        shown += tuple(gp) in names
        first += bool(names) and names[0] == tuple(gp)
        p1 += bool(r.paths) and bool(r.paths[0].answers) and r.paths[0].answers[0].entity in ga
        llm += bool(r.answers) and r.answers[0].selected_by == "llm"
        cands += len(r.paths)
    return {"gold_shown": shown / n, "gold_first": first / n, "first_path_hits": p1 / n, "by_llm": llm / n,
            "candidates": cands / n}


@dataclass(frozen=True)
class DevQuestion:
    """A MetaQA dev question with its weak label (``relations``: the path of --make-exemplars)."""

    question: str
    relations: tuple[str, ...]
    answers: tuple[str, ...]


def dev_questions(folder: Path, labels: str | os.PathLike, hops: int, limit: int, seed: int) -> list[DevQuestion]:
    """``limit`` labelled dev questions of ``hops`` hops (0: all), a sample drawn with
    ``default_rng(seed + hops)`` kept in file order: the question and answers from MetaQA's
    ``{hops}-hop/dev.txt``, the relation path from the weak labels (``labels``, the --make-exemplars
    file: ``{"question", "path", "hops"}`` per line; unlabelled questions are left out)."""
    from engine.exec.ask import read_exemplars

    path_of = dict(read_exemplars(labels))  # the --make-exemplars file is an exemplars file
    qs = [DevQuestion(question=q, relations=path_of[q], answers=tuple(sorted(a)))
          for q, _, a in read_split(folder, hops, "dev") if len(path_of.get(q, ())) == hops]
    if not qs:
        raise UserError(f"--labels {labels}: no {hops}-hop dev question of {folder} is labelled")
    if limit and limit < len(qs):
        keep = np.sort(np.random.default_rng(seed + hops).choice(len(qs), limit, replace=False))
        qs = [qs[i] for i in keep]
    return qs


def read_split(folder: Path, hops: int, split: str) -> list[tuple[str, str, set[str]]]:
    """(question, topic, gold answers) of MetaQA's ``{hops}-hop/{split}.txt`` (no type file needed)."""
    from kgreason.files import read_lines

    f = Path(folder) / f"{hops}-hop" / f"{split}.txt"
    if not f.is_file():
        raise UserError(f"{f}: file not found")
    out = []
    for n, line in read_lines(f):
        if not line.strip():
            continue
        parts = line.split("\t")
        lo, hi = parts[0].find("["), parts[0].find("]")
        if len(parts) != 2 or lo < 0 or hi < lo:
            raise UserError(f"{f}:{n}: expected 'question with [topic]<TAB>ans1|ans2'")
        out.append((parts[0], parts[0][lo + 1 : hi], set(parts[1].split("|"))))
    return out


def path_answers(ret, topic: int, hops: int) -> dict[tuple[int, ...], np.ndarray]:
    """Every relation sequence of exactly ``hops`` hops from ``topic`` -> its tails on the KG (exact set
    semantics, the topic removed from the second hop on: MetaQA's answer rule, engine.exec.ask.path_query)."""
    level = [((), np.array([topic], dtype=np.int64))]
    for step in range(hops):
        nxt = []
        for prefix, F in level:
            for x, tails in ret.expand(F):
                if step >= 1:
                    tails = tails[tails != topic]
                if len(tails):
                    nxt.append((prefix + (int(x),), np.asarray(tails, dtype=np.int64)))
        level = nxt
    return dict(level)


def make_exemplars(args) -> None:
    """Weak supervision: a dev question's label is the relation path of its hop count from its topic whose
    answer set on the full KB equals the gold set (kept when exactly one path does), else the path of best
    Jaccard when that is >= 0.9 and unique.  Uses no test data and no qtype file."""
    from engine.exec.api import Engine
    from kgreason.progress import progress_bar

    eng = Engine.load(args.artifact, verify=args.verify)
    ret = eng.retriever(encoder="hashing")  # the graph only; no text is embedded here
    ents = eng.artifact.entities
    index = {n: i for i, n in enumerate(ents)}
    rel = ret.graph.relation_names
    stats = {}
    # Written to a temporary sibling and renamed when complete: OUT keeps its old content until then.
    with open_output(args.make_exemplars, what="--make-exemplars") as f:
        for hops in args.hops:
            qs = read_split(Path(args.data), hops, args.split)
            if args.per_hop and args.per_hop < len(qs):
                keep = np.sort(np.random.default_rng(args.seed + hops).choice(len(qs), args.per_hop, replace=False))
                qs = [qs[i] for i in keep]
            st = {"questions": len(qs), "exact": 0, "jaccard": 0, "ambiguous": 0, "none": 0, "no_topic": 0}
            for q, topic, gold in progress_bar(qs, desc=f"exemplars {hops}-hop", unit="question", disable=args.quiet):
                if topic not in index:
                    st["no_topic"] += 1
                    continue
                g = {index[a] for a in gold if a in index}
                best, label = [], None
                for seq, tails in path_answers(ret, index[topic], hops).items():
                    t = set(tails.tolist())
                    j = len(t & g) / max(len(t | g), 1)
                    best.append((j, seq))
                exact = [seq for j, seq in best if j == 1.0]
                if len(exact) == 1:
                    label, kind = exact[0], "exact"
                elif len(exact) > 1:
                    st["ambiguous"] += 1
                    continue
                else:
                    best.sort(reverse=True)
                    if best and best[0][0] >= 0.9 and (len(best) == 1 or best[1][0] < best[0][0]):
                        label, kind = best[0][1], "jaccard"
                    else:
                        st["none"] += 1
                        continue
                st[kind] += 1
                f.write(json_line({"question": q, "path": [rel[x] for x in label], "hops": hops}) + "\n")
            st["labelled"] = st["exact"] + st["jaccard"]
            stats[hops] = st
            print(json.dumps({"hops": hops, **st}), flush=True)


def tune_exemplars(args) -> None:
    """Top-path accuracy of embedding-only retrieval on a held-out 20% of the exemplars (seeded), the
    other 80% as exemplars, over a grid of exemplar_weight x exemplar_k; 0 weight is the zero-shot score."""
    from dataclasses import replace

    from engine.exec.api import Engine
    from engine.exec.ask import Asker, AskSettings, find_topic, question_text, read_exemplars
    from llm_bridge.prompts import fallback_template

    eng = Engine.load(args.artifact, verify=args.verify)
    ret = eng.retriever(encoder=args.encoder)
    rel_ids = {n: i for i, n in enumerate(ret.graph.relation_names)}
    ex = read_exemplars(args.tune_exemplars, eng.artifact.relations)
    rng = np.random.default_rng(args.seed)
    held = np.zeros(len(ex), bool)
    held[rng.choice(len(ex), len(ex) // 5, replace=False)] = True
    if not held.any() or held.all():
        raise UserError(f"--tune-exemplars {args.tune_exemplars}: {len(ex)} exemplars; at least 5 are needed "
                        "(a fifth is held out)")
    train = [e for e, h in zip(ex, held) if not h]
    test, per = [], {}
    for e, h in zip(ex, held):  # at most --per-hop held-out questions per hop count
        if h and per.get(len(e[1]), 0) < args.per_hop:
            per[len(e[1])] = per.get(len(e[1]), 0) + 1
            test.append(e)
    asker = Asker(eng, ret, settings=AskSettings(explain=False), verbalizer=fallback_template, exemplars=train)
    ents = eng.artifact.entities
    topics = [find_topic(q, ents)[0] for q, _ in test]
    texts = [question_text(q, ents[t]) for (q, _), t in zip(test, topics)]
    gold = [tuple(rel_ids[x] for x in p) for _, p in test]
    for w in args.weights:
        for k in args.ks:
            asker.settings = replace(asker.settings, exemplar_weight=w, exemplar_k=k)
            got = asker.embedding_retrieve(topics, texts)
            by_h: dict[int, list[bool]] = {}
            for g, f in zip(gold, got):
                by_h.setdefault(len(g), []).append(bool(f) and f[0][1] == g)
            print(json.dumps({"weight": w, "k": k, "held_out": len(test), "top_path_acc": {
                h: round(100 * sum(v) / len(v), 1) for h, v in sorted(by_h.items())}}), flush=True)
            if w == 0:
                break


def report(paths: Sequence[Path], md: Path, png: Path) -> None:
    data = [read_results(p, "--report") for p in paths]
    lines = []
    for d in data:
        lines.append(f"\n### {d['label']} (`{d['artifact']}`, {d['per_hop']} test questions per hop)\n")
        lines.append("| method | hops | Hits@1 | LLM calls / q | tokens / q | ms / q | questions on embedding-only retrieval |")
        lines.append("|---|---|---|---|---|---|---|")
        for r in d["runs"]:
            mark = " (earlier run)" if r.get("rerun") is False else (" (history)" if r.get("history") else "")
            lines.append(f"| {r['method']}{mark} | {r['hops']} | {100 * r['hits@1']:.1f} | {r['llm_calls']:.2f} | "
                         f"{r['tokens']:.0f} | {1000 * r['seconds']:.1f} | {100 * r['fallbacks']:.1f}% |")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(data), figsize=(6 * len(data), 4), squeeze=False)
    for ax, d in zip(axes[0], data):
        # Rows marked "history" (an earlier scorer or loop) stay in the tables, not in the plot.
        methods = list(dict.fromkeys(r["method"] for r in d["runs"] if not r.get("history")))
        hops = sorted({r["hops"] for r in d["runs"]})
        w = 0.8 / len(methods)
        for i, m in enumerate(methods):
            ys = [next((100 * r["hits@1"] for r in d["runs"] if r["method"] == m and r["hops"] == h), 0) for h in hops]
            ax.bar([h + (i - (len(methods) - 1) / 2) * w for h in hops], ys, w, label=m)
        ax.set_xticks(hops, [f"{h}-hop" for h in hops])
        ax.set_ylabel("Hits@1 (%)")
        ax.set_ylim(0, 135)  # room for the legend above the bars
        ax.set_yticks(range(0, 101, 20))
        ax.set_title(f"MetaQA, {d['label']}")
        ax.legend(fontsize=6, loc="upper center", ncol=min(3, len(methods)))
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=120)
    plt.close(fig)
    # Both drawn before either is written; each written atomically (a temporary sibling renamed into place).
    write_output(md, "\n".join(lines) + "\n", what="--md")
    write_output(png, buf.getvalue(), what="--png")


def read_results(path: Path, what: str) -> dict[str, Any]:
    """A results JSON of this script (``{"label", "artifact", "per_hop", "runs": [{...}]}``), or a one-line
    UserError naming ``what`` and the file."""
    from kgreason.files import read_lines

    text = "\n".join(line for _, line in read_lines(path, what=what))
    try:
        data = loads_json(text)
    except json.JSONDecodeError as exc:
        raise UserError(f"{what} {path}:{exc.lineno}: not JSON ({exc.msg})") from None
    except ValueError as exc:  # nested too deeply
        raise UserError(f"{what} {path}: not JSON ({exc})") from None
    ok = isinstance(data, dict) and isinstance(data.get("runs"), list) and bool(data["runs"]) and all(
        isinstance(r, dict) and isinstance(r.get("hops"), int) and isinstance(r.get("method"), str)
        and all(isinstance(r.get(k), (int, float)) for k in ("hits@1", "llm_calls", "tokens", "seconds", "fallbacks"))
        for r in data["runs"]) and all(k in data for k in ("label", "artifact", "per_hop"))
    if not ok:
        raise UserError(f"{what} {path}: not a results file of this script (label, artifact, per_hop and rows "
                        "with hops, method, hits@1, llm_calls, tokens, seconds, fallbacks)")
    return data


#: The actions; one per command (the method rows when none of the others is given).
MODES = ("build_kg_only", "export", "make_exemplars", "tune_exemplars", "report")


@dataclass(frozen=True, kw_only=True)
class Settings:
    """What the command was asked to do (``--help``); checked by :func:`parse_args` before any work."""

    mode: str  # "run" (the method rows) or one of MODES
    artifact: Path | None = None
    label: str = "full"
    data: Path = ROOT.parent / "shared" / "data" / "metaqa"
    per_hop: int = 1000
    hops: tuple[int, ...] = (1, 2, 3)
    errors: tuple[float, ...] = (0.0, 0.2, 0.5)
    exemplars: Path | None = None
    exemplars_only: bool = False
    karpa_only: bool = False
    first: int = 0
    llm_url: str | None = None
    llm_model: str = "smollm2"
    llm_timeout: float = 120.0
    llm_concurrency: int = 1
    llm_max_tokens: int = 256
    llm_ask_json: str = "off"
    trace_out: Path | None = None
    merge: bool = False
    make_exemplars: Path | None = None
    split: str | None = None
    labels: Path = ROOT / "artifacts" / "metaqa-dev-exemplars.jsonl"
    seed: int = 0
    tune_exemplars: Path | None = None
    weights: tuple[float, ...] = (0.0, 0.25, 0.5, 1.0, 2.0)
    ks: tuple[int, ...] = (1, 3, 10)
    out: Path | None = None
    path_text: str = "questions"
    length_penalty: float | None = None
    settings: str | None = None  # the --settings JSON text (the karpa rows' method names end with it)
    overrides: dict = field(default_factory=dict)  # --settings parsed: AskSettings fields
    report: tuple[Path, ...] = ()
    build_kg_only: Path | None = None
    export: Path | None = None
    md: Path = RESULTS / "metaqa_tables.md"
    png: Path = RESULTS / "metaqa.png"
    encoder: str = "minilm"
    verify: bool = True  # False: --skip-artifact-checksums
    overwrite: bool = False
    quiet: bool = False


def _parser() -> argparse.ArgumentParser:
    from engine.paths import ENCODERS
    from kge.artifact import add_checksum_argument

    p = ArgumentParser(prog="python -m experiments.metaqa_ask", description=__doc__.splitlines()[0])
    p.add_argument("--artifact", type=Path, metavar="DIR", help="the artifact (the method rows, --make-exemplars, "
                   "--tune-exemplars)")
    p.add_argument("--label", default="full")
    p.add_argument("--data", type=Path, default=Settings.data, metavar="DIR",
                   help="MetaQA folder (kb.txt, {1,2,3}-hop/; default %(default)s)")
    p.add_argument("--per-hop", type=int, default=1000, help="questions per hop (0: all; default 1000)")
    p.add_argument("--hops", type=int, nargs="+", default=[1, 2, 3], choices=(1, 2, 3))
    p.add_argument("--errors", type=float, nargs="*", default=[0.0, 0.2, 0.5],
                   help="simulated LLM error rates of the karpa rows, in [0, 1] (none: no karpa rows)")
    p.add_argument("--exemplars", type=Path, metavar="FILE", help="also run embedding+exemplars (dev) with these exemplars")
    p.add_argument("--exemplars-only", action="store_true", help="with --exemplars: only that row (no others)")
    p.add_argument("--karpa-only", action="store_true", help="only the karpa rows (--errors, --llm-url)")
    p.add_argument("--first", type=int, default=0, metavar="N",
                   help="only the first N questions of each hop's --per-hop sample (the same seeded sample)")
    p.add_argument("--llm-url", metavar="URL", help="also a karpa row with the LLM at this OpenAI-compatible base "
                   "URL (ending in /v1, e.g. python -m llm_bridge.local's), n=1, temperature 0")
    p.add_argument("--llm-model", default="smollm2", help="--llm-url's model name (the row is karpa-NAME)")
    p.add_argument("--llm-timeout", type=float, default=120.0, metavar="SECONDS", help="per HTTP attempt")
    p.add_argument("--llm-concurrency", type=int, default=1, help="--llm-url requests in flight at once")
    p.add_argument("--llm-max-tokens", type=int, default=256, help="completion tokens per --llm-url request")
    p.add_argument("--llm-ask-json", choices=("schema", "object", "off"), default="off",
                   help="--llm-url's planner/reasoner response_format (llm_bridge.karpa_loop; default off)")
    p.add_argument("--trace-out", type=Path, metavar="FILE",
                   help="append the --llm-url row's results (AskResult JSON lines) to this file")
    p.add_argument("--merge", action="store_true", help="--out exists: replace its rows of the same hops and "
                   "method with the new ones, keep the others")
    p.add_argument("--split", default=None, choices=("dev", "train", "test"),
                   help="--make-exemplars' split (dev or train, never test; default dev); for the method rows: "
                        "test (default) or dev, the weakly labelled dev questions of --labels (--per-hop of them "
                        "per hop, seed 100 + hops; no gold-lf row), the split to choose settings on")
    p.add_argument("--labels", type=Path, metavar="FILE", default=Settings.labels,
                   help="with --split dev: the weak labels (--make-exemplars' output; default %(default)s)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--weights", type=float, nargs="+", default=list(Settings.weights),
                   help="--tune-exemplars' exemplar weights, in [0, 10]")
    p.add_argument("--ks", type=int, nargs="+", default=list(Settings.ks), help="--tune-exemplars' exemplar k, >= 1")
    p.add_argument("--out", type=Path, metavar="FILE", help="the method rows' results (JSON); an existing file "
                   "is replaced only with --overwrite (or updated with --merge)")
    p.add_argument("--path-text", choices=("questions", "names"), default="questions",
                   help="embedding-only retrieval's path text: relation questions (default) or relation names")
    p.add_argument("--length-penalty", type=float, default=None, help="AskSettings.length_penalty (default: its default)")
    p.add_argument("--settings", metavar="JSON", help='other AskSettings fields for every row, e.g. \'{"empty_variants": '
                   'true}\' (the karpa rows\' method names then end with it)')
    p.add_argument("--encoder", default="minilm", choices=sorted(ENCODERS),
                   help="relation/question encoder of the retrieval (default minilm; hashing: no model, for tests)")
    p.add_argument("--md", type=Path, default=Settings.md, metavar="FILE", help="--report's tables (default %(default)s)")
    p.add_argument("--png", type=Path, default=Settings.png, metavar="FILE", help="--report's plot (default %(default)s)")
    p.add_argument("--overwrite", action="store_true", help="replace existing output files or artifact folders")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    add_checksum_argument(p)
    actions = p.add_mutually_exclusive_group()
    actions.add_argument("--build-kg-only", type=Path, metavar="DIR", help="write a KG-only artifact of MetaQA's "
                         "kb.txt (observed edges, weight 1, no training: the 'full KG' runs) to DIR and stop")
    actions.add_argument("--export", type=Path, metavar="FILE", help="write the sampled questions as JSON lines "
                         "(question, path, answers: what engine.ask --questions and experiments.simulate_ask read) "
                         "and stop")
    actions.add_argument("--make-exemplars", type=Path, metavar="OUT",
                         help="write weakly supervised exemplars of --split to OUT")
    actions.add_argument("--tune-exemplars", type=Path, metavar="FILE",
                         help="held-out top-path accuracy over --weights x --ks")
    actions.add_argument("--report", type=Path, nargs="+", metavar="JSON", help="tables (--md) and plot (--png) "
                         "of results files")
    return p


def _check_range(flag: str, values, lo: float, hi: float) -> None:
    for v in values:
        if not (math.isfinite(v) and lo <= v <= hi):
            raise UserError(f"{flag} must be in [{lo:g}, {hi:g}], got {v:g}")


def parse_args(argv: Sequence[str] | None) -> Settings:
    """The command line as :class:`Settings`, every value and every output checked before any work:
    outputs are never one of the inputs nor inside one (``--data``, ``--artifact``, ``--exemplars``,
    ``--labels``, the ``--report`` files), an existing output is replaced only with ``--overwrite``
    (``--out`` also with ``--merge``), and nothing is written before the inputs are read."""
    a = _parser().parse_args(argv)
    check_seed(a.seed)
    mode = next((m for m in MODES if getattr(a, m)), "run")
    if not 0 <= a.per_hop <= 10_000_000:
        raise UserError(f"--per-hop must be in [0, 10000000] (0: all), got {a.per_hop}")
    if a.first < 0:
        raise UserError(f"--first must be >= 0, got {a.first}")
    _check_range("--errors", a.errors, 0.0, 1.0)
    _check_range("--weights", a.weights, 0.0, 10.0)
    if any(k < 1 for k in a.ks):
        raise UserError(f"--ks must be >= 1, got {min(a.ks)}")
    _check_range("--llm-timeout", [a.llm_timeout], 0.001, 86_400.0)
    if not 1 <= a.llm_concurrency <= 256:
        raise UserError(f"--llm-concurrency must be in [1, 256], got {a.llm_concurrency}")
    if not 1 <= a.llm_max_tokens <= 1_000_000:
        raise UserError(f"--llm-max-tokens must be in [1, 1000000], got {a.llm_max_tokens}")
    overrides: Any = {}
    if a.settings is not None:
        overrides = json_object(a.settings, "--settings", shape="of AskSettings fields")
    split = a.split
    if mode == "make_exemplars":
        if split == "test":
            raise UserError("--make-exemplars never reads the test split (--split dev or train)")
        split = split or "dev"
    elif mode == "run" and split == "train":
        raise UserError("the method rows run on --split test or dev")
    args = Settings(
        mode=mode, artifact=a.artifact, label=a.label, data=a.data, per_hop=a.per_hop,
        hops=tuple(dict.fromkeys(a.hops)), errors=tuple(a.errors), exemplars=a.exemplars,
        exemplars_only=a.exemplars_only, karpa_only=a.karpa_only, first=a.first, llm_url=a.llm_url,
        llm_model=a.llm_model, llm_timeout=a.llm_timeout, llm_concurrency=a.llm_concurrency,
        llm_max_tokens=a.llm_max_tokens, llm_ask_json=a.llm_ask_json, trace_out=a.trace_out, merge=a.merge,
        make_exemplars=a.make_exemplars, split=split, labels=a.labels, seed=a.seed, tune_exemplars=a.tune_exemplars,
        weights=tuple(a.weights), ks=tuple(a.ks), out=a.out, path_text=a.path_text, length_penalty=a.length_penalty,
        settings=a.settings, overrides=overrides, report=tuple(a.report or ()), build_kg_only=a.build_kg_only,
        export=a.export, md=a.md, png=a.png, encoder=a.encoder, verify=not a.skip_artifact_checksums,
        overwrite=a.overwrite, quiet=a.quiet)
    if mode == "run":
        ask_settings(args)  # AskSettings' own checks, before the artifact is loaded
    if mode in ("run", "make_exemplars", "tune_exemplars") and args.artifact is None:
        raise UserError(f"{'the method rows' if mode == 'run' else '--' + mode.replace('_', '-')} need --artifact")
    check_outputs(args)
    return args


def ask_settings(args: Settings):
    """The AskSettings of every row (``--length-penalty``, ``--settings``); a UserError naming the bad field."""
    from engine.exec.ask import AskSettings

    fields = dict(args.overrides)
    if args.length_penalty is not None:
        fields.setdefault("length_penalty", args.length_penalty)
    try:
        return AskSettings(**{"explain": False, **fields})
    except TypeError as exc:  # an unknown field, or a value of the wrong type compared with a number
        raise UserError(f"--settings {args.settings}: {exc}") from None


def _inputs(args: Settings) -> list[tuple[str, Path | None]]:
    """(flag, path) of everything this command reads."""
    ins: list[tuple[str, Path | None]] = [("--data", args.data), ("--artifact", args.artifact)]
    if args.mode == "run":
        ins += [("--exemplars", args.exemplars)] + ([("--labels", args.labels)] if args.split == "dev" else [])
    elif args.mode == "tune_exemplars":
        ins.append(("--tune-exemplars", args.tune_exemplars))
    elif args.mode == "report":
        ins += [("--report", p) for p in args.report]
    return ins


def _check_new_file(path: Path, what: str, args: Settings, *, replace: bool = False) -> None:
    """``path`` may be written as ``what``: not an input nor inside one, not a folder, its folder exists,
    and an existing file only with ``--overwrite`` (or ``replace``)."""
    check_output_file(path, what=what, inputs=_inputs(args))
    if path.exists() and not (args.overwrite or replace):
        raise UserError(f"{what} {path}: already exists; pass --overwrite to replace it")


def check_outputs(args: Settings) -> None:
    """Every output of ``args`` checked before any work (see :func:`parse_args`)."""
    if args.mode == "build_kg_only":
        OutputFolder(args.build_kg_only, overwrite=args.overwrite, what="--build-kg-only", create_parents=True,
                     inputs=_inputs(args))  # construction checks only; main builds it
    elif args.mode == "export":
        _check_new_file(args.export, "--export", args)
    elif args.mode == "make_exemplars":
        _check_new_file(args.make_exemplars, "--make-exemplars", args)
    elif args.mode == "report":
        if Path(os.path.abspath(args.md)) == Path(os.path.abspath(args.png)):
            raise UserError(f"--md and --png are the same file {str(args.md)!r}")
        _check_new_file(args.md, "--md", args)
        _check_new_file(args.png, "--png", args)
    elif args.mode == "run":
        if args.out is None:
            raise UserError("the method rows need --out FILE (the results JSON)")
        _check_new_file(args.out, "--out", args, replace=args.merge)
        if args.merge and args.out.exists():
            read_results(args.out, "--out")  # a file --merge cannot read fails now, not after the run
        if args.trace_out is not None:
            check_output_file(args.trace_out, what="--trace-out", inputs=[*_inputs(args), ("--out", args.out)])


def build_kg_only(args: Settings) -> None:
    """The KG-only artifact of ``--data``'s kb.txt, built in a temporary sibling of ``--build-kg-only`` and
    moved into place (an existing artifact there is replaced only with ``--overwrite``)."""
    import scipy.sparse as sp

    from kge.artifact import Artifact
    from kge.graph import load_metaqa

    kg = load_metaqa(args.data)
    obs, n, r = kg.train, len(kg.entities), len(kg.relations)
    m = sp.csr_matrix((np.ones(len(obs), np.float32), (obs[:, 1] * n + obs[:, 0], obs[:, 2])), shape=(r * n, n))
    m.sum_duplicates()
    m.data[:] = 1.0
    art = Artifact(entities=list(kg.entities), relations=list(kg.relations), matrices=m, observed=obs,
                   missing=np.zeros((0, 3), np.int64),
                   meta={"source": "metaqa kb.txt, observed edges only (weight 1), no link prediction"})
    with OutputFolder(args.build_kg_only, overwrite=args.overwrite, what="--build-kg-only", create_parents=True,
                      inputs=_inputs(args)) as tmp:
        art.save(tmp)
    print(f"wrote {args.build_kg_only}", file=sys.stderr)


def export(args: Settings) -> None:
    """The sampled questions as JSON lines: every question read first, then written atomically."""
    from engine.eval.metaqa import load_metaqa_questions

    lines = [json_line({"question": q.question, "path": list(q.relations), "answers": list(q.answers)}) + "\n"
             for hops in args.hops
             for q in load_metaqa_questions(args.data, hops=hops, limit=args.per_hop or None, seed=0)]
    write_output(args.export, "".join(lines), what="--export")
    print(f"wrote {len(lines):,} questions to {args.export}", file=sys.stderr)


def merge_results(old: dict, res: dict) -> dict:
    """``old``'s rows with those of the same (hops, method) replaced by ``res``'s, each new row placed after
    its hop's ``embedding`` row (or the hop's last row)."""
    new_keys = {(r["hops"], r["method"]) for r in res["runs"]}
    runs = [r for r in old["runs"] if (r["hops"], r["method"]) not in new_keys]
    for r in res["runs"]:  # after the same hop's old rows
        last = max((i for i, o in enumerate(runs) if o["hops"] == r["hops"]), default=len(runs) - 1)
        pos = next((i for i, o in enumerate(runs) if o["hops"] == r["hops"] and o["method"] == "embedding"), last)
        runs.insert(pos + 1, r)
    return {**old, "runs": runs}


@cli_main
def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.mode == "build_kg_only":
        build_kg_only(args)
    elif args.mode == "export":
        export(args)
    elif args.mode == "make_exemplars":
        make_exemplars(args)
    elif args.mode == "tune_exemplars":
        tune_exemplars(args)
    elif args.mode == "report":
        report(args.report, args.md, args.png)
    else:
        os.environ.setdefault("OMP_NUM_THREADS", "2")
        res = run(args)
        if args.merge and args.out is not None and args.out.is_file():
            res = merge_results(read_results(args.out, "--out"), res)
        write_output(args.out, json.dumps(res, indent=1), what="--out")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
