"""Batched single-source shortest paths over a relation multigraph (``kgreason::dijkstra``).

The graph is a CSR adjacency: ``indptr`` (N+1,) int64 and, per edge, ``tails``
and ``rels`` (E,) int32, each head's out-edges sorted by (tail, relation) so
that parallel edges are adjacent (the kernel collapses each run of equal tails
to its cheapest edge, lowest relation id on ties; an unsorted graph gives the
same distances but may scan more edges and break pred ties differently).  A
path's cost is the sum of its relations' ``relation_costs``.

Semantics (``engine.paths`` builds the graph from triples and adds names):

* ``max_hops=None``: ordinary shortest paths.  ``max_hops=H``: the cheapest
  path among paths with **at most** ``H`` edges (``inf`` when every path is
  longer); the search state is ``(entity, edges used)``.
* ``targets``: the search of a source stops once all of its targets are
  settled.  Target entries of ``dist`` are then exact; other entries are upper
  bounds (or ``inf``).
* ``heuristic``: A*, a lower bound ``h(v)`` of the remaining cost from ``v`` to
  the nearest target (admissible; consistency is not required: improved nodes
  are re-opened).  Meant for use with ``targets``.
* Distances are float32 sums of the relation costs along the path, identical
  (bit for bit) whatever the ``heap`` strategy.  Among equal-cost paths,
  Dijkstra reports the first one settled; the batched sweeps (``heap="auto"``
  without targets, ``"sweep"``) report, for each entity, the predecessor with the
  smallest distance among those whose edge attains it (lowest entity id, then
  relation id, on ties); both are real paths of the reported cost.

Backends as for every op (:mod:`ops._backend`): ``"cpp"`` (the CPU kernel,
sources searched in parallel) or ``"reference"`` (:mod:`ops.paths_reference`,
pure Python, any device).
"""
from __future__ import annotations

import operator
from typing import NamedTuple, Sequence

import torch

from kgreason.errors import UserError, unknown_name

from . import paths_reference
from ._backend import resolve_backend

__all__ = ["dijkstra", "ShortestPathTensors", "check_relation_costs", "HEAPS"]

#: Search strategies of the cpp kernel (name -> the op's ``heap`` code).
#: ``"auto"`` (default): batched label-correcting sweeps (16 sources at a time,
#: no heap) for unbounded searches without targets or heuristic and >= 8 sources,
#: else Dijkstra with the radix heap.  ``"sweep"``: the sweeps for every unbounded
#: search (hop-bounded ones use the radix heap).  ``"radix"`` / ``"binary"`` /
#: ``"4-ary"``: Dijkstra with that priority queue; the radix heap needs monotone
#: keys, so A* searches (with a heuristic) use the 4-ary heap.  Distances are
#: identical whichever is used (csrc/cpu/dijkstra_cpu.cpp says why).
HEAPS = {"auto": 1, "sweep": 3, "radix": 0, "binary": 2, "4-ary": 4}


class ShortestPathTensors(NamedTuple):
    """Outputs of :func:`ops.dijkstra` for ``S`` sources over ``N`` entities.

    Attributes:
        dist: (S, N) float32, ``inf`` where unreachable (within ``max_hops``).
        pred_entity / pred_relation: int32, -1 for none, ``None`` when not requested.
            Unbounded: (S, N), the last edge (pred_entity[s, v], pred_relation[s, v], v).
            Hop-bounded: (S, H+1, N) indexed by the state (v, k) = v reached with k
            edges; its predecessor state is (pred, k-1).
        hops: (S, N) int32 edges of the reported path (-1 unreachable); hop-bounded only, else ``None``.
    """

    dist: torch.Tensor
    pred_entity: torch.Tensor | None
    pred_relation: torch.Tensor | None
    hops: torch.Tensor | None


