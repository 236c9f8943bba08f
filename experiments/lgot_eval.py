"""Experiment: KG-only vs LLM-only vs LGOT on a KG with edges dropped, graded against the full KG.

::

    python -m kge.build --kg umls --out /tmp/umls-drop50 --drop-edges 0.5 --seed 0
    python -m experiments.lgot_eval --artifact /tmp/umls-drop50 --structures 1p 2p 3p 2i 2u pin \\
        --per-structure 300 --out benchmarks/results/lgot/
    # a real OpenAI-compatible server instead of the simulator grid:
    python -m experiments.lgot_eval --artifact /tmp/umls-drop50 --structures 1p 2p --per-structure 100 \\
        --theta 0 0.3 --llm-base-url http://127.0.0.1:8080/v1 --llm-model SmolLM2 --out benchmarks/results/lgot/

Protocol (BetaE's, :mod:`engine.eval`): queries are sampled from the artifact
(:func:`engine.eval.sampling.sample_queries`) so that every query has at least
one *hard* answer, i.e. an answer on the full KG (``observed`` + ``missing``)
that the observed graph does not reach.  Each method scores every entity; each
hard answer is ranked among the non-answers (easy and other hard answers are
filtered out, :func:`engine.eval.metrics.rank_batch`), ties counted at their
average position; Hits@k and MRR are averaged per query, then per structure,
and the headline is the mean over structures.  One query set serves every
configuration.

Methods: **KG-only** (the executor, no hook; computed once), **LLM-only** and
**LGOT** (:class:`llm_bridge.lgot.LGOTHook` in ``"llm-only"`` / ``"lgot"``
mode).  Simulator mode (default) runs LLM-only and LGOT for every (recall,
hallucination, theta, alpha) of the grid against the simulated LLM of
:mod:`experiments.simulate`, started in this process on 127.0.0.1 with a fixed
seed; its knowledge is the artifact's *full* KG.  Server mode
(``--llm-base-url``) evaluates one OpenAI-compatible server instead, for each
theta and alpha.

Costs per run: prompts (LLM calls), HTTP requests, prompt/completion tokens,
cache hits, wall time per query.  The relation-question templates (LGOT §3.1)
are asked once before the runs (``setup`` in the JSON) and shared by every run.
The first LGOT run is repeated with the same cache (``replay``): every answer
then comes from the SQLite cache.

Outputs in ``--out`` (replaced only with ``--overwrite``): ``NAME_sim.{md,json,png}``
or ``NAME_server_MODEL.{md,json,png}`` (``NAME``: ``--name``, default the
artifact folder's name).
"""
from __future__ import annotations

import contextlib
import io
import os
import platform
import re
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from kgreason.cli import (SEED_MAX, ArgumentParser, Settings, add_settings_arguments, check_device, same_setting, setting,
                          settings_from_args, verify_setting)
from kgreason.errors import UserError, cli_main, unknown_name
from kgreason.files import check_not_input, check_output_file, write_output
from kgreason.text import json_line
from llm_bridge.config import LGOTConfig, LGOTSettings

from .simulate import SimulatorConfig

__all__ = ["LGOTEvalSettings", "LGOTEvalConfig", "ExperimentArgs", "check_name", "parse_args", "main", "run_experiment", "evaluate_method", "chance_hits",
           "sim_model_name", "output_paths", "DEFAULT_STRUCTURES"]

DEFAULT_STRUCTURES = ("1p", "2p", "3p", "2i", "2u", "pin")
DEFAULT_RECALL = (0.2, 0.5, 0.9)
DEFAULT_HALLUCINATION = (0.0, 0.2, 0.5)
DEFAULT_THETA = (LGOTSettings.theta,)  # the bridge's defaults (llm_bridge.config)
DEFAULT_ALPHA = (LGOTSettings.alpha,)
HITS = (1, 3, 10)
TIE = "average"  # headline tie rule (BetaE's argsort on average); all three are in the JSON
METHODS = ("kg-only", "llm-only", "lgot")


@dataclass(frozen=True)
class LGOTEvalConfig:
    """Everything the experiment was asked to do, resolved (:func:`parse_args` of :class:`LGOTEvalSettings`:
    the simulator grid's defaults filled in, the LLM client's configuration built)."""

    artifact: Path
    out: Path
    structures: tuple[str, ...] = DEFAULT_STRUCTURES
    per_structure: int = 300
    seed: int = 0
    recall: tuple[float, ...] = DEFAULT_RECALL
    hallucination: tuple[float, ...] = DEFAULT_HALLUCINATION
    noise: float = 0.1
    theta: tuple[float, ...] = DEFAULT_THETA
    alpha: tuple[float, ...] = DEFAULT_ALPHA
    answer_check: int = 0
    batch_size: int = 64
    max_answers: int = 100
    relation_questions: str = "llm"
    name: str = ""
    replay: bool = True
    sim_latency_ms: float = 0.0
    device: str = "cpu"
    quiet: bool = False
    overwrite: bool = False
    llm: Any = None  # llm_bridge.config.LLMConfig: the client's settings (base_url set = server mode)
    server: bool = False
    questions_dir: Path | None = None
    verify: bool = True  # False: --skip-artifact-checksums

    @property
    def mode(self) -> str:
        return "server" if self.server else "sim"


#: The former name of :class:`LGOTEvalConfig` (settings classes are named by docs/cli.md's rule).
ExperimentArgs = LGOTEvalConfig


