"""A fast 1-N ComplEx-N3 trainer (Lacroix, Usunier and Obozinski 2018), CPU and CUDA through one code path.

This is the trainer of every size preset (``TrainConfig.training_loop="1n"``,
:mod:`kge.train`); pykeen's own loops run only when ``--training-loop lcwa|slcwa``
asks for them.  pykeen stays the model family and the evaluator: the embeddings
trained here are pykeen ComplEx embeddings (``score(h, r, t) = Re(<e_h, w_r, conj(e_t)>)``),
:func:`to_pykeen_model` loads them into a pykeen ``ComplEx``, and the held-out
link-prediction MRR of a build comes from pykeen's filtered ``RankBasedEvaluator``
below ``kge.train.HUGE_FROM`` entities (from :func:`filtered_tail_ranks`, the same
tail-side numbers, above).  What is our own is the training loop, because it is where pykeen's LCWA loop spends
~7x the time its FLOPs need on a CPU (the issue's measurement: ~1.7 s for a
1,024-row batch that is ~23 GFLOP).  Why this loop is faster:

* **Real matmuls.**  An entity is stored as one real row ``[Re e | Im e]`` of
  ``2d`` floats.  The query ``q = e_h * w_r`` is formed once per batch row and
  the scores of *all* tails are a single real GEMM
  ``[Re q | Im q] (B, 2d) @ [Re E | Im E]^T (2d, N)``, since
  ``Re(<q, conj(e_t)>) = Re q . Re e_t + Im q . Im e_t``.  pykeen broadcasts
  complex products over ``(B, N, d)`` instead.
* **bfloat16 GEMMs where the CPU has them.**  On a CPU with AMX/AVX512-BF16 (or
  a CUDA GPU) the three GEMMs of a step (scores, their gradient w.r.t. the
  queries and w.r.t. the entity table) run in bfloat16 with float32
  accumulation: measured 5x the float32 rate on this machine (~480 vs ~95
  GFLOP/s for these shapes).  Master weights, the optimizer state, the softmax
  and the loss stay float32, as in standard mixed-precision training.
* **Reciprocal relations, tails only.**  ``kg.train`` already holds both
  directions of every edge (relation ``2k+1`` is the inverse of ``2k``), so
  tail prediction over all triples is the 1vsAll objective of Lacroix et al.
* **One fused softmax cross-entropy** over the ``(B, N)`` scores, N3 on the
  batch's own factors (``sum_k |h_k|^3 + |w_k|^3 + |t_k|^3`` with the complex
  modulus, averaged over the batch), Adagrad as in the paper (Adam optional).

Early stopping runs on the filtered validation MRR (tail side, realistic ranks,
computed here with one GEMM per chunk; the same numbers as pykeen's
``tail.realistic`` metric, tested), the best epoch's embeddings are kept, and a
checkpoint file (``torch.save`` of plain tensors, read back with
``weights_only=True``) lets a run be resumed.
"""
from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from kgreason.cli import check_device
from kgreason.errors import UserError

if TYPE_CHECKING:  # pragma: no cover
    from .train import TrainConfig

__all__ = ["PRECISIONS", "OPTIMIZERS", "resolve_precision", "tail_scores", "batch_loss", "train_1n", "filtered_tail_ranks", "to_pykeen_model",
           "n3_penalty", "matmul_rate", "choose_rank", "probe_step_seconds", "CANDIDATE_RANKS", "flops_per_epoch",
           "sampled_batch_loss", "use_sampling", "budget_deadline", "VALID_CHUNK", "rank_chunk_rows", "PROBE_SHARE", "TrainResult",
           "resolve_device"]

#: bf16: GEMMs in bfloat16 (float32 accumulation); fp32: everything float32; auto: bf16 where the hardware has it.
PRECISIONS = ("auto", "bf16", "fp32")
#: Optimizers of the 1n loop (Adagrad as in Lacroix et al. 2018; Adam).
OPTIMIZERS = ("adagrad", "adam")
#: Ranks :func:`choose_rank` picks from (complex dimensions).
CANDIDATE_RANKS = (32, 64, 128, 192, 256, 384, 512, 768, 1000)


# The result of both training loops (kge.train's pykeen loop and train_1n here) and the device rule they share:
# defined here, below kge.train (which re-exports them), so that the 1-N loop needs nothing from kge.train.
@dataclass
class TrainResult:
    """Trained embeddings (complex64, ``entity`` (N, d), ``relation`` (R, d)) and run statistics."""

    entity: np.ndarray
    relation: np.ndarray
    config: TrainConfig
    losses: list[float]
    metrics: dict[str, Any]
    seconds: float
    device: str
    model: Any = field(default=None, repr=False)


