"""BetaE-protocol evaluation of complex queries: filtered ranks, MRR and Hits@k per structure.

Protocol (Ren et al., BetaE, NeurIPS 2020; also QTO, FIT, GNN-QE):

* every query has *easy* answers (reachable on the observed graph) and *hard*
  answers (reachable only once the missing edges are added);
* each hard answer ``a`` is ranked among the *non-answers* only ("filtered"
  setting: every other easy and hard answer is removed from the ranking);
* ``rank(a) = 1 + #{e not an answer : s_e > s_a} (+ ties, see below)``;
* per query: MRR = mean over its hard answers of ``1/rank``, Hits@k = mean of
  ``rank <= k``; per structure: mean over its queries (each query weighs the
  same, whatever its number of hard answers).

Ties.  BetaE's code ranks by ``argsort`` position, so a non-answer with exactly
the answer's score lands before or after it arbitrarily.  We make it explicit
with ``ties``:

* ``"optimistic"``  -- only strictly greater non-answers count (``1 + #>``);
* ``"pessimistic"`` -- every tied non-answer counts (``1 + #>=``);
* ``"average"`` (default) -- ``1 + #> + #= / 2``, the expected rank under a
  random tie-break, i.e. what BetaE's argsort gives on average.

With sparse scores (QTO) many non-answers share a score of exactly 0, so the
three can differ for hard answers the model scores 0; all three are computed
and stored, ``ties`` picks the headline one.
"""
from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np
import torch

from kgreason.errors import UserError, unknown_name
from kgreason.files import json_object, read_lines

__all__ = [
    "TIES",
    "HITS",
    "EvalQuery",
    "filtered_ranks",
    "query_metrics",
    "StructureResult",
    "evaluate_queries",
    "format_table",
    "load_jsonl_queries",
]

TIES = ("optimistic", "average", "pessimistic")
HITS = (1, 3, 10)


@dataclass(frozen=True)
class EvalQuery:
    """One query to evaluate: its structure name, id-resolved AST, easy and hard answer ids."""

    structure: str
    node: object
    easy: np.ndarray
    hard: np.ndarray


def filtered_ranks(
    scores: torch.Tensor,
    answer_mask: torch.Tensor,
    hard: torch.Tensor,
) -> dict[str, torch.Tensor]:
    """Filtered ranks of padded hard answers under each tie rule.

    Shapes: ``scores`` (B, N) float; ``answer_mask`` (B, N) bool, True for every
    easy or hard answer of the row's query (all are removed from the ranking);
    ``hard`` (B, K) int64 hard-answer ids, padded with -1.

    Returns ``{"optimistic", "average", "pessimistic"}`` -> (B, K) float64 ranks
    (NaN at padding).  One sort per row plus a ``searchsorted``: no loop over
    answers.
    """
    if scores.dim() != 2 or answer_mask.shape != scores.shape or hard.dim() != 2 or hard.shape[0] != scores.shape[0]:
        raise ValueError(
            f"shapes: scores {tuple(scores.shape)}, answer_mask {tuple(answer_mask.shape)}, hard {tuple(hard.shape)}"
        )
    s = scores.detach()
    if not s.is_floating_point():
        s = s.to(torch.float32)
    if torch.isnan(s).any():
        raise ValueError("scores contain NaN")
    n = s.shape[1]
    valid = hard >= 0
    hard_scores = s.gather(1, hard.clamp(min=0))
    non_answer = s.masked_fill(answer_mask, -math.inf)
    ordered = non_answer.sort(dim=1).values.contiguous()
    hard_scores_c = hard_scores.contiguous()
    at_most = torch.searchsorted(ordered, hard_scores_c, right=True)  # #entries <= s_a
    below = torch.searchsorted(ordered, hard_scores_c, right=False)  # #entries < s_a
    greater = (n - at_most).to(torch.float64)
    greater_equal = (n - below).to(torch.float64)
    # Masked answers sit at -inf; they tie only with an answer scored -inf.
    masked = answer_mask.sum(dim=1, keepdim=True).to(torch.float64)
    greater_equal = torch.where(hard_scores == -math.inf, greater_equal - masked, greater_equal)
    nan = torch.tensor(math.nan, dtype=torch.float64)
    opt = torch.where(valid, 1.0 + greater, nan)
    pes = torch.where(valid, 1.0 + greater_equal, nan)
    avg = torch.where(valid, 1.0 + greater + (greater_equal - greater) / 2.0, nan)
    return {"optimistic": opt, "average": avg, "pessimistic": pes}