@dataclass(frozen=True, kw_only=True)
class LGOTEvalSettings(Settings):
    """What ``python -m experiments.lgot_eval``'s flags (besides the client's ``--llm-*``) parse into; each
    field's flag is declared with it, the simulator's and the bridge's reused from :class:`SimulatorConfig`
    and :class:`~llm_bridge.config.LGOTConfig`.  ``--recall``/``--hallucination``/``--noise``/``--name`` are
    None when not given (the simulator's flags cannot be combined with ``--llm-base-url``)."""

    artifact: Path = setting(metavar="DIR",
                             help="artifact folder built with --drop-edges (its missing.tsv holds the dropped edges)")
    out: Path = setting(metavar="DIR",
                        help="folder for NAME_sim.{md,json,png} / NAME_server_MODEL.{md,json,png} (created if missing)")
    structures: tuple[str, ...] = setting(DEFAULT_STRUCTURES, metavar="S", help="query structures")
    per_structure: int = setting(300, low=1, integer=True, metavar="N", help="queries per structure")
    seed: int = setting(0, low=0, high=SEED_MAX, integer=True, help="query sampling and simulator seed, 0 to 2**32-1")
    recall: tuple[float, ...] | None = same_setting(
        SimulatorConfig, "recall", default=None, nargs="+", metavar="R",
        shown_default=" ".join(f"{x:g}" for x in DEFAULT_RECALL), help="simulated LLM recall values")
    hallucination: tuple[float, ...] | None = same_setting(
        SimulatorConfig, "hallucination", default=None, nargs="+", metavar="H",
        shown_default=" ".join(f"{x:g}" for x in DEFAULT_HALLUCINATION),
        help="simulated LLM hallucination rates in [0, 1)")
    noise: float | None = same_setting(SimulatorConfig, "noise", default=None, metavar="S", shown_default="0.1",
                                       help="simulated LLM per-answer recall noise")
    theta: tuple[float, ...] = same_setting(LGOTConfig, "theta", default=DEFAULT_THETA, flag="--theta", nargs="+",
                                            help="likelihood-ratio filter thresholds (e.g. 0 0.3 to compare)")
    alpha: tuple[float, ...] = same_setting(LGOTConfig, "alpha", default=DEFAULT_ALPHA, flag="--alpha", nargs="+",
                                            help="LGOT merge weights: T[e] = max(T[e], A*p(e))")
    answer_check: int = same_setting(
        LGOTConfig, "answer_check", flag="--answer-check",
        help="LGOT's answer check: ask about the top K (<= 10) entities of every projection and scale the "
             f"rejected ones by {LGOTConfig.check_penalty:g} (LGOTConfig.answer_check)")
    batch_size: int = setting(64, low=1, integer=True, metavar="N",
                              help="queries per executor batch, i.e. per round of LLM calls")
    max_answers: int = setting(100, low=1, integer=True, metavar="N",
                               help="sampler: skip queries with more answers (easy + hard) than this")
    relation_questions: str = same_setting(
        LGOTConfig, "relation_questions", flag="--relation-questions",
        help="relation question templates: asked of the LLM once per relation before the runs (LGOT 3.1) or "
             "built from the relation's name")
    questions_dir: Path | None = setting(None, metavar="DIR",
                                         help="where generated relation questions are kept (default: a temporary "
                                              "folder with the simulator, the user cache with --llm-base-url)")
    name: str | None = setting(None, shown_default="the artifact folder's name", help="output name prefix")
    replay: bool = setting(True, flag="--no-replay", negate=True, help="skip the cached replay of the first LGOT run")
    sim_latency_ms: float = same_setting(
        SimulatorConfig, "latency_ms", flag="--sim-latency-ms", metavar="L",
        help="simulator only: the replay's cold run gets L ms of latency per request (like a real server; the "
             "grid runs have none), to show what the cache saves")
    device: str = setting("cpu", check=check_device, help="torch device of the executor")
    quiet: bool = setting(False, help="no progress bars or log lines")
    overwrite: bool = setting(False, help="replace existing output files")
    verify: bool = verify_setting()


def _parser() -> ArgumentParser:
    from llm_bridge.config import add_llm_arguments

    p = ArgumentParser(prog="python -m experiments.lgot_eval",
                       description="KG-only vs LLM-only vs LGOT on an artifact with dropped edges, graded against the "
                                   "full KG (BetaE protocol: filtered Hits@1/3/10 on hard answers).")
    add_settings_arguments(p, LGOTEvalSettings)
    add_llm_arguments(p)
    return p


def _slug(text: str) -> str:
    s = re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-.")
    return s[:80] or "model"


def check_name(name: str, flag: str = "--name") -> str:
    """``name`` if it is a plain output-name prefix (letters, digits, '.', '_', '-'; not starting or ending
    with '.' or '-'), else a :class:`UserError` naming ``flag``.  Output files are ``OUT/NAME...``: a name
    holding a folder part (``../x``, ``/abs/x``) would write outside ``--out``."""
    if not name or _slug(name) != name:
        raise UserError(f"{flag} must be a plain name (letters, digits, '.', '_', '-'), got {name!r}")
    return name


def parse_args(argv: Sequence[str] | None = None) -> LGOTEvalConfig:
    from engine.lang.structures import STRUCTURES
    from llm_bridge.config import config_from_args

    ns = _parser().parse_args(argv)
    st = settings_from_args(LGOTEvalSettings, ns)
    for s in st.structures:
        if s not in STRUCTURES:
            raise unknown_name("query structure", s, list(STRUCTURES), "--structures")
    server = ns.llm_base_url is not None
    if server:
        given = [f for f, v in (("--recall", st.recall), ("--hallucination", st.hallucination), ("--noise", st.noise))
                 if v is not None]
        if given:
            raise UserError(f"{given[0]} sets the simulator; it cannot be combined with --llm-base-url")
        if st.sim_latency_ms:
            raise UserError("--sim-latency-ms sets the simulator; it cannot be combined with --llm-base-url")
    config = config_from_args(ns)
    if not server:
        # The simulator's address and model name are set per configuration (see sim_model_name).
        config = config.replace(base_url="http://127.0.0.1:1/v1", api_key=None)
    name = check_name(st.name if st.name is not None else Path(os.path.abspath(st.artifact)).name)
    args = LGOTEvalConfig(
        artifact=st.artifact, out=st.out, structures=tuple(dict.fromkeys(st.structures)),
        per_structure=st.per_structure, seed=st.seed, recall=tuple(dict.fromkeys(st.recall or DEFAULT_RECALL)),
        hallucination=tuple(dict.fromkeys(st.hallucination or DEFAULT_HALLUCINATION)),
        noise=0.1 if st.noise is None else st.noise,
        theta=tuple(dict.fromkeys(st.theta)), alpha=tuple(dict.fromkeys(st.alpha)), answer_check=st.answer_check,
        batch_size=st.batch_size, max_answers=st.max_answers, relation_questions=st.relation_questions, name=name,
        replay=st.replay, sim_latency_ms=st.sim_latency_ms, device=st.device, quiet=st.quiet,
        overwrite=st.overwrite, llm=config, server=server, questions_dir=st.questions_dir, verify=st.verify,
    )
    check_outputs(args)
    return args