def check_relation_costs(costs, num_relations: int | None = None, names: Sequence[str] | None = None) -> torch.Tensor:
    """Validated (R,) float32 CPU costs: one per relation, non-negative, not NaN (``inf`` = unusable).

    ``costs`` may be a tensor, an array or a list; ``num_relations`` (when given)
    is the required length R; ``names`` (optional) name the offending relation
    in the error message.
    """
    try:
        c = torch.as_tensor(costs, dtype=torch.float64, device="cpu") if not isinstance(costs, torch.Tensor) \
            else costs.detach().to("cpu", torch.float64)
    except (TypeError, ValueError, RuntimeError) as exc:
        raise UserError(f"relation_costs: expected numbers, got {type(costs).__name__} ({exc})") from None
    if c.dim() != 1 or (num_relations is not None and c.shape[0] != num_relations):
        want = "R" if num_relations is None else num_relations
        raise UserError(f"relation_costs: expected shape ({want},) (one per relation), got {tuple(c.shape)}")
    bad = torch.nonzero(~(c >= 0)).flatten()
    if len(bad):
        r = int(bad[0])
        name = f"{names[r]!r} (id {r})" if names is not None else f"id {r}"
        kind = "NaN" if torch.isnan(c[r]) else "negative"
        raise UserError(f"relation_costs: cost of relation {name} is {kind} ({float(c[r])}); costs must be non-negative")
    return c.to(torch.float32)


def _check_index_tensor(x: object, name: str, n: int, *, pad: bool = False) -> torch.Tensor:
    """An int64 tensor of entity ids in [0, n) (or -1 padding when ``pad``)."""
    if not isinstance(x, torch.Tensor):
        raise UserError(f"{name}: expected a torch.Tensor of entity ids, got {type(x).__name__}")
    if x.numel() == 0:
        return x.to(torch.int64)
    if x.dtype.is_floating_point or x.dtype.is_complex or x.dtype == torch.bool:
        raise UserError(f"{name}: expected integer entity ids, got dtype {x.dtype}")
    x = x.to(torch.int64)
    lo = -1 if pad else 0
    bad = torch.nonzero((x.reshape(-1) < lo) | (x.reshape(-1) >= n)).flatten()
    if len(bad):
        what = f"[0, {n}) (-1 = padding)" if pad else f"[0, {n})"
        raise UserError(f"{name}: entity id {int(x.reshape(-1)[bad[0]])} out of range {what}")
    return x.contiguous()


def _check_graph(indptr, tails, rels, num_relations: int, validate: bool) -> int:
    """Check the CSR arrays; returns N.  ``validate`` adds the O(E) value checks."""
    for name, t, dtype in (("indptr", indptr, torch.int64), ("tails", tails, torch.int32), ("rels", rels, torch.int32)):
        if not isinstance(t, torch.Tensor):
            raise UserError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 1 or t.dtype != dtype:
            raise UserError(f"{name}: expected a 1-D {dtype} tensor, got {t.dtype} of shape {tuple(t.shape)}")
    if indptr.numel() < 1:
        raise UserError("indptr: expected N+1 >= 1 entries, got 0")
    if tails.numel() != rels.numel():
        raise UserError(f"tails/rels: expected one entry per edge each, got {tails.numel()} and {rels.numel()}")
    n, e = indptr.numel() - 1, tails.numel()
    if validate:
        if int(indptr[0]) != 0 or int(indptr[-1]) != e:
            raise UserError(f"indptr: must start at 0 and end at E={e}, got {int(indptr[0])}..{int(indptr[-1])}")
        if n and bool((indptr[1:] < indptr[:-1]).any()):
            raise UserError("indptr: must be non-decreasing")
        if e:
            lo, hi = int(tails.min()), int(tails.max())
            if lo < 0 or hi >= n:
                raise UserError(f"tails: entity ids must lie in [0, {n}), got {lo}..{hi}")
            lo, hi = int(rels.min()), int(rels.max())
            if lo < 0 or hi >= num_relations:
                raise UserError(f"rels: relation ids must lie in [0, {num_relations}) (one cost each), got {lo}..{hi}")
    return n