def query_metrics(ranks: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per-query MRR and Hits@k from (B, K) ranks with NaN padding -> each (B,) float64.

    A row without any hard answer gives NaN.
    """
    valid = ~torch.isnan(ranks)
    count = valid.sum(dim=1).to(torch.float64)
    safe = torch.where(valid, ranks, torch.ones_like(ranks))
    out = {"mrr": torch.where(valid, 1.0 / safe, torch.zeros_like(safe)).sum(dim=1) / count}
    for k in HITS:
        out[f"hits@{k}"] = (valid & (safe <= k)).sum(dim=1).to(torch.float64) / count
    return out


@dataclass
class StructureResult:
    """Averages over the queries of one structure (fractions in [0, 1])."""

    structure: str
    num_queries: int
    num_hard: int
    metrics: dict[str, dict[str, float]] = field(default_factory=dict)  # tie rule -> metric -> value


def _pad(rows: Sequence[np.ndarray], fill: int = -1) -> torch.Tensor:
    k = max((len(r) for r in rows), default=0)
    out = np.full((len(rows), max(k, 1)), fill, dtype=np.int64)
    for i, r in enumerate(rows):
        out[i, : len(r)] = r
    return torch.from_numpy(out)


def rank_batch(scores: torch.Tensor, queries: Sequence[EvalQuery]) -> dict[str, dict[str, torch.Tensor]]:
    """Per-query metrics of one scored batch: tie rule -> metric -> (B,) float64."""
    b, n = scores.shape
    if b != len(queries):
        raise ValueError(f"{b} score rows for {len(queries)} queries")
    rows, cols = [], []
    for i, q in enumerate(queries):
        ids = np.concatenate([q.easy, q.hard]).astype(np.int64)
        rows.append(np.full(len(ids), i, dtype=np.int64))
        cols.append(ids)
    mask = torch.zeros((b, n), dtype=torch.bool)
    if rows:
        mask[torch.from_numpy(np.concatenate(rows)), torch.from_numpy(np.concatenate(cols))] = True
    ranks = filtered_ranks(scores.cpu(), mask, _pad([q.hard for q in queries]))
    return {tie: query_metrics(r) for tie, r in ranks.items()}


def rank_batch_sharded(executor: Any, queries: Sequence[EvalQuery], *,
                       batch_size: int = 1024) -> dict[str, dict[str, torch.Tensor]]:
    """:func:`rank_batch` of these queries on a sharded executor (:class:`engine.exec.sharded.ShardedExecutor`:
    ``block_scores``, its column block ``lo``/``hi``/``width`` and ``comm``), without the full scores
    (collective; the same metrics on every rank, bit for bit those of one process).

    Each rank scores its column block.  A hard answer's score comes from its owner (one all-reduce of the
    (B, K) scores, every other rank adding 0); each rank counts its non-answers scoring above (and at
    least) it, :func:`filtered_ranks` on the block with the answers' scores as extra,
    masked columns; one all-reduce sums the counts.  The ranks are then the same integers as over all N.
    """
    y = executor.block_scores([q.node for q in queries], batch_size=batch_size).cpu()
    b = y.shape[0]
    hard = _pad([q.hard for q in queries])  # (B, K) global ids, -1 = padding
    k = hard.shape[1]
    valid = hard >= 0
    mine = valid & (hard >= executor.lo) & (hard < executor.hi)
    w = executor.width
    local = y.gather(1, (hard - executor.lo).clamp(0, max(w - 1, 0))) if w else torch.zeros(b, k)
    hard_scores = executor.comm.all_reduce_sum(torch.where(mine, local, torch.zeros_like(local)), "hard scores")
    mask = torch.zeros(b, executor.width + k, dtype=torch.bool)
    mask[:, executor.width:] = True  # the appended answer scores never count as non-answers
    for i, q in enumerate(queries):
        ids = torch.from_numpy(np.concatenate([q.easy, q.hard]).astype(np.int64))
        ids = ids[(ids >= executor.lo) & (ids < executor.hi)] - executor.lo
        mask[i, ids] = True
    counts = torch.zeros(2 * b * k + 1, dtype=torch.float64)
    if bool(torch.isnan(y).any()) or bool(torch.isnan(hard_scores).any()):
        counts[-1] = 1.0  # every rank raises filtered_ranks' error
    else:
        ext = torch.where(valid, executor.width + torch.arange(k).expand(b, k), torch.full_like(hard, -1))
        r = filtered_ranks(torch.cat([y, hard_scores], 1), mask, ext)
        counts[: b * k] = torch.nan_to_num(r["optimistic"] - 1.0).flatten()
        counts[b * k: 2 * b * k] = torch.nan_to_num(r["pessimistic"] - 1.0).flatten()
    total = executor.comm.all_reduce_sum(counts, "rank counts")
    if total[-1] > 0:
        raise ValueError("scores contain NaN")
    greater, greater_equal = total[: b * k].view(b, k), total[b * k: 2 * b * k].view(b, k)
    nan = torch.tensor(math.nan, dtype=torch.float64)
    # the same float64 expressions as filtered_ranks over all N (the counts are the same integers)
    ranks = {"optimistic": torch.where(valid, 1.0 + greater, nan),
             "average": torch.where(valid, 1.0 + greater + (greater_equal - greater) / 2.0, nan),
             "pessimistic": torch.where(valid, 1.0 + greater_equal, nan)}
    return {tie: query_metrics(r) for tie, r in ranks.items()}


def evaluate_queries(
    executor,
    queries: Sequence[EvalQuery],
    *,
    batch_size: int = 1024,
    progress: bool = True,
    desc: str = "evaluate",
    leave: bool = True,
) -> list[StructureResult]:
    """Score every query with ``executor.scores`` and average the filtered metrics per structure.

    Queries without hard answers are not ranked (the caller reports them).
    Structures keep their first-appearance order.
    """
    by_structure: dict[str, list[EvalQuery]] = {}
    for q in queries:
        if len(q.hard):
            by_structure.setdefault(q.structure, []).append(q)
    bar = None
    if progress:
        from kgreason.progress import progress_bar

        bar = progress_bar(total=sum(len(v) for v in by_structure.values()), desc=desc, unit="q", file=sys.stderr,
                   leave=leave)
    results = []
    for name, group in by_structure.items():
        sums: dict[str, dict[str, float]] = {t: {} for t in TIES}
        for lo in range(0, len(group), batch_size):
            chunk = group[lo : lo + batch_size]
            if hasattr(executor, "block_scores"):  # a sharded rank: its column block, no full scores (engine.exec.sharded)
                per_query = rank_batch_sharded(executor, chunk, batch_size=batch_size)
            else:
                scores = executor.scores([q.node for q in chunk], batch_size=batch_size)
                if not isinstance(scores, torch.Tensor):
                    scores = torch.as_tensor(scores)
                per_query = rank_batch(scores, chunk)
            for tie, metrics in per_query.items():
                for m, v in metrics.items():
                    sums[tie][m] = sums[tie].get(m, 0.0) + float(v.sum())
            if bar is not None:
                bar.update(len(chunk))
                bar.set_postfix_str(name)
        num = len(group)
        results.append(
            StructureResult(
                structure=name,
                num_queries=num,
                num_hard=int(sum(len(q.hard) for q in group)),
                metrics={t: {m: v / num for m, v in ms.items()} for t, ms in sums.items()},
            )
        )
    if bar is not None:
        bar.close()
    return results


def format_table(results: Sequence[StructureResult], *, ties: str = "average") -> str:
    """Markdown table of the per-structure metrics in percent (1 decimal), plus an average row."""
    names = ["mrr"] + [f"hits@{k}" for k in HITS]
    head = "| structure | queries | " + " | ".join(n.upper() if n == "mrr" else n for n in names) + " |"
    lines = [head, "|" + "---|" * (len(names) + 2)]
    for r in results:
        vals = " | ".join(f"{100 * r.metrics[ties][n]:.1f}" for n in names)
        lines.append(f"| {r.structure} | {r.num_queries} | {vals} |")
    if len(results) > 1:
        vals = " | ".join(f"{100 * np.mean([r.metrics[ties][n] for r in results]):.1f}" for n in names)
        lines.append(f"| mean | {sum(r.num_queries for r in results)} | {vals} |")
    return "\n".join(lines)


def results_to_json(results: Sequence[StructureResult]) -> list[dict]:
    return [
        {"structure": r.structure, "num_queries": r.num_queries, "num_hard_answers": r.num_hard, "metrics": r.metrics}
        for r in results
    ]


def _canonical_shape(key: tuple) -> tuple:
    """A :func:`~engine.lang.query.shape_key` with the branches of intersections and unions sorted (order-free)."""
    children = tuple(_canonical_shape(c) for c in key[1:])
    if key[0] in ("i", "u"):
        children = tuple(sorted(children, key=repr))
    return (key[0],) + children


def _structure_shapes() -> dict[str, tuple]:
    """Order-free shape of each structure label a JSONL file may carry (negations written the QTO way)."""
    from engine.lang.query import shape_key
    from engine.lang.structures import _ALIASES, BETAE_NAMES, Structure

    shapes: dict[str, tuple] = {}
    for betae, name in BETAE_NAMES.items():
        st = Structure(name, betae)
        node = st.build(list(range(st.num_anchors)), list(range(st.num_relations)), negation="qto")
        shapes[name] = _canonical_shape(shape_key(node))
    for alias, name in _ALIASES.items():
        shapes[alias] = shapes[name]
    return shapes


def load_jsonl_queries(path: str | Path, artifact, *, structures: Iterable[str] | None = None) -> list[EvalQuery]:
    """Read a sampler JSONL file and resolve each ``expr`` against ``artifact``.

    Every line: ``{"structure": str, "expr": str, "easy": [ids], "hard": [ids]}``.
    ``structure`` must be a known structure name whose shape ``expr`` has
    (branch order and negation style aside).  Errors name ``file:line``.
    """
    from engine.lang.query import parse, resolve, shape_key
    from engine.lang.structures import convert_negation

    path = Path(path)
    lines = read_lines(path, what="--queries")
    keep = set(structures) if structures else None
    shapes = _structure_shapes()
    n = artifact.num_entities
    out: list[EvalQuery] = []
    for lineno, line in lines:
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        rec = json_object(line, where)
        for key in ("structure", "expr", "easy", "hard"):
            if key not in rec:
                raise UserError(f"{where}: missing key {key!r}")
        label = rec["structure"]
        if not isinstance(label, str):
            raise UserError(f"{where}: 'structure' must be a string")
        if label not in shapes:
            raise unknown_name("query structure", label, list(shapes), where)
        if keep is not None and label not in keep:
            continue
        if not isinstance(rec["expr"], str):
            raise UserError(f"{where}: 'expr' must be a string")
        ids = {}
        for key in ("easy", "hard"):
            v = rec[key]
            if not isinstance(v, list) or not all(isinstance(x, int) and not isinstance(x, bool) for x in v):
                raise UserError(f"{where}: {key!r} must be a list of entity ids")
            a = np.asarray(v, dtype=np.int64) if all(-(1 << 63) <= x < (1 << 63) for x in v) else None
            if a is None or (len(a) and (a.min() < 0 or a.max() >= n)):
                raise UserError(f"{where}: {key!r} has an entity id outside [0, {n})")
            ids[key] = a
        node = resolve(parse(rec["expr"], where=f"{where}: expr"), artifact, where=where)
        if _canonical_shape(shape_key(convert_negation(node, "qto"))) != shapes[label]:
            matching = [s for s, k in shapes.items() if k == _canonical_shape(shape_key(convert_negation(node, "qto")))]
            hint = f" (its shape is {matching[0]})" if matching else " (it matches no known structure)"
            raise UserError(f"{where}: structure label {label!r} contradicts expr{hint}")
        out.append(EvalQuery(label, node, ids["easy"], ids["hard"]))
    return out