# ------------------------------------------------------------------------------------ outputs
def output_paths(args: LGOTEvalConfig) -> dict[str, Path]:
    """``{"md", "json", "png"}`` -> the output files of ``args`` (names never collide between modes/models)."""
    stem = f"{args.name}_sim" if not args.server else f"{args.name}_server_{_slug(args.llm.model)}"
    return {ext: args.out / f"{stem}.{ext}" for ext in ("md", "json", "png")}


def check_outputs(args: LGOTEvalConfig) -> None:
    """Before any work: ``--out`` is (or can become) a folder, and no output exists unless ``--overwrite``."""
    out = args.out
    # The results never go into the artifact (nor the questions cache, which the runs read and write).
    check_not_input(out, what="--out", inputs=[("--artifact", args.artifact)])
    if args.questions_dir is not None:
        check_not_input(args.questions_dir, what="--questions-dir", inputs=[("--artifact", args.artifact)])
    if args.llm is not None and args.llm.use_cache:
        check_not_input(args.llm.cache_path, what="--llm-cache", inputs=[("--artifact", args.artifact)])
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {str(out)!r}: is a file, not a folder")
    if not out.exists():
        parent = Path(os.path.abspath(out)).parent
        if not parent.is_dir():
            raise UserError(f"--out {str(out)!r}: folder {str(parent)!r} does not exist (create it first)")
        return
    for path in output_paths(args).values():
        check_output_file(path, what="--out")
        if path.exists() and not args.overwrite:
            raise UserError(f"--out: {str(path)!r} already exists; pass --overwrite to replace it")


# ------------------------------------------------------------------------------------- queries
def sample(artifact, args: LGOTEvalConfig):
    """The query set: ``per_structure`` queries of each structure, each with at least one hard answer."""
    from engine.eval.metrics import EvalQuery
    from engine.eval.sampling import sample_queries

    queries, stats = sample_queries(artifact, args.structures, args.per_structure, seed=args.seed,
                                    max_answers=args.max_answers, require_hard=True, progress=not args.quiet)
    if not queries:
        raise UserError(f"--artifact {args.artifact}: no query with a hard answer could be sampled "
                        "(was it built with --drop-edges?)")
    return [EvalQuery(q.structure, q.node, q.easy, q.hard) for q in queries], stats


def chance_hits(queries, num_entities: int) -> dict[str, float]:
    """Expected Hits@k of a random ranking (each hard answer among the query's non-answers), mean over structures."""
    per: dict[str, list[float]] = {}
    for q in queries:
        n_non = num_entities - len(q.easy) - len(q.hard)
        per.setdefault(q.structure, []).append(n_non)
    out = {}
    for k in HITS:
        out[f"hits@{k}"] = float(np.mean([np.mean([min(1.0, k / (n + 1)) for n in v]) for v in per.values()]))
    out["mrr"] = float(np.mean([np.mean([sum(1.0 / r for r in range(1, n + 2)) / (n + 1) for n in v])
                                for v in per.values()]))
    return out


def _relations_of(node, out: set) -> set:
    rel = getattr(node, "relation", None)
    if rel is not None:
        out.add(rel)
    for child in getattr(node, "args", ()) or ():
        _relations_of(child, out)
    arg = getattr(node, "arg", None)
    if arg is not None:
        _relations_of(arg, out)
    return out


# ----------------------------------------------------------------------------------- evaluation
def evaluate_method(executor, queries, *, batch_size: int, desc: str, quiet: bool) -> dict[str, Any]:
    """Filtered metrics of ``executor`` (with whatever hooks it has) on ``queries``, per structure and averaged.

    Returns ``{"structures": {s: {tie: {metric: value}}}, "mean": {tie: {metric: value}}, "wall_s", "queries"}``.
    """
    from engine.eval.metrics import TIES, evaluate_queries

    t0 = time.perf_counter()
    # Every experiment query has a hard answer (sampled with require_hard), so none is skipped.
    results = evaluate_queries(executor, queries, batch_size=batch_size, progress=not quiet, desc=desc, leave=False)
    wall = time.perf_counter() - t0
    per: dict[str, dict[str, dict[str, float]]] = {r.structure: r.metrics for r in results}
    mean = {t: {m: float(np.mean([per[s][t][m] for s in per])) for m in per[next(iter(per))][t]} for t in TIES}
    return {"structures": per, "mean": mean, "wall_s": wall, "queries": len(queries),
            "wall_ms_per_query": 1000.0 * wall / max(1, len(queries))}


def sim_model_name(name: str, recall: float, hallucination: float, noise: float, seed: int, method: str,
                   theta: float, alpha: float, answer_check: int = 0) -> str:
    """The model name of one simulator run: the cache key excludes the server's address, so it carries
    everything that changes the answers (and the method and filter, so that every run starts cold)."""
    check = f"-c{answer_check}" if answer_check else ""
    return f"sim-{name}-r{recall:g}-h{hallucination:g}-n{noise:g}-s{seed}-{method}-t{theta:g}-a{alpha:g}{check}"


