"""LGOT Table 1 on MetaQA: KG-only vs LLM-only vs LGOT on a 50%-edge KG, graded against MetaQA's gold answers.

::

    python -m kge.build --kg ../shared/data/metaqa --out artifacts/metaqa-drop50 --drop-edges 0.5 --seed 0 \\
        --train-minutes 6 --matrices auto
    python -m experiments.metaqa_lgot --artifact artifacts/metaqa-drop50 --metaqa ../shared/data/metaqa \\
        --per-hop 1000 --quality 0.5/0.2 0.9/0.05 --out benchmarks/results/lgot/

Protocol (LGOT's Table 1 on MetaQA): the engine's KG is the artifact (50% of
MetaQA's edges dropped when built with ``--drop-edges 0.5``); the questions
are ``--per-hop`` seeded samples of the 1-, 2- and 3-hop *test* questions
(:func:`engine.eval.metaqa.load_metaqa_questions`), each answered as its
exact engine expression (1p / 2p / 3p chains with MetaQA's topic exclusions).
Each method scores every entity; **Hits@k** of a question is 1 when one of
its gold answers is among the top ``k`` -- the expectation over the order of
tied scores (a tie straddling rank ``k`` counts the chance a gold answer is
drawn into the top ``k``), so no method gains from an id order.  Hits@k is
averaged over the questions of a hop.

Methods: **KG-only** (the executor, no hook), **LLM-only** and **LGOT**
(:class:`llm_bridge.lgot.LGOTHook`) against the simulated LLM of
:mod:`experiments.simulate`, which knows the artifact's *full* KG (observed +
missing), for every ``--quality RECALL/HALLUCINATION`` pair.  ``--messy``
(default on) makes it write names the way models do (lower case, a leading
"the", fences, prose), so linking matters.  Each run reports LGOT − KG-only per
hop and the hook's counters: ``nested`` counts projection rows asked with an
empty input (the hop the KG alone would have had nothing for, asked about the
previous sub-question), ``unlinked`` the answers that linked to no entity.

The LLM response cache (``--cache``, default ``artifacts/metaqa-lgot-cache.sqlite``)
keys each run by a model name carrying the simulator settings, so a rerun
replays every answer.

Outputs in ``--out`` (replaced only with ``--overwrite``): ``NAME.md``,
``NAME.json``, ``NAME.png`` (``NAME``: ``--name``, default ``metaqa``).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import platform
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from kgreason.cli import SEED_MAX, ArgumentParser, Settings, add_settings_arguments, same_setting, setting, settings_from_args
from kgreason.errors import UserError, cli_main
from kgreason.files import check_not_input, check_output_file, write_output
from llm_bridge.config import LGOTConfig

from .lgot_eval import check_name, jsonable
from .simulate import SimulatorConfig

__all__ = ["MetaQALGOTSettings", "MetaQAArgs", "parse_args", "run", "hits_at_k", "main", "PAPER"]

HITS = (1, 3, 10)
HOP_NAMES = {1: "1p", 2: "2p", 3: "3p"}
#: LGOT paper, Table 1, MetaQA with 50% of the KG, Hits@1 (%).
PAPER = {"QTO": {"1p": 61.4, "2p": 40.9, "3p": 44.9}, "ChatGPT": {"1p": 66.1, "2p": 45.4, "3p": 41.6},
         "LGOT": {"1p": 77.7, "2p": 58.7, "3p": 67.9}}
DEFAULT_QUALITY = ((0.3, 0.3), (0.5, 0.2), (0.7, 0.1), (0.9, 0.05))


def _quality(text: str) -> tuple[float, float]:
    """An argparse type: ``RECALL/HALLUCINATION`` (recall in [0, 1], hallucination in [0, 1), as the simulator's)."""
    parts = text.split("/")
    try:
        r, h = (float(p) for p in parts)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected RECALL/HALLUCINATION such as 0.5/0.2, got {text!r}") from None
    if not (math.isfinite(r) and 0 <= r <= 1 and math.isfinite(h) and 0 <= h < 1):
        raise argparse.ArgumentTypeError(f"expected recall in [0, 1] and hallucination in [0, 1), got {text!r}")
    return r, h


@dataclass(frozen=True, kw_only=True)
class MetaQALGOTSettings(Settings):
    """What ``python -m experiments.metaqa_lgot`` was asked to do; each field's flag is declared with it, the
    simulator's ``--noise`` and the bridge's ``--theta``/``--alpha``/``--merge``/``--input-ratio`` reused from
    :class:`SimulatorConfig` and :class:`~llm_bridge.config.LGOTConfig` (their defaults, ranges and checks)."""

    artifact: Path = setting(help="artifact of MetaQA's KB (LGOT: --drop-edges 0.5)")
    metaqa: Path = setting(help="MetaQA folder (kb.txt, {1,2,3}-hop/test.txt)")
    out: Path = setting(help="output folder (NAME.md, NAME.json, NAME.png)")
    per_hop: int = setting(1000, low=1, high=100_000, integer=True, help="test questions sampled per hop")
    hops: tuple[int, ...] = setting((1, 2, 3), choices=(1, 2, 3), nargs="+", help="question hops to run")
    seed: int = setting(0, low=0, high=SEED_MAX, integer=True, help="question sample and simulator seed")
    quality: tuple[tuple[float, float], ...] = setting(
        DEFAULT_QUALITY, type=_quality, metavar="R/H", shown_default=" ".join(f"{r:g}/{h:g}" for r, h in DEFAULT_QUALITY),
        help="simulated LLM qualities, recall/hallucination")
    noise: float = same_setting(SimulatorConfig, "noise", help="simulator --noise (consistency spread)")
    messy: bool = setting(True, flag="--no-messy", negate=True, help="the simulator writes exact names (default: messy)")
    theta: float = same_setting(LGOTConfig, "theta", flag="--theta", help="LGOT likelihood-ratio threshold")
    alpha: float = same_setting(LGOTConfig, "alpha", flag="--alpha", help="LGOT merge weight")
    merge: str = same_setting(LGOTConfig, "merge", flag="--merge", help="LGOT merge rule")
    input_ratio: float = same_setting(LGOTConfig, "input_ratio", flag="--input-ratio", metavar=None,
                                      help="LGOT: an entity feeds the next prompt only at >= this times the row's "
                                           "best value (0 = the plain top 10)")
    samples: int = setting(6, low=1, high=32, integer=True, help="LLM samples per prompt, n")
    batch_size: int = setting(64, low=1, high=4096, integer=True, help="questions per executor batch")
    cache: Path = setting(Path("artifacts/metaqa-lgot-cache.sqlite"),
                          help="LLM response cache (SQLite); reruns replay from it")
    name: str = setting("metaqa", check=check_name,
                        help="output name prefix: a plain name, the files are OUT/NAME.{md,json,png}")
    quiet: bool = setting(False, help="no progress bars or log lines")
    overwrite: bool = setting(False, help="replace existing outputs")
    extra: dict = field(default_factory=dict)  # no flag: what a caller adds to the record


#: The former name (before the settings rule, docs/cli.md "Settings classes").
MetaQAArgs = MetaQALGOTSettings


def _parser() -> ArgumentParser:
    p = ArgumentParser(prog="python -m experiments.metaqa_lgot",
                       description="LGOT Table 1 on MetaQA: KG-only, LLM-only and LGOT (simulated LLM), Hits@1/3/10 "
                                   "per hop.")
    add_settings_arguments(p, MetaQALGOTSettings)
    return p


def parse_args(argv: Sequence[str] | None = None) -> MetaQALGOTSettings:
    """The settings of ``argv`` (each field's range and check), then the input folders."""
    a = settings_from_args(MetaQALGOTSettings, _parser().parse_args(argv))
    if not (a.metaqa / "kb.txt").is_file():
        raise UserError(f"--metaqa {a.metaqa}: no kb.txt there (a MetaQA folder)")
    if not (a.artifact / "meta.json").is_file():
        raise UserError(f"--artifact {a.artifact}: not an artifact folder (no meta.json)")
    return dataclasses.replace(a, hops=tuple(sorted(set(a.hops))))


# ------------------------------------------------------------------------------------------ grading
def hits_at_k(scores: np.ndarray, gold: Sequence[int], k: int) -> float:
    """Expected Hits@k of one score row: P(a gold id is among the top ``k``), ties broken uniformly at random.

    ``scores``: (N,) float; ``gold``: entity ids.  Entities above the k-th
    largest score are in; of the ``T`` entities tied at it, ``k - above`` are
    drawn: with ``g`` gold among them the chance none is drawn is
    ``C(T - g, m) / C(T, m)``.
    """
    n = len(scores)
    k = min(k, n)
    gold = np.unique(np.asarray(gold, dtype=np.int64))
    if len(gold) == 0:
        return 0.0
    kth = np.partition(scores, n - k)[n - k]  # the k-th largest value
    above = int(np.count_nonzero(scores > kth))
    g_scores = scores[gold]
    if np.any(g_scores > kth):
        return 1.0
    g_tied = int(np.count_nonzero(g_scores == kth))
    if g_tied == 0:
        return 0.0
    tied = int(np.count_nonzero(scores == kth))
    m = k - above
    # P(no gold drawn) = prod_{i<m} (T - g - i) / (T - i)
    miss = 1.0
    for i in range(m):
        if tied - g_tied - i <= 0:
            miss = 0.0
            break
        miss *= (tied - g_tied - i) / (tied - i)
    return 1.0 - miss


def _grade(executor, nodes, gold: list[np.ndarray], *, batch_size: int, desc: str, quiet: bool) -> dict[str, Any]:
    """Per-question Hits@k of ``executor`` (hooks included) and whether its answer set is empty."""
    hits = {k: np.zeros(len(nodes)) for k in HITS}
    empty = np.zeros(len(nodes), dtype=bool)
    t0 = time.perf_counter()
    bar = None
    if not quiet:
        from kgreason.progress import progress_bar

        bar = progress_bar(total=len(nodes), desc=desc, unit="q", leave=False, file=sys.stderr)
    for item in executor.iter_scores(nodes, batch_size=batch_size):
        idx, y = item[0], item[1]
        ys = y.detach().cpu().numpy()
        for row, q in enumerate(idx):
            s = ys[row]
            empty[q] = not bool(np.any(s > 0))
            for k in HITS:
                hits[k][q] = hits_at_k(s, gold[q], k)
        if bar is not None:
            bar.update(len(idx))
    if bar is not None:
        bar.close()
    return {"hits": hits, "empty": empty, "wall_s": time.perf_counter() - t0}


def _summary(graded: dict[str, Any], hops: np.ndarray) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for h in sorted(set(hops.tolist())):
        sel = hops == h
        out[HOP_NAMES[h]] = {**{f"hits@{k}": 100.0 * float(graded["hits"][k][sel].mean()) for k in HITS},
                             "questions": int(sel.sum()), "empty_answer": int(graded["empty"][sel].sum())}
    return out


class _EmptyInputs:
    """A read-only hook (returns None): per question, the projection hops whose input has no entity > 0."""

    name = "count-empty-inputs"

    def __init__(self, count: int) -> None:
        self.hops = np.zeros(count, dtype=np.int64)  # projection rows per question
        self.empty = np.zeros(count, dtype=np.int64)  # of those, with an empty input

    def __call__(self, ctx, value):
        empty = (ctx.inputs[0].values > 0).sum(dim=1).eq(0).cpu().numpy()
        for row, q in enumerate(ctx.query_indices):
            self.hops[q] += 1
            self.empty[q] += int(empty[row])
        return None


def _kg_empty_inputs(executor, nodes, hops: np.ndarray, *, batch_size: int) -> dict[str, Any]:
    """How many projection hops the KG alone leaves with an empty input (what LGOT asks the LLM anyway)."""
    counter = _EmptyInputs(len(nodes))
    ex = executor.without_hooks()
    ex.add_hook(counter, ops=("p", "np"))
    for _ in ex.iter_scores(nodes, batch_size=batch_size):
        pass
    out = {}
    for h in sorted(set(hops.tolist())):
        sel = hops == h
        out[HOP_NAMES[h]] = {"projection_hops": int(counter.hops[sel].sum()),
                             "empty_input_hops": int(counter.empty[sel].sum()),
                             "questions_with_an_empty_hop": int((counter.empty[sel] > 0).sum())}
    return out


# ---------------------------------------------------------------------------------------------- run
def _log(args: MetaQAArgs, msg: str) -> None:
    if not args.quiet:
        print(msg, file=sys.stderr, flush=True)


def _model_name(args: MetaQAArgs, r: float, h: float, method: str) -> str:
    messy = "-messy" if args.messy else ""
    return (f"sim-{args.name}-r{r:g}-h{h:g}-n{args.noise:g}-s{args.seed}{messy}-{method}-t{args.theta:g}"
            f"-a{args.alpha:g}-{args.merge}")


def run(args: MetaQAArgs, on_quality=None) -> dict[str, Any]:
    """Sample and convert the questions, grade KG-only once and LLM-only + LGOT per quality; the JSON record.

    ``on_quality(record)``, when given, is called after each quality with the record so far
    (``main`` writes the outputs then, so a long run keeps what it measured).
    """
    import torch

    from engine.eval.metaqa import load_metaqa_questions
    from engine.exec.executor import Executor
    from engine.lang.query import resolve
    from kge.artifact import Artifact
    from llm_bridge.client import LLMClient
    from llm_bridge.config import LLMConfig
    from llm_bridge.lgot import LGOTHook, LGOTSettings
    from llm_bridge.linking import EntityLinker
    from llm_bridge.relations import RelationQuestions
    from experiments.simulate import KnowledgeBase, SimulatorConfig, start_server

    t_start = time.perf_counter()
    torch.manual_seed(args.seed)
    artifact = Artifact.load(args.artifact, verify=True, load_embeddings=False)
    questions = load_metaqa_questions(args.metaqa, hops=args.hops, limit=args.per_hop, seed=args.seed)
    ent = artifact._entity_index
    nodes, gold = [], []
    for q in questions:
        missing = [n for n in (q.topic, *q.answers) if n not in ent]
        if missing:
            raise UserError(f"{args.metaqa}/{q.hops}-hop/test.txt:{q.line}: {missing[0]!r} is not an entity of "
                            f"--artifact {args.artifact} (was it built from this MetaQA folder?)")
        nodes.append(resolve(q.node, artifact, where=f"{q.hops}-hop/test.txt:{q.line}"))
        gold.append(np.array(sorted({ent[a] for a in q.answers}), dtype=np.int64))
    hops = np.array([q.hops for q in questions])
    _log(args, f"{len(questions)} questions ({', '.join(f'{HOP_NAMES[h]} {int((hops == h).sum())}' for h in args.hops)})")
    executor = Executor(artifact)
    meta = artifact.meta
    record: dict[str, Any] = {
        "name": args.name, "artifact": str(args.artifact), "metaqa": str(args.metaqa),
        "dataset": {"entities": artifact.num_entities, "relations": artifact.num_relations,
                    "observed": int(len(artifact.observed)), "missing": int(len(artifact.missing)),
                    "drop_edges": meta.get("build_config", {}).get("drop_edges"),
                    "build": {k: meta.get("build_config", {}).get(k) for k in ("train_minutes", "matrices", "seed")}},
        "questions": {"per_hop_requested": args.per_hop, "seed": args.seed,
                      "counts": {HOP_NAMES[h]: int((hops == h).sum()) for h in args.hops},
                      "gold_mean": {HOP_NAMES[h]: float(np.mean([len(g) for g, x in zip(gold, hops) if x == h]))
                                    for h in args.hops}},
        "settings": {"theta": args.theta, "alpha": args.alpha, "merge": args.merge, "input_ratio": args.input_ratio, "samples": args.samples,
                     "noise": args.noise, "messy": args.messy, "relation_questions": "fallback"},
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
                    "torch": torch.__version__, "torch_threads": torch.get_num_threads()},
    }
    kg = _grade(executor, nodes, gold, batch_size=args.batch_size, desc="kg-only", quiet=args.quiet)
    record["kg_only"] = {"hops": _summary(kg, hops), "wall_s": kg["wall_s"]}
    _log(args, f"kg-only: {_fmt(record['kg_only']['hops'])} ({kg['wall_s']:.0f} s)")
    record["kg_only"]["empty_inputs"] = _kg_empty_inputs(executor, nodes, hops, batch_size=args.batch_size)
    kb = KnowledgeBase.from_artifact(args.artifact)
    linker = EntityLinker.from_artifact(artifact, threshold=LGOTSettings().link_threshold)
    rq = RelationQuestions(relations=list(artifact.relations))
    runs = []
    for r, h in args.quality:
        srv = start_server(kb, SimulatorConfig(recall=r, hallucination=h, noise=args.noise, seed=args.seed,
                                               messy=args.messy))
        try:
            for method in ("llm-only", "lgot"):
                settings = LGOTSettings(mode=method, theta=args.theta, alpha=args.alpha, merge=args.merge,
                                        input_ratio=args.input_ratio, relation_questions="fallback")
                config = LLMConfig(base_url=srv.base_url, model=_model_name(args, r, h, method), n=args.samples,
                                   cache_path=args.cache, timeout_s=30, backoff_s=0.05)
                with LLMClient(config) as client:
                    hook = LGOTHook(client=client, artifact=artifact, settings=settings, questions=rq, linker=linker)
                    ex = executor.without_hooks()  # a twin sharing the prepared matrices
                    ex.add_hook(hook)
                    graded = _grade(ex, nodes, gold, batch_size=args.batch_size,
                                    desc=f"{method} r={r:g} h={h:g}", quiet=args.quiet)
                    st = client.stats
                res = {"method": method, "recall": r, "hallucination": h, "hops": _summary(graded, hops),
                       "wall_s": graded["wall_s"],
                       "hook": {k: v for k, v in hook.stats.to_json().items() if k != "relation_questions"},
                       "client": {"prompts": st.calls, "requests": st.requests, "cache_hits": st.cache_hits,
                                  "failures": st.failures, "tokens": st.total_tokens}}
                if method == "lgot":
                    res["minus_kg_only"] = {hn: {m: res["hops"][hn][m] - record["kg_only"]["hops"][hn][m]
                                                 for m in (f"hits@{k}" for k in HITS)} for hn in res["hops"]}
                    # Questions LGOT answered where the KG alone had no answer at all.
                    res["rescued"] = {HOP_NAMES[x]: int(((hops == x) & kg["empty"] & (graded["hits"][1] > 0)).sum())
                                      for x in args.hops}
                runs.append(res)
                _log(args, f"{method} r={r:g} h={h:g}: {_fmt(res['hops'])}; nested {hook.stats.nested}, "
                           f"unlinked {hook.stats.unlinked} ({graded['wall_s']:.0f} s)")
        finally:
            srv.stop()
        record["runs"] = runs
        record["total_wall_s"] = time.perf_counter() - t_start
        if on_quality is not None:
            on_quality(record)
    record["runs"] = runs
    record["total_wall_s"] = time.perf_counter() - t_start
    return record


