"""MetaQA Hits@1 of the ask loop (engine.exec.ask) against its baselines; writes a JSON of the runs.

    python benchmarks/results/ask/run_metaqa.py --build-kg-only artifacts/metaqa-kgonly   # ~10 s
    python benchmarks/results/ask/run_metaqa.py --artifact artifacts/metaqa-kgonly --label "full KG" \\
        --per-hop 1000 --errors 0.2 0.5 --out benchmarks/results/ask/metaqa_full.json
    python benchmarks/results/ask/run_metaqa.py --report benchmarks/results/ask/metaqa_*.json   # tables + plot
    python benchmarks/results/ask/run_metaqa.py --export questions.jsonl --hops 2 --per-hop 100  # a questions file

Methods, on the same ``--per-hop`` test questions per hop (engine.eval.metaqa, seeded sample):

* ``embedding``: no LLM; embedding-only retrieval (KARPA-H with the question as the plan, per-hop
  cost AskSettings.length_penalty), the best path's answers; paths read as their relations' questions
  (llm_bridge.prompts.fallback_template, centred embeddings; ``--path-text names``: the relation names);
* ``karpa-eE``: the loop with the simulated planner/reasoner (llm_bridge.simulate_ask) over HTTP on
  127.0.0.1, plan error = reason error = E; paraphrased plans (synonym rate 0.5), one re-plan;
* ``gold-lf``: the executor on the gold logical form (engine.eval.metaqa's expression): the upper
  bound of the logic side.

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
from pathlib import Path

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

    asker = Asker(eng, ret, settings=AskSettings(explain=False, **(
                      {} if args.length_penalty is None else {"length_penalty": args.length_penalty})),
                  verbalizer=None if args.path_text == "names" else fallback_template)
    out = {"artifact": str(args.artifact), "label": args.label, "per_hop": args.per_hop, "runs": []}
    for hops in args.hops:
        qs = load_metaqa_questions(args.data, hops=hops, limit=args.per_hop, seed=0)
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

        t = time.perf_counter()
        res = asker.ask(texts, progress=True)
        score(res, "embedding", time.perf_counter() - t)
        for e in args.errors:
            server = start_ask_server(args.artifact, {q.question: q.relations for q in qs},
                                      AskSimConfig(plan_error=e, reason_error=e, synonym_rate=0.5))
            try:
                cfg = LLMConfig(base_url=server.base_url, model="sim", n=1, temperature=0.0, use_cache=False,
                                concurrency=8, max_retries=1, timeout_s=30.0)
                with LLMClient(cfg) as client:
                    t = time.perf_counter()
                    res = asker.ask(texts, planner=LLMPlanner(client), reasoner=LLMReasoner(client), progress=True)
                    score(res, f"karpa-e{e:g}", time.perf_counter() - t, {"error": e})
            finally:
                server.stop()
        t = time.perf_counter()
        rs = eng.executor.answer(eng.queries([q.expression for q in qs]), k=1, explain=False)
        secs = time.perf_counter() - t
        hits = [bool(r.answers) and r.answers[0].entity in g for r, g in zip(rs, gold)]
        row = {"hops": hops, "method": "gold-lf", "questions": len(qs), "hits@1": sum(hits) / len(qs),
               "llm_calls": 0.0, "tokens": 0.0, "seconds": secs / len(qs), "fallbacks": 0.0}
        out["runs"].append(row)
        print(json.dumps(row), flush=True)
    return out


def report(paths: list[str], md: Path, png: Path) -> None:
    data = [json.loads(Path(p).read_text()) for p in paths]
    lines = []
    for d in data:
        lines.append(f"\n### {d['label']} (`{d['artifact']}`, {d['per_hop']} test questions per hop)\n")
        lines.append("| method | hops | Hits@1 | LLM calls / q | tokens / q | ms / q | questions on embedding-only retrieval |")
        lines.append("|---|---|---|---|---|---|---|")
        for r in d["runs"]:
            mark = " (earlier run)" if r.get("rerun") is False else ""
            lines.append(f"| {r['method']}{mark} | {r['hops']} | {100 * r['hits@1']:.1f} | {r['llm_calls']:.2f} | "
                         f"{r['tokens']:.0f} | {1000 * r['seconds']:.1f} | {100 * r['fallbacks']:.1f}% |")
    md.write_text("\n".join(lines) + "\n", encoding="utf-8")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(data), figsize=(6 * len(data), 4), squeeze=False)
    for ax, d in zip(axes[0], data):
        methods = list(dict.fromkeys(r["method"] for r in d["runs"]))
        hops = sorted({r["hops"] for r in d["runs"]})
        w = 0.8 / len(methods)
        for i, m in enumerate(methods):
            ys = [next((100 * r["hits@1"] for r in d["runs"] if r["method"] == m and r["hops"] == h), 0) for h in hops]
            ax.bar([h + (i - (len(methods) - 1) / 2) * w for h in hops], ys, w, label=m)
        ax.set_xticks(hops, [f"{h}-hop" for h in hops])
        ax.set_ylabel("Hits@1 (%)")
        ax.set_ylim(0, 115)  # room for the legend above the bars
        ax.set_yticks(range(0, 101, 20))
        ax.set_title(f"MetaQA, {d['label']}")
        ax.legend(fontsize=7, loc="upper center", ncol=len(methods))
    fig.tight_layout()
    fig.savefig(png, dpi=120)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--artifact")
    p.add_argument("--label", default="full")
    p.add_argument("--data", default=str(ROOT.parent / "shared" / "data" / "metaqa"))
    p.add_argument("--per-hop", type=int, default=1000)
    p.add_argument("--hops", type=int, nargs="+", default=[1, 2, 3])
    p.add_argument("--errors", type=float, nargs="+", default=[0.0, 0.2, 0.5])
    p.add_argument("--out")
    p.add_argument("--path-text", choices=("questions", "names"), default="questions",
                   help="embedding-only retrieval's path text: relation questions (default) or relation names")
    p.add_argument("--length-penalty", type=float, default=None, help="AskSettings.length_penalty (default: its default)")
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
    if args.report:
        report(args.report, Path(args.md), Path(args.png))
        return 0
    os.environ.setdefault("OMP_NUM_THREADS", "2")
    res = run(args)
    Path(args.out).write_text(json.dumps(res, indent=1), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