def run_llm(executor, artifact, queries, config, *, method: str, theta: float, alpha: float, questions,
            batch_size: int, desc: str, quiet: bool, linker=None, answer_check: int = 0) -> dict[str, Any]:
    """One LLM-only or LGOT run: metrics plus the client's and the hook's counters."""
    from llm_bridge.client import LLMClient
    from llm_bridge.lgot import LGOTHook, LGOTSettings

    settings = LGOTSettings(mode="lgot" if method == "lgot" else "llm-only", theta=theta, alpha=alpha,
                            relation_questions="fallback",  # templates were settled before the runs (shared)
                            answer_check=answer_check)
    with LLMClient(config) as client:
        hook = LGOTHook(client=client, artifact=artifact, settings=settings, questions=questions,
                        linker=linker or _linker(artifact))
        handle = executor.add_hook(hook)
        try:
            res = evaluate_method(executor, queries, batch_size=batch_size, desc=desc, quiet=quiet)
        finally:
            handle.remove()
        st = client.stats
    nq = max(1, len(queries))
    res["cost"] = {
        "prompts": st.calls, "cache_hits": st.cache_hits, "deduplicated": st.deduplicated, "requests": st.requests, "retries": st.retries,
        "failures": st.failures, "failed_rows": hook.stats.failed_rows,
        "prompt_tokens": st.prompt_tokens, "completion_tokens": st.completion_tokens,
        "calls_per_query": st.calls / nq, "requests_per_query": st.requests / nq,
        "tokens_per_query": st.total_tokens / nq, "prompt_tokens_per_query": st.prompt_tokens / nq,
        "completion_tokens_per_query": st.completion_tokens / nq,
        "llm_wall_s": st.wall_s, "request_s": st.request_s,
        "answers": hook.stats.answers, "kept": hook.stats.kept, "linked": hook.stats.linked,
        "unlinked": hook.stats.unlinked, "merged": hook.stats.merged,
        "checks": hook.stats.checks, "failed_checks": hook.stats.failed_checks, "penalised": hook.stats.penalised,
    }
    res["model"] = config.model
    return res


_LINKER: list = []  # [(artifact, linker)]: the last artifact's linker (the artifact is kept, so ``is`` is safe)


def _linker(artifact):
    """One entity linker per artifact, shared by every run (building one over FB15k-237's names takes seconds)."""
    from llm_bridge.lgot import LGOTSettings
    from llm_bridge.linking import EntityLinker

    if not _LINKER or _LINKER[0][0] is not artifact:
        _LINKER[:] = [(artifact, EntityLinker.from_artifact(artifact, threshold=LGOTSettings().link_threshold))]
    return _LINKER[0][1]


def settle_questions(artifact, args: LGOTEvalConfig, config, queries, questions_dir) -> tuple[Any, dict]:
    """The relation-question templates every run shares, asked once here (``--relation-questions llm``)."""
    from llm_bridge.client import LLMClient
    from llm_bridge.relations import RelationQuestions

    rels = sorted({artifact.relations[r] if isinstance(r, (int, np.integer)) else r
                   for q in queries for r in _relations_of(q.node, set())})
    questions = RelationQuestions.for_artifact(artifact, model=config.model, cache_dir=questions_dir,
                                               use_cache=config.use_cache)
    info: dict[str, Any] = {"relations": len(rels), "mode": args.relation_questions}
    if args.relation_questions == "llm":
        t0 = time.perf_counter()
        with LLMClient(config) as client:
            got = questions.ensure(rels, artifact=artifact, client=client, model=config.model, cache_dir=questions_dir)
            st = client.stats
        info.update(asked=len(got), outcome={k: sum(v == k for v in got.values()) for k in set(got.values())},
                    prompts=st.calls, requests=st.requests, cache_hits=st.cache_hits, tokens=st.total_tokens,
                    wall_s=time.perf_counter() - t0)
    info["sources"] = {s: sum(questions.source(r) == s for r in rels) for s in ("artifact", "llm", "fallback")}
    return questions, info


def _log(args: LGOTEvalConfig, msg: str) -> None:
    if not args.quiet:
        print(msg, file=sys.stderr, flush=True)