def _fmt(hops: dict) -> str:
    return ", ".join(f"{hn} H@1 {v['hits@1']:.1f}" for hn, v in hops.items())


# ------------------------------------------------------------------------------------------ outputs
def markdown(record: dict, command: str) -> str:
    hn = list(record["kg_only"]["hops"])
    L = [f"# LGOT Table 1 on MetaQA ({record['name']})", "",
         f"Command: `{command}`", "",
         f"KG: `{record['artifact']}` ({record['dataset']['entities']:,} entities, "
         f"{record['dataset']['observed']:,} observed / {record['dataset']['missing']:,} missing edge directions; "
         f"drop {record['dataset']['drop_edges']}).  Questions: "
         + ", ".join(f"{k} {v}" for k, v in record["questions"]["counts"].items())
         + f" (seeded sample of the test split, seed {record['questions']['seed']}).  Simulated LLM: answers from the "
         f"full KB, {record['settings']['samples']} samples per prompt, noise {record['settings']['noise']}, "
         f"{'messy surface forms' if record['settings']['messy'] else 'exact names'}.  LGOT: theta "
         f"{record['settings']['theta']}, alpha {record['settings']['alpha']}, merge {record['settings']['merge']}, "
         f"input ratio {record['settings'].get('input_ratio', 0.0)}.", "",
         "## Hits@1 / Hits@3 / Hits@10 (%)", "",
         "| method | recall/halluc. | " + " | ".join(f"{h} H@1 | {h} H@3 | {h} H@10" for h in hn) + " |",
         "|---|---|" + "---|" * (3 * len(hn))]

    def row(name: str, q: str, hops: dict) -> str:
        return f"| {name} | {q} | " + " | ".join(f"{hops[h]['hits@1']:.1f} | {hops[h]['hits@3']:.1f} | "
                                                 f"{hops[h]['hits@10']:.1f}" for h in hn) + " |"

    L.append(row("KG-only", "-", record["kg_only"]["hops"]))
    for r in record["runs"]:
        L.append(row(r["method"], f"{r['recall']:g}/{r['hallucination']:g}", r["hops"]))
    L += ["", "## LGOT − KG-only (Hits@1 points, same questions) and the hops asked with an empty input", "",
          "| recall/halluc. | " + " | ".join(f"{h} Δ H@1" for h in hn)
          + " | nested asks | skipped | unlinked answers | rescued (KG empty, LGOT H@1) |",
          "|---|" + "---|" * (len(hn) + 4)]
    for r in record["runs"]:
        if r["method"] != "lgot":
            continue
        L.append(f"| {r['recall']:g}/{r['hallucination']:g} | "
                 + " | ".join(f"{r['minus_kg_only'][h]['hits@1']:+.1f}" for h in hn)
                 + f" | {r['hook']['nested']:,} | {r['hook']['skipped']:,} | {r['hook']['unlinked']:,} | "
                 + ", ".join(f"{h} {v}" for h, v in r["rescued"].items()) + " |")
    ei = record["kg_only"].get("empty_inputs", {})
    if ei:
        L += ["", "Projection hops whose input the KG alone leaves empty (LGOT asks every one of them: with the "
              "LLM's linked answers of the hop below as input, or, when those are empty too, the nested question): "
              + "; ".join(f"{h} {v['empty_input_hops']:,} of {v['projection_hops']:,} hops, in "
                          f"{v['questions_with_an_empty_hop']:,} questions" for h, v in ei.items()) + "."]
    L += ["", "KG-only questions with no answer at all: "
          + ", ".join(f"{h} {v['empty_answer']} of {v['questions']}" for h, v in record["kg_only"]["hops"].items())
          + ".", "",
          "## Paper anchors (LGOT, Table 1, MetaQA with 50% of the KG, Hits@1)", "",
          "| method | " + " | ".join(hn) + " |", "|---|" + "---|" * len(hn)]
    for name, vals in PAPER.items():
        L.append(f"| {name} (paper) | " + " | ".join(f"{vals.get(h, float('nan')):.1f}" for h in hn) + " |")
    L += ["", f"Total wall time {record['total_wall_s']:.0f} s on {record['machine']['cpus']} CPUs "
              f"(torch {record['machine']['torch']}, {record['machine']['torch_threads']} threads).", ""]
    return "\n".join(L)


