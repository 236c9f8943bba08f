"""MetaQA Hits@1 of the ask loop (engine.exec.ask) against its baselines; writes a JSON of the runs.

    python benchmarks/results/ask/run_metaqa.py --build-kg-only artifacts/metaqa-kgonly   # ~10 s
    python benchmarks/results/ask/run_metaqa.py --artifact artifacts/metaqa-kgonly --label "full KG" \\
        --per-hop 1000 --errors 0.2 0.5 --out benchmarks/results/ask/metaqa_full.json
    python benchmarks/results/ask/run_metaqa.py --report benchmarks/results/ask/metaqa_*.json   # tables + plot
    python benchmarks/results/ask/run_metaqa.py --export questions.jsonl --hops 2 --per-hop 100  # a questions file
    python benchmarks/results/ask/run_metaqa.py --artifact artifacts/metaqa-kgonly --make-exemplars \
        artifacts/metaqa-dev-exemplars.jsonl --split dev --per-hop 3000     # weakly supervised exemplars
    python benchmarks/results/ask/run_metaqa.py --artifact artifacts/metaqa-kgonly \
        --tune-exemplars artifacts/metaqa-dev-exemplars.jsonl              # k / weight on held-out dev exemplars
    python benchmarks/results/ask/run_metaqa.py --artifact artifacts/metaqa-drop50 --split dev --per-hop 300 \
        --labels artifacts/metaqa-dev-exemplars.jsonl --errors 0.2 --karpa-only --out /tmp/dev.json  # choose settings

Methods, on the same ``--per-hop`` test questions per hop (engine.eval.metaqa, seeded sample):

* ``embedding``: no LLM; embedding-only retrieval (KARPA-H with the question as the plan, per-hop
  cost AskSettings.length_penalty), the answers by the vote of the top candidate paths
  (AskSettings.vote_paths / vote_temperature); paths read as their relations' questions
  (llm_bridge.prompts.fallback_template, centred embeddings; ``--path-text names``: the relation names);
* ``karpa-eE``: the loop with the simulated planner/reasoner (llm_bridge.simulate_ask) over HTTP on
  127.0.0.1, plan error = reason error = E; paraphrased plans (synonym rate 0.5), one re-plan;
* ``embedding+exemplars (dev)`` (with ``--exemplars FILE``): the same, plus the kNN vote of exemplar
  questions (Asker(exemplars=...)); the exemplars come from ``--make-exemplars`` on the DEV split;
* ``gold-lf``: the executor on the gold logical form (engine.eval.metaqa's expression): the upper
  bound of the logic side.

``--split dev``: the same rows on weakly labelled DEV questions (the labels of ``--make-exemplars``, ``--labels``;
``--per-hop`` of them per hop, seed 100 + hops; no gold-lf row): where settings are chosen, never on test.
The karpa rows also say what the reasoner was shown (``candidate_stats``): the gold path among the candidates,
first, path 1's first answer right, the first answer picked by the LLM, candidates per question.

Hits@1: the first answer is a gold answer.  LLM calls and tokens are per question (the simulator
counts words as tokens); wall time per question includes retrieval, the executor and HTTP.
Explanations are off (not needed for Hits@1).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))


def run(args) -> dict:
    from engine.eval.metaqa import load_metaqa_questions
    from engine.exec.api import Engine
    from engine.exec.ask import Asker, AskSettings
    from llm_bridge.client import LLMClient
    from llm_bridge.config import LLMConfig
    from llm_bridge.karpa_loop import LLMPlanner, LLMReasoner
    from llm_bridge.simulate_ask import AskSimConfig, start_ask_server

    eng = Engine.load(args.artifact)
    ret = eng.retriever(encoder="minilm")
    from llm_bridge.prompts import fallback_template

    from engine.exec.ask import read_exemplars

    verbalizer = None if args.path_text == "names" else fallback_template
    overrides = json.loads(args.settings) if args.settings else {}
    if not isinstance(overrides, dict):
        raise SystemExit(f"error: --settings must be a JSON object of AskSettings fields, got {args.settings!r}")
    settings = AskSettings(explain=False, **(
        {} if args.length_penalty is None else {"length_penalty": args.length_penalty}), **overrides)
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
            qs = load_metaqa_questions(args.data, hops=hops, limit=args.per_hop, seed=0)
        if args.first:  # the first N of the same seeded --per-hop sample the other rows use
            qs = qs[: args.first]
        gold = [set(q.answers) for q in qs]
        texts = [q.question for q in qs]

        def score(results, method, seconds, extra=None):
            hits = [bool(r.answers) and r.answers[0].entity in g for r, g in zip(results, gold)]
            row = {"hops": hops, "method": method, "questions": len(qs), "hits@1": sum(hits) / len(qs),
                   "llm_calls": sum(r.llm_calls for r in results) / len(qs),
                   "tokens": sum(r.llm_tokens for r in results) / len(qs), "seconds": seconds / len(qs),
                   "fallbacks": sum(r.retrieval == "embedding" for r in results) / len(qs)}
            row.update(extra or {})
            out["runs"].append(row)
            print(json.dumps(row), flush=True)

        if not (args.exemplars_only or args.karpa_only):
            t = time.perf_counter()
            res = asker.ask(texts, progress=True)
            score(res, "embedding", time.perf_counter() - t)
        if ex_asker is not None:
            t = time.perf_counter()
            res = ex_asker.ask(texts, progress=True)
            score(res, "embedding+exemplars (dev)", time.perf_counter() - t, {"exemplars": str(args.exemplars)})
        for e in args.errors:
            server = start_ask_server(args.artifact, {q.question: q.relations for q in qs},
                                      AskSimConfig(plan_error=e, reason_error=e, synonym_rate=0.5))
            try:
                cfg = LLMConfig(base_url=server.base_url, model="sim", n=1, temperature=0.0, use_cache=False,
                                concurrency=8, max_retries=1, timeout_s=30.0)
                with LLMClient(cfg) as client:
                    t = time.perf_counter()
                    res = asker.ask(texts, planner=LLMPlanner(client), reasoner=LLMReasoner(client), progress=True)
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
                                reasoner=LLMReasoner(client, json_output=args.llm_ask_json), progress=True)
                score(res, f"karpa-{args.llm_model}", time.perf_counter() - t,
                      {"model": args.llm_model, "llm_url": args.llm_url, "llm_ask_json": args.llm_ask_json,
                       "warnings": warning_counts(res),
                       "selected_by_llm": sum(bool(r.answers) and r.answers[0].selected_by == "llm"
                                              for r in res) / len(qs),
                       "http": client.stats.to_json()})
            if args.trace_out:
                with open(args.trace_out, "a", encoding="utf-8") as f:
                    for r, g in zip(res, gold):
                        f.write(json.dumps({"hops": hops, "gold": sorted(g), **r.to_json()}, ensure_ascii=False,
                                           default=str) + "\n")
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
    from kgreason.errors import UserError

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
    from kgreason.errors import UserError

    f = Path(folder) / f"{hops}-hop" / f"{split}.txt"
    if not f.is_file():
        raise UserError(f"{f}: file not found")
    out = []
    for n, line in enumerate(f.read_text(encoding="utf-8").splitlines(), 1):
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

    eng = Engine.load(args.artifact)
    ret = eng.retriever(encoder="hashing")  # the graph only; no text is embedded here
    ents = eng.artifact.entities
    index = {n: i for i, n in enumerate(ents)}
    rel = ret.graph.relation_names
    stats = {}
    with open(args.make_exemplars, "w", encoding="utf-8") as f:
        for hops in args.hops:
            qs = read_split(Path(args.data), hops, args.split)
            if args.per_hop and args.per_hop < len(qs):
                keep = np.sort(np.random.default_rng(args.seed + hops).choice(len(qs), args.per_hop, replace=False))
                qs = [qs[i] for i in keep]
            st = {"questions": len(qs), "exact": 0, "jaccard": 0, "ambiguous": 0, "none": 0, "no_topic": 0}
            for q, topic, gold in progress_bar(qs, desc=f"exemplars {hops}-hop", unit="question"):
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
                f.write(json.dumps({"question": q, "path": [rel[x] for x in label], "hops": hops},
                                   ensure_ascii=False) + "\n")
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

    eng = Engine.load(args.artifact)
    ret = eng.retriever(encoder="minilm")
    rel_ids = {n: i for i, n in enumerate(ret.graph.relation_names)}
    ex = read_exemplars(args.tune_exemplars, eng.artifact.relations)
    rng = np.random.default_rng(args.seed)
    held = np.zeros(len(ex), bool)
    held[rng.choice(len(ex), len(ex) // 5, replace=False)] = True
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


def report(paths: list[str], md: Path, png: Path) -> None:
    data = [json.loads(Path(p).read_text()) for p in paths]
    lines = []
    for d in data:
        lines.append(f"\n### {d['label']} (`{d['artifact']}`, {d['per_hop']} test questions per hop)\n")
        lines.append("| method | hops | Hits@1 | LLM calls / q | tokens / q | ms / q | questions on embedding-only retrieval |")
        lines.append("|---|---|---|---|---|---|---|")
        for r in d["runs"]:
            mark = " (earlier run)" if r.get("rerun") is False else (" (history)" if r.get("history") else "")
            lines.append(f"| {r['method']}{mark} | {r['hops']} | {100 * r['hits@1']:.1f} | {r['llm_calls']:.2f} | "
                         f"{r['tokens']:.0f} | {1000 * r['seconds']:.1f} | {100 * r['fallbacks']:.1f}% |")
    md.write_text("\n".join(lines) + "\n", encoding="utf-8")
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
    fig.savefig(png, dpi=120)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--artifact")
    p.add_argument("--label", default="full")
    p.add_argument("--data", default=str(ROOT.parent / "shared" / "data" / "metaqa"))
    p.add_argument("--per-hop", type=int, default=1000)
    p.add_argument("--hops", type=int, nargs="+", default=[1, 2, 3])
    p.add_argument("--errors", type=float, nargs="*", default=[0.0, 0.2, 0.5],
                   help="simulated LLM error rates of the karpa rows (none: no karpa rows)")
    p.add_argument("--exemplars", metavar="FILE", help="also run embedding+exemplars (dev) with these exemplars")
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
    p.add_argument("--trace-out", metavar="FILE", help="append the --llm-url row's results (AskResult JSON) here")
    p.add_argument("--merge", action="store_true", help="--out exists: replace its rows of the same hops and "
                   "method with the new ones, keep the others")
    p.add_argument("--make-exemplars", metavar="OUT", help="write weakly supervised exemplars of --split to OUT")
    p.add_argument("--split", default=None, choices=("dev", "train", "test"),
                   help="--make-exemplars' split (dev or train, never test; default dev); for the method rows: "
                        "test (default) or dev, the weakly labelled dev questions of --labels (--per-hop of them "
                        "per hop, seed 100 + hops; no gold-lf row), the split to choose settings on")
    p.add_argument("--labels", metavar="FILE", default=str(ROOT / "artifacts" / "metaqa-dev-exemplars.jsonl"),
                   help="with --split dev: the weak labels (--make-exemplars' output; default %(default)s)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tune-exemplars", metavar="FILE", help="held-out top-path accuracy over --weights x --ks")
    p.add_argument("--weights", type=float, nargs="+", default=[0.0, 0.25, 0.5, 1.0, 2.0])
    p.add_argument("--ks", type=int, nargs="+", default=[1, 3, 10])
    p.add_argument("--out")
    p.add_argument("--path-text", choices=("questions", "names"), default="questions",
                   help="embedding-only retrieval's path text: relation questions (default) or relation names")
    p.add_argument("--length-penalty", type=float, default=None, help="AskSettings.length_penalty (default: its default)")
    p.add_argument("--settings", metavar="JSON", help='other AskSettings fields for every row, e.g. \'{"empty_variants": '
                   'true}\' (the karpa rows\' method names then end with it)')
    p.add_argument("--report", nargs="+")
    p.add_argument("--build-kg-only", metavar="DIR", help="write a KG-only artifact of MetaQA's kb.txt (observed "
                   "edges, weight 1, no training: the 'full KG' runs) to DIR and stop")
    p.add_argument("--export", metavar="FILE", help="write the sampled questions as JSON lines (question, path, "
                   "answers: what engine.ask --questions and llm_bridge.simulate_ask read) and stop")
    p.add_argument("--md", default=str(Path(__file__).with_name("metaqa_tables.md")))
    p.add_argument("--png", default=str(Path(__file__).with_name("metaqa.png")))
    args = p.parse_args()
    if args.build_kg_only:
        import numpy as np
        import scipy.sparse as sp

        from kge.artifact import Artifact
        from kge.graph import load_metaqa

        kg = load_metaqa(args.data)
        obs, n, r = kg.train, len(kg.entities), len(kg.relations)
        m = sp.csr_matrix((np.ones(len(obs), np.float32), (obs[:, 1] * n + obs[:, 0], obs[:, 2])), shape=(r * n, n))
        m.sum_duplicates()
        m.data[:] = 1.0
        Artifact(entities=list(kg.entities), relations=list(kg.relations), matrices=m, observed=obs,
                 missing=np.zeros((0, 3), np.int64),
                 meta={"source": "metaqa kb.txt, observed edges only (weight 1), no link prediction"}
                 ).save(args.build_kg_only)
        return 0
    if args.export:
        from engine.eval.metaqa import load_metaqa_questions

        with open(args.export, "w", encoding="utf-8") as f:
            for hops in args.hops:
                for q in load_metaqa_questions(args.data, hops=hops, limit=args.per_hop, seed=0):
                    f.write(json.dumps({"question": q.question, "path": list(q.relations), "answers": list(q.answers)},
                                       ensure_ascii=False) + "\n")
        return 0
    if args.make_exemplars:
        if args.split == "test":
            raise SystemExit("error: --make-exemplars never reads the test split (--split dev or train)")
        args.split = args.split or "dev"
        make_exemplars(args)
        return 0
    if args.tune_exemplars:
        tune_exemplars(args)
        return 0
    if args.report:
        report(args.report, Path(args.md), Path(args.png))
        return 0
    if args.split == "train":
        raise SystemExit("error: the method rows run on --split test or dev")
    os.environ.setdefault("OMP_NUM_THREADS", "2")
    res = run(args)
    if args.merge and Path(args.out).is_file():
        old = json.loads(Path(args.out).read_text())
        new_keys = {(r["hops"], r["method"]) for r in res["runs"]}
        runs = [r for r in old["runs"] if (r["hops"], r["method"]) not in new_keys]
        for r in res["runs"]:  # after the same hop's old rows
            last = max((i for i, o in enumerate(runs) if o["hops"] == r["hops"]), default=len(runs) - 1)
            pos = next((i for i, o in enumerate(runs) if o["hops"] == r["hops"] and o["method"] == "embedding"), last)
            runs.insert(pos + 1, r)
        old["runs"] = runs
        res = old
    Path(args.out).write_text(json.dumps(res, indent=1), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