def run_experiment(args: LGOTEvalConfig) -> dict[str, Any]:
    """Sample, evaluate KG-only once and every LLM configuration; returns the JSON record."""
    import torch

    from engine.exec.executor import Executor
    from kge.artifact import Artifact

    t_start = time.perf_counter()
    torch.manual_seed(args.seed)
    artifact = Artifact.load(args.artifact, verify=args.verify, load_embeddings=False)
    if len(artifact.missing) == 0:
        raise UserError(f"--artifact {args.artifact}: has no missing edges (build it with --drop-edges)")
    t = time.perf_counter()
    queries, sstats = sample(artifact, args)
    sample_s = time.perf_counter() - t
    counts = {s: sum(q.structure == s for q in queries) for s in args.structures}
    _log(args, f"{len(queries)} queries with hard answers ({', '.join(f'{s} {n}' for s, n in counts.items())}) "
               f"in {sample_s:.1f} s")
    executor = Executor(artifact, device=args.device)
    record: dict[str, Any] = {
        "name": args.name, "mode": args.mode, "artifact": str(args.artifact), "answer_check": args.answer_check,
        "dataset": {"entities": artifact.num_entities, "relations": artifact.num_relations,
                    "observed": int(len(artifact.observed)), "missing": int(len(artifact.missing)),
                    "source": artifact.meta.get("build_config", {}).get("kg", artifact.meta.get("source")),
                    "drop_edges": artifact.meta.get("build_config", {}).get("drop_edges")},
        "queries": {"per_structure_requested": args.per_structure, "counts": counts,
                    "hard_answers_mean": float(np.mean([len(q.hard) for q in queries])),
                    "easy_answers_mean": float(np.mean([len(q.easy) for q in queries])),
                    "sampler_notes": sstats.notes(), "sample_s": sample_s},
        "tie_rule": TIE, "chance": chance_hits(queries, artifact.num_entities),
        "llm_config": {k: v for k, v in args.llm.to_json().items() if k not in ("base_url", "model")}
        if not args.server else args.llm.to_json(),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
                    "torch": torch.__version__, "torch_threads": torch.get_num_threads()},
    }
    kg = evaluate_method(executor, queries, batch_size=args.batch_size, desc="kg-only", quiet=args.quiet)
    record["kg_only"] = kg
    _log(args, f"kg-only: {_fmt(kg)}")
    runs: list[dict[str, Any]] = []
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="lgot-experiment-")))
        if args.server:
            config = args.llm
            questions_dir = args.questions_dir
            questions, record["setup"] = settle_questions(artifact, args, config, queries, questions_dir)
            grid = [dict(theta=th, alpha=al) for th in args.theta for al in args.alpha]
            for point in grid:
                for method in ("llm-only", "lgot"):
                    if method == "llm-only" and point["alpha"] != args.alpha[0]:
                        continue  # alpha only weighs LGOT's merge
                    desc = f"{method} θ={point['theta']:g}" + (f" α={point['alpha']:g}" if method == "lgot" else "")
                    res = run_llm(executor, artifact, queries, config, method=method, questions=questions,
                                  batch_size=args.batch_size, desc=desc, quiet=args.quiet,
                                  answer_check=args.answer_check, **point)
                    runs.append({"method": method, **point, **res})
                    _log(args, f"{desc}: {_fmt(res)}")
            first = dict(grid[0], method="lgot")
        else:
            from experiments.simulate import KnowledgeBase, SimulatorConfig, start_server

            kb = KnowledgeBase.from_artifact(args.artifact)
            if args.llm.use_cache and args.llm.cache_path == _default_cache():
                cache = tmp / "llm-cache.sqlite"  # a fresh cache: first runs are cold, the replay is warm
            else:
                cache = args.llm.cache_path
            base = args.llm.replace(cache_path=cache)
            questions_dir = args.questions_dir or tmp / "relation-questions"
            srv = start_server(kb, SimulatorConfig(recall=1.0, hallucination=0.0, noise=0.0, seed=args.seed))
            try:
                questions, record["setup"] = settle_questions(
                    artifact, args, base.replace(base_url=srv.base_url, model=f"sim-{args.name}-relation-questions"),
                    queries, questions_dir)
            finally:
                srv.stop()
            first = None
            for r in args.recall:
                for h in args.hallucination:
                    srv = start_server(kb, SimulatorConfig(recall=r, hallucination=h, noise=args.noise, seed=args.seed))
                    try:
                        for th in args.theta:
                            for al in args.alpha:
                                for method in ("llm-only", "lgot"):
                                    if method == "llm-only" and al != args.alpha[0]:
                                        continue  # alpha only weighs LGOT's merge
                                    model = sim_model_name(args.name, r, h, args.noise, args.seed, method, th, al,
                                                           args.answer_check)
                                    config = base.replace(base_url=srv.base_url, model=model)
                                    desc = f"{method} r={r:g} h={h:g} θ={th:g}" + (f" α={al:g}" if method == "lgot" else "")
                                    res = run_llm(executor, artifact, queries, config, method=method, theta=th,
                                                  alpha=al, questions=questions, batch_size=args.batch_size,
                                                  desc=desc, quiet=args.quiet, answer_check=args.answer_check)
                                    runs.append({"method": method, "recall": r, "hallucination": h,
                                                 "noise": args.noise, "theta": th, "alpha": al, **res})
                                    _log(args, f"{desc}: {_fmt(res)}")
                                    if first is None and method == "lgot":
                                        first = {"recall": r, "hallucination": h, "noise": args.noise,
                                                 "theta": th, "alpha": al, "method": method, "config": config}
                    finally:
                        srv.stop()
        record["runs"] = runs
        if args.replay and first is not None and args.llm.use_cache:
            record["replay"] = replay(executor, artifact, queries, args, first, runs, questions, kb=None
                                      if args.server else kb)
    record["total_wall_s"] = time.perf_counter() - t_start
    return record


def _default_cache() -> Path:
    from llm_bridge.config import default_cache_path

    return default_cache_path().expanduser()


def replay(executor, artifact, queries, args: LGOTEvalConfig, first: dict, runs: list, questions, *, kb) -> dict:
    """The first LGOT run again with the same cache: its cost and time with every answer cached.

    Cold: that run of the grid, or (simulator with ``--sim-latency-ms``) the same configuration against a
    simulator answering with that latency, into fresh cache entries.  Warm: the same run again.
    """
    from experiments.simulate import SimulatorConfig, start_server

    config = first.get("config", args.llm)
    point = {k: first[k] for k in ("theta", "alpha")}
    latency = args.sim_latency_ms if kb is not None else 0.0

    def once(desc: str, cfg) -> dict:
        srv = None
        if kb is not None:
            srv = start_server(kb, SimulatorConfig(recall=first["recall"], hallucination=first["hallucination"],
                                                   noise=first["noise"], seed=args.seed, latency_ms=latency))
            cfg = cfg.replace(base_url=srv.base_url)
        try:
            return run_llm(executor, artifact, queries, cfg, method="lgot", questions=questions,
                           batch_size=args.batch_size, desc=desc, quiet=args.quiet,
                           answer_check=args.answer_check, **point)
        finally:
            if srv is not None:
                srv.stop()

    if latency > 0:
        config = config.replace(model=config.model + f"-lat{latency:g}")
        cold = once(f"lgot cold, {latency:g} ms latency", config)
    else:
        cold = next(r for r in runs if r["method"] == "lgot" and all(r.get(k) == first[k] for k in first
                                                                     if k not in ("config", "method")))
    warm = once("lgot replay", config)
    same = all(abs(warm["mean"][TIE][m] - cold["mean"][TIE][m]) < 1e-12 for m in warm["mean"][TIE])
    out = {k: v for k, v in first.items() if k != "config"}
    out.update(latency_ms=latency,
               cold={"wall_ms_per_query": cold["wall_ms_per_query"], **cold["cost"]},
               warm={"wall_ms_per_query": warm["wall_ms_per_query"], **warm["cost"]},
               identical_metrics=same, speedup=cold["wall_s"] / max(warm["wall_s"], 1e-9))
    _log(args, f"replay: {cold['wall_ms_per_query']:.1f} -> {warm['wall_ms_per_query']:.1f} ms/query, "
               f"{warm['cost']['cache_hits']}/{warm['cost']['prompts']} cache hits, {warm['cost']['requests']} requests, "
               f"identical metrics: {same}")
    return out