def dijkstra(
    indptr: torch.Tensor,
    tails: torch.Tensor,
    rels: torch.Tensor,
    relation_costs,
    sources: torch.Tensor,
    *,
    targets: torch.Tensor | None = None,
    heuristic: torch.Tensor | None = None,
    max_hops: int | None = None,
    return_predecessors: bool = True,
    heap: str = "auto",
    backend: str | None = None,
    validate: bool = True,
) -> ShortestPathTensors:
    """Shortest paths from every source over a CSR multigraph (semantics: the module docstring).

    Args:
        indptr, tails, rels: the graph, (N+1,) int64 and (E,) int32 each; one device.
        relation_costs: (R,) non-negative costs (``inf`` = relation unusable); tensor, array or list.
        sources: (S,) int64 entity ids (duplicates allowed).
        targets: None, (T,) shared or (S, T) per source int64 entity ids, ``-1`` = padding.
        heuristic: None, (N,) shared or (S, N) per source float32, non-negative admissible bound.
        max_hops: None or ``H >= 0``.
        return_predecessors: also return the predecessor tensors.
        heap: the cpp kernel's strategy (:data:`HEAPS`): ``"auto"`` (default), ``"sweep"``,
            ``"radix"``, ``"binary"`` or ``"4-ary"`` (ignored by the reference); distances are
            identical, only speed (and the tie-breaking between equal-cost paths) differs.
        backend: ``"cpp"``, ``"reference"`` or None (module default, see :func:`ops.set_backend`).
        validate: check the graph's values (offsets, id ranges: one O(E) pass); shapes,
            dtypes and every other argument are always checked.

    Returns:
        :class:`ShortestPathTensors` on the inputs' device.
    """
    costs = check_relation_costs(relation_costs)
    n = _check_graph(indptr, tails, rels, len(costs), validate)
    device = indptr.device
    for name, t in (("tails", tails), ("rels", rels)):
        if t.device != device:
            raise UserError(f"{name}: is on {t.device} but indptr is on {device}")
    src = _check_index_tensor(sources, "sources", n)
    if src.dim() != 1:
        raise UserError(f"sources: expected shape (S,), got {tuple(src.shape)}")
    if max_hops is not None:
        try:
            hops_int = operator.index(max_hops)  # ints and numpy integers, not floats
        except TypeError:
            hops_int = -1
        if isinstance(max_hops, bool) or hops_int < 0:
            raise UserError(f"max_hops: expected None or an integer >= 0, got {max_hops!r}")
        max_hops = hops_int
        if (max_hops + 1) * n >= 1 << 32:
            raise UserError(f"max_hops: (max_hops + 1) * N must be < 2^32, got ({max_hops} + 1) * {n}")
    tgt = None
    if targets is not None:
        tgt = _check_index_tensor(targets, "targets", n, pad=True)
        if tgt.numel() and (tgt.dim() not in (1, 2) or (tgt.dim() == 2 and tgt.shape[0] != len(src))):
            raise UserError(f"targets: expected shape (T,) or (S={len(src)}, T), got {tuple(tgt.shape)}")
        if tgt.numel() == 0:
            tgt = None  # no targets: search everything
    heur = None
    if heuristic is not None:
        if not isinstance(heuristic, torch.Tensor):
            raise UserError(f"heuristic: expected a torch.Tensor, got {type(heuristic).__name__}")
        heur = heuristic.to(torch.float32).contiguous()
        if tuple(heur.shape) not in ((n,), (len(src), n)):
            raise UserError(f"heuristic: expected shape (N={n},) or (S={len(src)}, N), got {tuple(heur.shape)}")
        if not bool((heur >= 0).all()):
            raise UserError("heuristic: entries must be non-negative and not NaN")
    if heap not in HEAPS:
        raise unknown_name("heap", str(heap), list(HEAPS))
    for name, t in (("sources", src), ("targets", tgt), ("heuristic", heur)):
        if t is not None and t.device != device:
            raise UserError(f"{name}: is on {t.device} but the graph is on {device}")
    if resolve_backend(backend, "dijkstra", device) == "reference":
        dist, pe, pr, hops = paths_reference.dijkstra(indptr, tails, rels, costs, src, tgt, heur, max_hops,
                                                      bool(return_predecessors))
    else:
        dist, pe, pr, hops = torch.ops.kgreason.dijkstra(
            indptr,
            tails,
            rels,
            costs.to(device),
            src,
            tgt if tgt is not None else torch.empty(0, dtype=torch.int64, device=device),
            heur if heur is not None else torch.empty(0, dtype=torch.float32, device=device),
            -1 if max_hops is None else max_hops,
            bool(return_predecessors),
            HEAPS[heap],
        )
    return ShortestPathTensors(
        dist=dist,
        pred_entity=pe if return_predecessors else None,
        pred_relation=pr if return_predecessors else None,
        hops=hops if max_hops is not None else None,
    )