def plot(record: dict) -> bytes:
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    hn = list(record["kg_only"]["hops"])
    quals = sorted({(r["recall"], r["hallucination"]) for r in record["runs"]})
    fig, axes = plt.subplots(1, len(hn), figsize=(4.2 * len(hn), 3.6), sharey=True)
    axes = np.atleast_1d(axes)
    x = np.arange(len(quals))
    for ax, h in zip(axes, hn):
        for method, style in (("llm-only", "s--"), ("lgot", "o-")):
            ys = [next(r["hops"][h]["hits@1"] for r in record["runs"] if r["method"] == method
                       and (r["recall"], r["hallucination"]) == q) for q in quals]
            ax.plot(x, ys, style, label=method)
        ax.axhline(record["kg_only"]["hops"][h]["hits@1"], color="k", lw=1, label="KG-only")
        for name, color in (("QTO", "tab:gray"), ("LGOT", "tab:red"), ("ChatGPT", "tab:purple")):
            if h in PAPER[name]:
                ax.axhline(PAPER[name][h], color=color, ls=":", lw=1, label=f"{name} (paper)")
        ax.set_xticks(x, [f"{r:g}/{hh:g}" for r, hh in quals])
        ax.set_xlabel("simulated LLM recall/hallucination")
        ax.set_title(f"MetaQA {h}, 50% KG")
        ax.set_ylim(0, 100)
    axes[0].set_ylabel("Hits@1 (%)")
    axes[-1].legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    return buf.getvalue()


@cli_main
def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    paths = {ext: args.out / f"{args.name}.{ext}" for ext in ("md", "json", "png")}
    inputs = [("--artifact", args.artifact), ("--metaqa", args.metaqa)]
    check_not_input(args.cache, what="--cache", inputs=inputs)  # the cache is written: never into an input
    for p in paths.values():
        check_output_file(p, what="--out", inputs=inputs)
        if p.exists() and not args.overwrite:
            raise UserError(f"--out: {p} exists (pass --overwrite to replace it)")
    command = "python -m experiments.metaqa_lgot " + " ".join(argv)

    def save(record: dict) -> None:
        write_output(paths["json"], json.dumps(jsonable(record), indent=1, allow_nan=False) + "\n")
        write_output(paths["md"], markdown(record, command))
        write_output(paths["png"], plot(record))

    record = run(args, on_quality=save)
    save(record)
    print(f"wrote {paths['md']}, {paths['json']}, {paths['png']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