def _fmt(res: dict) -> str:
    m = res["mean"][TIE]
    s = " ".join(f"H@{k} {100 * m[f'hits@{k}']:.1f}" for k in HITS)
    if "cost" in res:
        c = res["cost"]
        s += (f" | {c['calls_per_query']:.2f} calls/q, {c['tokens_per_query']:.0f} tok/q, "
              f"{res['wall_ms_per_query']:.1f} ms/q, cache hits {c['cache_hits']}")
    else:
        s += f" | {res['wall_ms_per_query']:.2f} ms/q"
    return s


# ------------------------------------------------------------------------------------- reports
def _pct(x: float) -> str:
    return f"{100 * x:.1f}"


def _point_key(run: dict) -> tuple:
    return tuple(run.get(k) for k in ("recall", "hallucination", "theta"))


_EPS = 1e-9


def verdicts(record: dict) -> list[dict[str, Any]]:
    """Per LGOT run: does it beat KG-only and LLM-only (same point) on mean Hits@1/3/10, and is the LLM above chance?"""
    kg = record["kg_only"]["mean"][TIE]
    chance = record["chance"]
    llm_only = {_point_key(r): r for r in record["runs"] if r["method"] == "llm-only"}
    out = []
    for r in record["runs"]:
        if r["method"] != "lgot":
            continue
        lo = llm_only.get(_point_key(r))
        lm = lo["mean"][TIE] if lo else None
        g = r["mean"][TIE]
        row = {k: r.get(k) for k in ("recall", "hallucination", "theta", "alpha")}
        row["above_chance"] = bool(lm is not None and lm["hits@10"] > chance["hits@10"] and lm["hits@1"] > chance["hits@1"])
        losses = []
        for k in HITS:
            m = f"hits@{k}"
            if g[m] < kg[m] - _EPS:
                losses.append({"metric": m, "to": "kg-only", "lgot": g[m], "other": kg[m]})
            if lm is not None and g[m] < lm[m] - _EPS:
                losses.append({"metric": m, "to": "llm-only", "lgot": g[m], "other": lm[m]})
        row["losses"] = losses
        # per structure, Hits@1
        st_losses = []
        for s, v in r["structures"].items():
            a = v[TIE]["hits@1"]
            b = record["kg_only"]["structures"][s][TIE]["hits@1"]
            c = lo["structures"][s][TIE]["hits@1"] if lo else -1
            if a < max(b, c) - _EPS:
                st_losses.append({"structure": s, "lgot": a, "kg-only": b, "llm-only": c})
        row["structure_losses_hits@1"] = st_losses
        row["wins_all"] = not losses
        row["strictly_better_all"] = all(g[f"hits@{k}"] > kg[f"hits@{k}"] + _EPS and
                                         (lm is None or g[f"hits@{k}"] > lm[f"hits@{k}"] + _EPS) for k in HITS)
        out.append(row)
    return out


def _describe_point(v: dict) -> str:
    s = f"recall {v['recall']:g}, hallucination {v['hallucination']:g}" if v.get("recall") is not None else "server"
    s += f", θ {v['theta']:g}"
    if v.get("alpha") is not None:
        s += f", α {v['alpha']:g}"
    return s


def loss_paragraph(record: dict) -> str:
    """'Where LGOT does not win': facts from the numbers (which point, which metric, against which method)."""
    vs = verdicts(record)
    if not vs:
        return "No LGOT run."
    above = [v for v in vs if v["above_chance"]]
    wins = [v for v in above if v["wins_all"]]
    strict = [v for v in wins if v["strictly_better_all"]]
    lines = [f"LGOT is at least as good as both KG-only and LLM-only on each of mean Hits@1, Hits@3 and Hits@10 at "
             f"{len(wins)} of {len(above)} runs where the LLM is better than chance (LLM-only mean Hits@1 and Hits@10 "
             f"above a random ranking's: {_pct(record['chance']['hits@1'])} / {_pct(record['chance']['hits@10'])}); "
             f"strictly better than both on all three at {len(strict)}."
             + (" Where it is not (LGOT's value vs the other method's):" if len(wins) < len(above) else "")]
    below = [v for v in vs if not v["above_chance"]]
    if below:
        lines.append(f"{len(below)} point(s) have an LLM no better than chance: "
                     + "; ".join(_describe_point(v) for v in below) + ".")
    for v in above:
        if v["wins_all"]:
            continue
        by: dict[str, list[str]] = {}
        for l in v["losses"]:
            by.setdefault(l["to"], []).append(f"{l['metric'].replace('hits@', 'H@')} {_pct(l['lgot'])} vs {_pct(l['other'])}")
        lines.append(f"- {_describe_point(v)}: LGOT < " + "; < ".join(f"{k} ({', '.join(x)})" for k, x in by.items())
                     + ".")
    st = {}
    for v in above:
        for l in v["structure_losses_hits@1"]:
            st.setdefault(l["structure"], 0)
            st[l["structure"]] += 1
    if st:
        lines.append("Per structure (Hits@1, LGOT < the better of KG-only and LLM-only), runs lost of "
                     f"{len(above)}: " + ", ".join(f"{s} {n}" for s, n in st.items()) + ".")
    return "\n".join(lines)