def resolve_device(device: str) -> str:
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return check_device(device, "--device", allow_auto=True)  # cpu, cuda, cuda:N (usable), else UserError


def _cpu_has_bf16() -> bool:
    """True when the CPU has native bf16 dot products (AMX or AVX512-BF16), where oneDNN's bf16 GEMM wins."""
    try:
        flags = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return False
    return "amx_bf16" in flags or "avx512_bf16" in flags


def resolve_precision(precision: str, device: str) -> str:
    """``bf16`` or ``fp32`` for ``precision`` on ``device`` (``auto``: bf16 on CUDA with bf16 support or a bf16 CPU)."""
    import torch

    if precision not in PRECISIONS:
        raise UserError(f"--precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    if precision != "auto":
        return precision
    if device.startswith("cuda"):
        return "bf16" if torch.cuda.is_bf16_supported() else "fp32"
    return "bf16" if _cpu_has_bf16() else "fp32"


def use_sampling(candidates: int | None, num_entities: int) -> bool:
    """True when ``candidates`` sampled tails are fewer than all ``num_entities`` (else the full 1-N loss is cheaper)."""
    return candidates is not None and candidates < num_entities


def _split(x):
    d = x.shape[-1] // 2
    return x[..., :d], x[..., d:]


def n3_penalty(*factors):
    """N3 of complex factors stored as ``[re | im]`` rows: mean over the batch of ``sum_k |x_k|^3``, summed over factors."""
    total = 0.0
    for x in factors:
        re, im = _split(x)
        total = total + (re.square() + im.square()).pow(1.5).sum(dim=-1).mean()
    return total


def tail_scores(entity, relation, h, r, *, precision: str = "fp32"):
    """Scores (B, N) of every tail for queries ``(h, r)`` (B,): ``Re(<e_h * w_r, conj(e_t)>)`` as one real GEMM.

    ``entity`` (N, 2d) and ``relation`` (R, 2d) hold ``[re | im]`` rows, so
    ``[Re q | Im q] @ [Re E | Im E]^T`` is the score.  With ``precision="bf16"``
    the GEMM runs in bfloat16 (float32 accumulation) and the scores come back float32.
    """
    return _score_rows(entity[h], relation[r], entity, precision)


def _score_rows(e_h, w, tails, precision: str):
    """``Re(<e_h * w, conj(t)>)`` (B, T) for ``[re | im]`` rows ``e_h``, ``w`` (B, 2d) and ``tails`` (T, 2d).

    The query ``q = e_h * w`` is formed once; with ``precision="bf16"`` the GEMM
    runs in bfloat16 (float32 accumulation) and the scores come back float32.
    """
    import torch

    h_re, h_im = _split(e_h)
    w_re, w_im = _split(w)
    q = torch.cat([h_re * w_re - h_im * w_im, h_re * w_im + h_im * w_re], dim=-1)
    if precision == "bf16":
        return (q.to(torch.bfloat16) @ tails.to(torch.bfloat16).T).float()
    return q @ tails.T


def batch_loss(entity, relation, h, r, t, *, weight: float, precision: str = "fp32"):
    """``(loss, cross_entropy, n3)`` of one batch; ``entity`` (N, 2d) and ``relation`` (R, 2d) as ``[re | im]``.

    ``h, r, t`` are (B,) int64.  The loss is the mean over the batch of the
    softmax cross-entropy of the true tail against all N entities, plus
    ``weight`` times :func:`n3_penalty` of the batch's head, relation and tail
    factors.  With ``precision="bf16"`` the score GEMM (and so its two gradient
    GEMMs) runs in bfloat16; the cross-entropy always runs in float32.
    """
    import torch.nn.functional as F

    e_h, w, e_t = entity.index_select(0, h), relation.index_select(0, r), entity.index_select(0, t)
    ce = F.cross_entropy(_score_rows(e_h, w, entity, precision), t)
    n3 = n3_penalty(e_h, w, e_t)
    return ce + weight * n3, ce, n3


def sampled_batch_loss(entity, relation, h, r, t, *, candidates: int, weight: float, generator,
                       precision: str = "fp32", sparse: bool = True):
    """:func:`batch_loss` against a sampled candidate set instead of all N tails: ``(loss, ce, n3)``.

    The candidate set is the batch's true tails plus ``candidates`` entities
    drawn uniformly (with replacement, from ``generator``), deduplicated; each
    row's softmax runs over that set, so its other rows' tails are negatives
    too ("in-batch" negatives).  Uniform proposals need no log-Q correction
    (every candidate has the same proposal probability).  The cost of a step is
    ``B x 2d x (B + candidates)`` instead of ``B x 2d x N``, which is what makes
    100k+-entity graphs trainable in minutes.  With ``sparse=True`` the entity
    rows are read through ``F.embedding(..., sparse=True)``, so the entity
    gradient is a sparse tensor over the touched rows and Adagrad updates only
    those rows (a dense (N, 2d) optimizer step per batch would cost more than
    the GEMMs at 100k entities).
    """
    import torch
    import torch.nn.functional as F

    b = h.shape[0]
    neg = torch.randint(entity.shape[0], (candidates,), generator=generator).to(h.device)
    cand, inv = torch.unique(torch.cat([t, neg]), return_inverse=True)
    target = inv[:b]
    rows, rinv = torch.unique(torch.cat([h, cand]), return_inverse=True)
    emb = F.embedding(rows, entity, sparse=sparse)  # (U, 2d): the only entity rows this step touches
    # index_select, not []: its backward is an index_add (a scatter), the [] backward an index_put with
    # accumulate, which sorts on the CPU (measured 41 of 118 ms of a NELL-size step)
    e_h, e_c = emb.index_select(0, rinv[:b]), emb.index_select(0, rinv[b:])
    w = relation.index_select(0, r)
    ce = F.cross_entropy(_score_rows(e_h, w, e_c, precision), target)
    n3 = n3_penalty(e_h, w, e_c.index_select(0, target))
    return ce + weight * n3, ce, n3


def flops_per_epoch(num_triples: int, num_entities: int, rank: int, *, candidates: int | None = None,
                    batch_size: int = 1000) -> float:
    """GEMM FLOPs of one epoch: three (B x 2d x C) GEMMs per batch (scores, d/dq, d/dE), 2 FLOPs per multiply-add.

    ``C`` = N for the full 1-N loop; with sampled ``candidates``, at most
    ``batch_size + candidates`` (fewer after deduplication, counted as that bound).
    """
    cols = num_entities if candidates is None else min(num_entities, batch_size + candidates)
    return 3 * 2.0 * num_triples * cols * 2 * rank


def matmul_rate(rows: int, inner: int, cols: int, *, precision: str, device: str, seconds: float = 0.3) -> float:
    """Measured FLOP/s of a plain ``(rows, inner) @ (inner, cols)`` GEMM in ``precision`` on ``device``."""
    import torch

    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    g = torch.Generator(device="cpu").manual_seed(0)
    a = torch.randn(rows, inner, generator=g).to(device=device, dtype=dtype)
    b = torch.randn(cols, inner, generator=g).to(device=device, dtype=dtype)
    a @ b.T  # warm-up (oneDNN primitive creation)
    _sync(device)
    n, t0 = 0, time.perf_counter()
    while True:
        a @ b.T
        n += 1
        _sync(device)
        el = time.perf_counter() - t0
        if el >= seconds and n >= 2:
            return 2.0 * rows * inner * cols * n / el


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize()


def _train_step(entity, relation, optimizer, idx, *, weight: float, precision: str, candidates: int | None,
                generator, optimizer_name: str) -> float:
    """One forward/backward/optimizer step on the batch ``idx`` (B, 3); returns the loss (a float).

    Full 1-N scoring, or :func:`sampled_batch_loss` when ``candidates`` is
    below N (sparse entity gradients with Adagrad, which supports them).
    """
    import torch

    if use_sampling(candidates, entity.shape[0]):
        loss, _, _ = sampled_batch_loss(entity, relation, idx[:, 0], idx[:, 1], idx[:, 2], candidates=candidates,
                                        weight=weight, generator=generator, precision=precision,
                                        sparse=optimizer_name == "adagrad")
    else:
        loss, _, _ = batch_loss(entity, relation, idx[:, 0], idx[:, 1], idx[:, 2], weight=weight, precision=precision)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    # Adagrad's sparse path builds COO tensors and torch warns unless invariant checking is chosen
    # explicitly; the gradients come from autograd (valid by construction), so checks stay off
    with torch.sparse.check_sparse_tensor_invariants(enable=False):
        optimizer.step()
    return float(loss.detach())


def probe_step_seconds(kg, *, rank: int, batch_size: int, precision: str, device: str, optimizer: str = "adagrad",
                       steps: int = 5, candidates: int | None = None) -> float:
    """Median seconds of a real training step (forward, backward, optimizer) at ``rank``, after two warm-up steps."""
    import torch

    n, num_rel = kg.num_entities, kg.num_relations
    g = torch.Generator(device="cpu").manual_seed(0)
    entity = (torch.randn(n, 2 * rank, generator=g) * 1e-3).to(device).requires_grad_()
    relation = (torch.randn(num_rel, 2 * rank, generator=g) * 1e-3).to(device).requires_grad_()
    opt = _make_optimizer(optimizer, [entity, relation], 0.1)
    # a random batch, as in training: the first rows of kg.train share heads, and the scatter-add of
    # repeated heads in the backward pass made such a probe 2x slower than real steps
    pick = np.random.default_rng(0).choice(len(kg.train), size=min(batch_size, len(kg.train)), replace=False)
    rows = torch.as_tensor(np.array(kg.train[pick], dtype=np.int64), device=device)
    times = []
    for i in range(steps + 2):
        _sync(device)
        t0 = time.perf_counter()
        _train_step(entity, relation, opt, rows, weight=0.05, precision=precision, candidates=candidates,
                    generator=g, optimizer_name=optimizer)
        _sync(device)
        if i >= 2:  # two warm-up steps: oneDNN primitives, optimizer state, first-touch page faults
            times.append(time.perf_counter() - t0)
    return float(np.median(times))


#: Largest share of the time budget the second rank probe of :func:`choose_rank` may cost (bounded from above).
PROBE_SHARE = 0.1
#: Steps :func:`choose_rank` runs per probed rank (:func:`probe_step_seconds`: 2 warm-up + 5 timed).
_PROBE_STEPS = 7


def choose_rank(kg, *, minutes: float, min_epochs: int, batch_size: int, precision: str, device: str,
                optimizer: str = "adagrad", ranks=CANDIDATE_RANKS, candidates: int | None = None,
                max_rank: int | None = None) -> tuple[int, dict[str, Any]]:
    """The largest rank in ``ranks`` whose ``min_epochs`` epochs fit ``minutes``, by measurement.

    A step's time is linear in the rank (three GEMMs and the optimizer scale
    with ``2d``; the softmax over ``(B, N)`` scores does not), so real steps are
    timed at the smallest candidate and at the largest one whose probe costs at most
    :data:`PROBE_SHARE` of the budget, and the line through them predicts every other rank.
    GEMM FLOP counts alone mislead: with bf16 GEMMs the softmax and the optimizer step are most
    of an FB15k-237 step at rank 256.

    The probes are paid from the budget (:func:`kge.train.train_complex` starts it first).  When
    even the smallest rank cannot do ``min_epochs`` epochs, it is returned without a second probe;
    when no larger rank's probe is affordable, step time is taken as proportional to the rank (an
    upper bound: the line has a non-negative intercept), which errs towards smaller ranks.
    Returns ``(rank, info)``.  ``min_epochs`` is a planning figure only: the budget, not the epoch
    count, ends training (:func:`train_1n`), so on a machine busier than during the probes fewer
    epochs run.
    """
    if max_rank is not None:
        ranks = tuple(x for x in ranks if x <= max_rank) or ranks[:1]
    lo = ranks[0]
    budget_s = minutes * 60
    steps_per_epoch = math.ceil(len(kg.train) / batch_size)
    t_lo = probe_step_seconds(kg, rank=lo, batch_size=batch_size, precision=precision, device=device, optimizer=optimizer,
                              candidates=candidates)
    probed = {str(lo): round(t_lo, 4)}
    # MetaQA's 6-minute build timed 7 steps at rank 1000 before its budget started: 27 s each on a busy box
    fits_lo = t_lo * steps_per_epoch * min_epochs <= budget_s
    affordable = [r for r in ranks if r > lo and _PROBE_STEPS * t_lo * r / lo <= PROBE_SHARE * budget_s]
    if fits_lo and affordable:
        hi = affordable[-1]
        t_hi = probe_step_seconds(kg, rank=hi, batch_size=batch_size, precision=precision, device=device,
                                  optimizer=optimizer, candidates=candidates)
        probed[str(hi)] = round(t_hi, 4)
        slope = max(t_hi - t_lo, 0.0) / (hi - lo)
    else:
        slope = t_lo / lo  # t(r) <= t_lo * r / lo

    def epoch_seconds(rank: int) -> float:
        return (t_lo + slope * (rank - lo)) * steps_per_epoch

    rank = lo
    for cand in ranks:
        if epoch_seconds(cand) * min_epochs <= budget_s:
            rank = cand
    info = {"rank_chosen": rank, "predicted_seconds_per_epoch": round(epoch_seconds(rank), 1),
            "probe_step_seconds": probed, "min_epochs": min_epochs, "train_minutes": minutes}
    return rank, info


def _known_tails(known: np.ndarray, num_relations: int):
    """Sorted keys ``h * R + r`` with their tails, for filtering: (keys (E,), tails (E,)) sorted by key."""
    keys = known[:, 0].astype(np.int64) * num_relations + known[:, 1]
    order = np.argsort(keys, kind="stable")
    return keys[order], known[order, 2].astype(np.int64)


def filtered_tail_ranks(entity, relation, triples: np.ndarray, known: np.ndarray, *, num_relations: int,
                        chunk: int | None = None, precision: str = "fp32",
                        deadline: float | None = None) -> np.ndarray:
    """Realistic filtered tail ranks (E,) float64 of ``triples`` (E, 3) against all entities.

    Filtered: every other known tail of ``(h, r)`` (``known`` (K, 3), which
    must include ``triples``) is removed before ranking.  Realistic: ties
    count half (``1 + #greater + #equal / 2``), pykeen's "realistic" rank.
    With a ``deadline`` (a ``time.perf_counter()`` value) the ranking stops after the first chunk that
    ends past it and returns the ranks of the triples done so far (a prefix; at least one chunk).
    ``chunk``: triples per (chunk, N) score GEMM (default :func:`rank_chunk_rows`).
    """
    import torch

    if len(triples) == 0:
        return np.zeros(0)
    chunk = chunk or rank_chunk_rows(entity.shape[0])
    keys, tails = _known_tails(known, num_relations)
    device = entity.device
    out = np.empty(len(triples))
    with torch.no_grad():
        for s in range(0, len(triples), chunk):
            part = triples[s:s + chunk]
            h, r, t = (torch.tensor(part[:, i], dtype=torch.long, device=device) for i in range(3))
            scores = tail_scores(entity, relation, h, r, precision=precision)
            target = scores.gather(1, t[:, None])
            # filter: known tails of the same (h, r), the true tail itself excluded from the filter
            qk = part[:, 0].astype(np.int64) * num_relations + part[:, 1]
            lo, hi = np.searchsorted(keys, qk, "left"), np.searchsorted(keys, qk, "right")
            counts = hi - lo
            rows = np.repeat(np.arange(len(part)), counts)
            # positions lo[i] .. hi[i]-1 for every query i, in one pass
            cols = tails[np.repeat(lo - (np.cumsum(counts) - counts), counts) + np.arange(counts.sum())]
            keep = cols != part[rows, 2]
            scores[torch.as_tensor(rows[keep], device=device), torch.as_tensor(cols[keep], device=device)] = -math.inf
            greater = (scores > target).sum(1).double()
            equal = (scores == target).sum(1).double() - 1  # the target itself
            out[s:s + len(part)] = (1 + greater + equal / 2).cpu().numpy()
            if deadline is not None and time.perf_counter() > deadline:
                return out[:s + len(part)]
    return out


@dataclass
class _Curve:
    epochs: list[int]
    valid_mrr: list[float]
    loss: list[float]
    seconds: list[float]


def _make_optimizer(name: str, params, lr: float):
    """The torch optimizer ``name`` (one of :data:`OPTIMIZERS`, checked by TrainConfig) over ``params``."""
    import torch

    return {"adagrad": torch.optim.Adagrad, "adam": torch.optim.Adam}[name](params, lr=lr)


#: Validation triples ranked per GEMM chunk (and per check of the time budget) during training, at most.
VALID_CHUNK = 1024
#: Score entries of one ranking chunk, at most: 1 GiB of float32 (a million-entity KG ranks 256 triples a chunk;
#: 1,024 rows there held 4 GiB of scores plus their comparison masks).
RANK_CHUNK_ENTRIES = 1 << 28


def rank_chunk_rows(num_entities: int) -> int:
    """Triples per ranking chunk: :data:`VALID_CHUNK`, fewer when (rows, N) scores would pass
    :data:`RANK_CHUNK_ENTRIES` (at least 16)."""
    return max(16, min(VALID_CHUNK, RANK_CHUNK_ENTRIES // max(1, int(num_entities))))


def budget_deadline(minutes: float | None) -> float:
    """The ``time.perf_counter()`` value at which a budget of ``minutes`` starting now runs out (inf: none)."""
    return time.perf_counter() + minutes * 60 if minutes else math.inf


def train_1n(kg, config, *, progress: bool = True, on_epoch: Callable[[dict[str, Any]], None] | None = None,
             deadline: float | None = None):
    """Train ComplEx-N3 on ``kg.train`` with the 1-N loop; returns a :class:`kge.train.TrainResult`.

    ``config`` is a :class:`kge.train.TrainConfig` with ``training_loop="1n"``.
    The run ends after ``config.epochs`` epochs, when the validation MRR has not improved
    for ``config.patience`` evaluations, or when the time budget runs out; the best evaluated
    epoch's embeddings are returned.  ``kg.valid`` is the validation set (a seeded random sample of
    ``config.valid_max_triples``, in random order); with no validation edges the last epoch wins.

    The time budget ends at ``deadline`` (a ``time.perf_counter()`` value; default
    ``config.train_minutes`` from now, see :func:`budget_deadline`; :func:`kge.train.train_complex`
    starts it before the rank probes, which it pays for).  It is checked after every batch, so an
    epoch longer than the budget is cut short, and after every chunk of validation triples
    (:func:`rank_chunk_rows`): a validation that runs past it stops there and scores the epoch on the
    triples ranked so far (a random subset, since the order is random), and training stops after it.  At least one
    batch is trained and one chunk validated, so the budget is kept to within one batch and one
    validation chunk (plus a checkpoint, when one is written).  ``config.min_epochs`` plays no part
    here: it only sizes the rank (:func:`choose_rank`).
    """
    import torch
    from kgreason.progress import progress_bar

    device = resolve_device(config.device)
    precision = resolve_precision(config.precision, device)
    if config.num_threads:
        torch.set_num_threads(config.num_threads)
    n, num_rel, d = kg.num_entities, kg.num_relations, config.rank
    gen = torch.Generator(device="cpu").manual_seed(config.seed)
    entity = (torch.randn(n, 2 * d, generator=gen) * config.init_std).to(device).requires_grad_()
    relation = (torch.randn(num_rel, 2 * d, generator=gen) * config.init_std).to(device).requires_grad_()
    optimizer = _make_optimizer(config.optimizer, [entity, relation], config.lr)
    train = torch.as_tensor(np.array(kg.train, dtype=np.int64), device=device)  # a copy: kg arrays are read-only
    known = np.concatenate([kg.train, kg.missing]) if len(kg.missing) else np.asarray(kg.train)
    valid = np.asarray(kg.valid)
    if config.valid_max_triples is not None and len(valid) > config.valid_max_triples:
        pick = np.random.default_rng(config.seed).choice(len(valid), size=config.valid_max_triples, replace=False)
        valid = valid[np.sort(pick)]
    # random order: a validation cut short by the budget then ranks a random subset, not the file's first relations
    valid = valid[np.random.default_rng([config.seed, 1]).permutation(len(valid))]
    start_epoch, curve = 0, _Curve([], [], [], [])
    best = {"mrr": -1.0, "epoch": 0, "entity": None, "relation": None}
    ckpt = Path(config.checkpoint) if config.checkpoint else None
    if ckpt is not None and ckpt.is_file():
        start_epoch, curve, best = _resume(ckpt, config, entity, relation, optimizer, kg, gen)

    if deadline is None:
        deadline = budget_deadline(config.train_minutes)
    t0 = time.perf_counter()
    steps_per_epoch = math.ceil(len(train) / config.batch_size)
    # one bar per epoch: with a time budget the epoch count is a cap, not a forecast
    bar = progress_bar(total=steps_per_epoch, disable=not progress, unit="batch", file=sys.stderr, dynamic_ncols=True,
               leave=False)
    stale, stop_reason, rows_trained, valid_cut = 0, "epochs", 0, None
    try:
        for epoch in range(start_epoch, config.epochs):
            perm = torch.randperm(len(train), generator=gen).to(device)
            bar.reset()
            left = f", {max(0.0, deadline - time.perf_counter()) / 60:.1f} min left" if math.isfinite(deadline) else ""
            bar.set_description(f"epoch {epoch + 1}/{config.epochs}{left}", refresh=False)
            total, count = 0.0, 0
            for s in range(0, len(train), config.batch_size):
                idx = train[perm[s:s + config.batch_size]]
                value = _train_step(entity, relation, optimizer, idx, weight=config.regularizer_weight,
                                    precision=precision, candidates=config.candidates, generator=gen,
                                    optimizer_name=config.optimizer)
                if not math.isfinite(value):
                    raise UserError(f"training diverged (the loss became {value}) at --lr {config.lr:g}; "
                                    f"try a smaller --lr (e.g. {config.lr / 10:g})")
                total += value * len(idx)
                count += len(idx)
                rows_trained += len(idx)
                bar.update(1)
                bar.set_postfix(loss=f"{value:.4f}",
                                best_mrr=f"{best['mrr']:.3f}" if best["mrr"] >= 0 else "-", refresh=False)
                if time.perf_counter() > deadline:
                    stop_reason = "time budget"
                    break
            done_epoch = epoch + 1
            curve.epochs.append(done_epoch)
            curve.loss.append(total / max(count, 1))
            curve.seconds.append(time.perf_counter() - t0)
            last = stop_reason != "epochs" or done_epoch == config.epochs
            evaluate = len(valid) and (done_epoch % config.eval_every == 0 or last)
            mrr = float("nan")
            if evaluate:
                ranks = filtered_tail_ranks(entity.detach(), relation.detach(), valid, known,
                                            num_relations=num_rel, precision="fp32",
                                            deadline=deadline)
                if len(ranks) < len(valid):
                    valid_cut = {"epoch": done_epoch, "ranked": int(len(ranks))}
                    stop_reason = "time budget"
                mrr = float(np.mean(1.0 / ranks))
                if mrr > best["mrr"]:
                    best = {"mrr": mrr, "epoch": done_epoch, "entity": entity.detach().clone(),
                            "relation": relation.detach().clone()}
                    stale = 0
                else:
                    stale += 1
            curve.valid_mrr.append(mrr)
            info = {"epoch": done_epoch, "loss": curve.loss[-1], "valid_mrr": mrr, "seconds": curve.seconds[-1]}
            if progress:
                bar.write(f"epoch {done_epoch}: loss {info['loss']:.4f}"
                          + (f", valid MRR {mrr:.4f}" if evaluate else "")
                          + (f" (on {valid_cut['ranked']:,} of {len(valid):,}: time budget)"
                             if valid_cut and valid_cut["epoch"] == done_epoch else "")
                          + f" ({info['seconds']:.0f} s)", file=sys.stderr)
            if on_epoch is not None:
                on_epoch(info)
            if ckpt is not None:
                _save_checkpoint(ckpt, done_epoch, entity, relation, optimizer, curve, best, config, gen)
            if stop_reason == "epochs" and time.perf_counter() > deadline:
                stop_reason = "time budget"  # spent by the validation (or checkpoint) after the epoch's last batch
            if stop_reason != "epochs":
                break
            if evaluate and config.patience and stale >= config.patience:
                stop_reason = f"early stop (no better validation MRR in {config.patience} evaluations)"
                break
    finally:
        bar.close()
    seconds = time.perf_counter() - t0
    if best["entity"] is None:
        best = {"mrr": float("nan"), "epoch": curve.epochs[-1] if curve.epochs else 0,
                "entity": entity.detach(), "relation": relation.detach()}
    ent_c = _to_complex(best["entity"])
    rel_c = _to_complex(best["relation"])
    sampled = use_sampling(config.candidates, n)
    flops = flops_per_epoch(rows_trained, n, d, candidates=config.candidates if sampled else None,
                            batch_size=config.batch_size)
    metrics: dict[str, Any] = {
        "train_seconds": round(seconds, 3),
        "training_loop": (f"1n over {config.candidates} sampled candidates + the batch's tails (kge.complex_n3)"
                          if sampled else "1n (kge.complex_n3)"),
        "candidates": config.candidates if sampled else None,
        "precision": precision,
        "stop_reason": stop_reason,
        "best_epoch": best["epoch"],
        "best_valid_mrr": None if math.isnan(best["mrr"]) else round(best["mrr"], 5),
        "valid_triples": int(len(valid)),
        # the validation the time budget cut short (its epoch, the triples ranked), or None
        "valid_cut": valid_cut,
        "curve": {"epoch": curve.epochs, "valid_mrr": [None if math.isnan(x) else round(x, 5) for x in curve.valid_mrr],
                  "loss": [round(x, 5) for x in curve.loss], "seconds": [round(x, 2) for x in curve.seconds]},
        # useful GEMM FLOPs per second of the whole loop (softmax, gathers, optimizer and validation included)
        "gemm_gflops_per_s": round(flops / seconds / 1e9, 2) if seconds > 0 else None,
    }
    return TrainResult(entity=ent_c, relation=rel_c, config=config, losses=list(curve.loss), metrics=metrics,
                       seconds=seconds, device=device)


def _to_complex(x) -> np.ndarray:
    d = x.shape[1] // 2
    a = x.detach().float().cpu().numpy()
    return (a[:, :d] + 1j * a[:, d:]).astype(np.complex64)


_CKPT_FORMAT = 1


def _save_checkpoint(path: Path, epoch: int, entity, relation, optimizer, curve: _Curve, best, config, gen) -> None:
    import torch

    from kgreason.files import open_output

    state = {
        "format": _CKPT_FORMAT, "epoch": epoch, "rank": config.rank,
        "entity": entity.detach().cpu(), "relation": relation.detach().cpu(),
        "optimizer": optimizer.state_dict(),
        "generator": gen.get_state(),  # so a resumed run shuffles the next epochs exactly as an uninterrupted one
        "curve": {"epochs": curve.epochs, "valid_mrr": curve.valid_mrr, "loss": curve.loss, "seconds": curve.seconds},
        "best_mrr": best["mrr"], "best_epoch": best["epoch"],
        "best_entity": None if best["entity"] is None else best["entity"].cpu(),
        "best_relation": None if best["relation"] is None else best["relation"].cpu(),
    }
    with open_output(path, what="checkpoint", binary=True) as f:  # written to a temporary file, then renamed
        torch.save(state, f)


def _resume(path: Path, config, entity, relation, optimizer, kg, gen):
    """Load a checkpoint written by :func:`_save_checkpoint` (plain tensors only: ``weights_only=True``)."""
    import torch

    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any unreadable file is the user's to fix
        raise UserError(f"--checkpoint {path}: not a readable checkpoint ({type(exc).__name__})") from None
    if not isinstance(state, dict) or state.get("format") != _CKPT_FORMAT:
        raise UserError(f"--checkpoint {path}: not a checkpoint of this trainer (format {_CKPT_FORMAT})")
    if tuple(state["entity"].shape) != tuple(entity.shape) or tuple(state["relation"].shape) != tuple(relation.shape):
        raise UserError(f"--checkpoint {path}: shapes {tuple(state['entity'].shape)}/{tuple(state['relation'].shape)} "
                        f"do not fit this KG at --rank {config.rank} ({kg.num_entities} entities, "
                        f"{kg.num_relations} relations)")
    with torch.no_grad():
        entity.copy_(state["entity"])
        relation.copy_(state["relation"])
    optimizer.load_state_dict(state["optimizer"])
    gen.set_state(state["generator"])
    c = state["curve"]
    curve = _Curve(list(c["epochs"]), list(c["valid_mrr"]), list(c["loss"]), list(c["seconds"]))
    dev = entity.device
    best = {"mrr": state["best_mrr"], "epoch": state["best_epoch"],
            "entity": None if state["best_entity"] is None else state["best_entity"].to(dev),
            "relation": None if state["best_relation"] is None else state["best_relation"].to(dev)}
    return int(state["epoch"]), curve, best


def to_pykeen_model(entity: np.ndarray, relation: np.ndarray, *, device: str = "cpu"):
    """A pykeen ``ComplEx`` holding complex64 embeddings ``entity`` (N, d) and ``relation`` (R, d)."""
    import torch
    from pykeen.models import ComplEx
    from pykeen.triples import CoreTriplesFactory

    n, d = entity.shape
    num_rel = relation.shape[0]
    factory = CoreTriplesFactory.create(torch.zeros((1, 3), dtype=torch.long), num_entities=n, num_relations=num_rel)
    model = ComplEx(triples_factory=factory, embedding_dim=d, random_seed=0).to(device)
    with torch.no_grad():
        for rep, values in ((model.entity_representations[0], entity), (model.relation_representations[0], relation)):
            weight = rep._embeddings.weight
            src = torch.as_tensor(np.asarray(values, dtype=np.complex64))
            if weight.is_complex():
                weight.copy_(src.to(weight.device))
            else:  # pykeen stores complex embeddings as real (.., 2d) views on some versions
                weight.copy_(torch.view_as_real(src).reshape(weight.shape).to(weight.device))
    return model