def markdown(record: dict, command: str) -> str:
    kg = record["kg_only"]
    ds = record["dataset"]
    q = record["queries"]
    structures = list(kg["structures"])
    lines = [f"# LGOT experiment: {record['name']} ({'simulated LLM grid' if record['mode'] == 'sim' else 'server ' + record['llm_config'].get('model', '')})",
             "", f"Command: `{command}`", "",
             f"Artifact `{record['artifact']}`: {ds['entities']:,} entities, {ds['relations']} relations, "
             f"{ds['observed']:,} observed and {ds['missing']:,} missing edges (drop {ds['drop_edges']}). "
             f"Queries: {', '.join(f'{s} {n}' for s, n in q['counts'].items())} (each with ≥ 1 hard answer; "
             f"mean {q['hard_answers_mean']:.1f} hard, {q['easy_answers_mean']:.1f} easy answers). "
             f"Filtered ranks of hard answers against the full KG, ties at their average position; Hits in percent, "
             f"mean over structures. Random ranking: H@1 {_pct(record['chance']['hits@1'])}, "
             f"H@10 {_pct(record['chance']['hits@10'])}.", ""]
    if record.get("notes"):
        lines += [record["notes"], ""]
    sim = record["mode"] == "sim"
    head = ("| recall | halluc. | θ | α | method | H@1 | H@3 | H@10 | MRR | calls/q | tokens/q | cached | ms/q |" if sim else
            "| θ | α | method | H@1 | H@3 | H@10 | MRR | calls/q | tokens/q | cached | ms/q |")
    lines += ["## Mean over structures", "", head, "|" + "---|" * (head.count("|") - 1)]
    m = kg["mean"][TIE]
    pre = "| – | – | – | – " if sim else "| – | – "
    lines.append(f"{pre}| KG-only | {_pct(m['hits@1'])} | {_pct(m['hits@3'])} | {_pct(m['hits@10'])} | "
                 f"{_pct(m['mrr'])} | 0 | 0 | – | {kg['wall_ms_per_query']:.2f} |")
    for r in record["runs"]:
        m = r["mean"][TIE]
        c = r["cost"]
        pre = (f"| {r['recall']:g} | {r['hallucination']:g} | {r['theta']:g} | " if sim else f"| {r['theta']:g} | ")
        al = f"{r['alpha']:g}" if r["method"] == "lgot" else "–"
        name = "**LGOT**" if r["method"] == "lgot" else "LLM-only"
        lines.append(f"{pre}{al} | {name} | {_pct(m['hits@1'])} | {_pct(m['hits@3'])} | {_pct(m['hits@10'])} | "
                     f"{_pct(m['mrr'])} | {c['calls_per_query']:.2f} | {c['tokens_per_query']:.0f} | "
                     f"{100 * c['cache_hits'] / max(1, c['prompts']):.0f}% | {r['wall_ms_per_query']:.1f} |")
    lines += ["", "## Hits@1 per structure", ""]
    head = ("| recall | halluc. | θ | α | method | " if sim else "| θ | α | method | ") + " | ".join(structures) + " |"
    lines += [head, "|" + "---|" * (head.count("|") - 1)]
    pre = "| – | – | – | – " if sim else "| – | – "
    lines.append(f"{pre}| KG-only | " + " | ".join(_pct(kg["structures"][s][TIE]["hits@1"]) for s in structures) + " |")
    for r in record["runs"]:
        pre = (f"| {r['recall']:g} | {r['hallucination']:g} | {r['theta']:g} | " if sim else f"| {r['theta']:g} | ")
        al = f"{r['alpha']:g}" if r["method"] == "lgot" else "–"
        name = "LGOT" if r["method"] == "lgot" else "LLM-only"
        lines.append(f"{pre}{al} | {name} | " + " | ".join(_pct(r["structures"][s][TIE]["hits@1"]) for s in structures) + " |")
    lines += ["", "## Where LGOT does not win", "", loss_paragraph(record), ""]
    lines += ["## Cost and latency", ""]
    setup = record.get("setup", {})
    if setup.get("mode") == "llm":
        lines.append(f"Relation questions (once, shared by every run): {setup.get('relations')} relations, "
                     f"{setup.get('prompts', 0)} prompts, {setup.get('requests', 0)} requests, "
                     f"{setup.get('tokens', 0):,} tokens, {setup.get('wall_s', 0):.1f} s; sources {setup.get('sources')}.")
    else:
        lines.append(f"Relation questions: name-based fallback templates ({setup.get('relations')} relations).")
    lines.append("")
    lines.append(f"KG-only: {kg['wall_ms_per_query']:.2f} ms per query. LLM runs: calls/q = prompts per query (one per "
                 "projection row; identical prompts in a batch are sent once), tokens/q = prompt + completion tokens "
                 "per query" + (" (the simulator counts words)" if sim else "") + " (cache hits cost none), cached = "
                 "prompts answered from the SQLite cache, ms/q = wall time per query "
                 "including the executor" + (", the client and the in-process simulator (one Python process, 2 shared "
                                             "cores)" if sim else "") + ".")
    rp = record.get("replay")
    if rp:
        lat = f"; cold run against a simulator with {rp['latency_ms']:g} ms per request" if rp.get("latency_ms") else ""
        lines += ["", f"Cache replay ({_describe_point(rp)}, LGOT run repeated with the same SQLite cache{lat}): "
                      f"{rp['cold']['wall_ms_per_query']:.1f} → {rp['warm']['wall_ms_per_query']:.1f} ms/query "
                      f"({rp['speedup']:.1f}× faster), {rp['cold']['requests']} → {rp['warm']['requests']} HTTP requests, "
                      f"{rp['warm']['cache_hits']} of {rp['warm']['prompts']} prompts from the cache; identical metrics: "
                      f"{'yes' if rp['identical_metrics'] else 'NO'}."]
    lines += ["", f"Total wall time {record['total_wall_s'] / 60:.1f} min ({record['machine']['cpus']} CPUs, "
                  f"torch threads {record['machine']['torch_threads']}).", ""]
    return "\n".join(lines)


def plot(record: dict) -> bytes:
    """PNG: mean Hits@1 (top) and Hits@10 (bottom) per method, one panel per hallucination rate (or per θ)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kg = record["kg_only"]["mean"][TIE]
    runs = record["runs"]
    sim = record["mode"] == "sim"
    metrics = ("hits@1", "hits@10")
    if sim:
        hs = sorted({r["hallucination"] for r in runs})
        fig, axes = plt.subplots(len(metrics), len(hs), figsize=(max(9.0, 4.2 * len(hs)), 3.4 * len(metrics)),
                                 squeeze=False, sharey="row")
        thetas = sorted({r["theta"] for r in runs})
        alphas = sorted({r["alpha"] for r in runs})
        styles = ["-", "--", ":", "-."]
        for row, metric in enumerate(metrics):
            for col, h in enumerate(hs):
                ax = axes[row][col]
                xs = sorted({r["recall"] for r in runs})
                ax.axhline(100 * kg[metric], color="tab:gray", lw=2, label="KG-only")
                ax.axhline(100 * record["chance"][metric], color="k", lw=0.8, ls=":", label="random")
                for ti, th in enumerate(thetas):
                    sel = [r for r in runs if r["hallucination"] == h and r["theta"] == th]
                    lo = sorted((r["recall"], r["mean"][TIE][metric]) for r in sel if r["method"] == "llm-only")
                    tag = f" θ={th:g}" if len(thetas) > 1 else ""
                    if lo:
                        ax.plot([x for x, _ in lo], [100 * y for _, y in lo], styles[ti % 4], marker="s",
                                color="tab:orange", label="LLM-only" + tag)
                    for ai, al in enumerate(alphas):
                        lg = sorted((r["recall"], r["mean"][TIE][metric]) for r in sel
                                    if r["method"] == "lgot" and r["alpha"] == al)
                        atag = f" α={al:g}" if len(alphas) > 1 else ""
                        colors = ["tab:blue", "tab:green", "tab:purple", "tab:red"]
                        if lg:
                            ax.plot([x for x, _ in lg], [100 * y for _, y in lg], styles[ti % 4], marker="o",
                                    color=colors[ai % 4], label="LGOT" + tag + atag)
                ax.set_title(f"hallucination {h:g}")
                ax.set_xlabel("LLM recall")
                ax.set_xticks(xs)
                ax.grid(alpha=0.3)
                if col == 0:
                    ax.set_ylabel(f"mean {metric.replace('hits@', 'Hits@')} (%)")
        handles, labels = axes[0][0].get_legend_handles_labels()
        ncol = min(5, len(labels))
        rows = -(-len(labels) // ncol)
        fig.legend(handles, labels, loc="lower center", ncol=ncol, frameon=False)
        drop = record["dataset"].get("drop_edges")
        dropped = f"{100 * drop:g}% of edges dropped" if isinstance(drop, (int, float)) else "edges dropped"
        fig.suptitle(f"{record['name']}: KG with {dropped}, graded on the full KG\n(simulated LLM; "
                     f"{sum(record['queries']['counts'].values())} queries, mean over structures)", fontsize=11)
        fig.tight_layout(rect=(0, 0.035 * rows + 0.02, 1, 0.95))
    else:
        fig, axes = plt.subplots(1, len(metrics), figsize=(5 * len(metrics), 3.8), squeeze=False)
        for col, metric in enumerate(metrics):
            ax = axes[0][col]
            labels = [f"θ={r['theta']:g}" + (f" α={r['alpha']:g}" if r["method"] == "lgot" else "") for r in runs]
            groups = sorted({(r["theta"], r["alpha"]) for r in runs})
            x = np.arange(len(groups))
            w = 0.27
            ax.bar(x - w, [100 * kg[metric]] * len(groups), w, color="tab:gray", label="KG-only")
            for off, method, color in ((0, "llm-only", "tab:orange"), (w, "lgot", "tab:blue")):
                ys = [100 * next(r["mean"][TIE][metric] for r in runs if r["method"] == method
                                 and (r["theta"], r["alpha"]) == g) for g in groups]
                ax.bar(x + off, ys, w, color=color, label="LLM-only" if method == "llm-only" else "LGOT")
            ax.set_xticks(x)
            ax.set_xticklabels([f"θ={t:g}, α={a:g}" for t, a in groups])
            ax.set_ylabel(f"mean {metric.replace('hits@', 'Hits@')} (%)")
            ax.grid(alpha=0.3, axis="y")
        axes[0][0].legend()
        fig.suptitle(f"{record['name']}: {record['llm_config'].get('model')}")
        fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    return buf.getvalue()


def jsonable(x: Any, *, drop: frozenset[str] = frozenset()) -> Any:
    """``x`` with numpy scalars, paths and tuples made JSON-ready (dict keys as strings, keys in ``drop`` left out)."""
    if isinstance(x, dict):
        return {str(k): jsonable(v, drop=drop) for k, v in x.items() if k not in drop}
    if isinstance(x, (list, tuple)):
        return [jsonable(v, drop=drop) for v in x]
    if isinstance(x, Path):
        return str(x)
    if isinstance(x, (np.floating, np.integer)):
        return x.item()
    return x


@cli_main
def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    command = "python -m experiments.lgot_eval " + " ".join(sys.argv[1:] if argv is None else argv)
    record = run_experiment(args)
    record["command"] = command
    record["args"] = {k: v for k, v in asdict(args).items() if k != "llm"}
    record["verdicts"] = verdicts(record)
    args.out.mkdir(parents=True, exist_ok=True)
    paths = output_paths(args)
    check_outputs(args)  # again: another run may have written meanwhile
    write_output(paths["json"], json_line(jsonable(record, drop=frozenset({"config"})), indent=1) + "\n", what="--out")
    write_output(paths["md"], markdown(record, command), what="--out")
    write_output(paths["png"], plot(record), what="--out")
    if not args.quiet:
        print(loss_paragraph(record), file=sys.stderr)
    for p in paths.values():
        print(f"wrote {p}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
