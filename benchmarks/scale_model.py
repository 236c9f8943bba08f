"""A cost model of sharded query answering (engine.exec.sharded): memory per rank, bytes per hop, latency per hop.

    python benchmarks/scale_model.py                  # the predictions table of benchmarks/results/distributed.md
    python benchmarks/scale_model.py --plot out.png   # and the plot (measured points and the model's lines)

Each term is a measured constant times a size, fitted to the measurements in
benchmarks/results/distributed.md (FB15k-237, eager, P = 1, 2, 3) and
benchmarks/results/large_kg_1m.md (the 1M-entity synthetic KG, lazy, P = 1 and 2);
``tests/test_scale_model.py`` checks that the model reproduces every measured point within
:data:`TOLERANCE`.  The predictions for larger KGs on 8 GPUs are extrapolations of those constants:
they say what dominates and where the memory goes, not a promise of seconds.

Eager artifact, P ranks (entities split into P column blocks balanced by entries):

* memory per rank = ``EAGER_BASE + EAGER_BYTES_PER_ENTRY * entries / P``: the rank's shard (int32
  column index + float32 value + per-relation tails, ~9 bytes an entry) and the transpose its kernel's
  pull reads (~9 more); one process holds the CSR and its transpose (16 bytes an entry) and more
  Python state, which the single fitted base absorbs (the fit's residuals are the test's error);
* bytes received per exchanging hop = ``(P - 1) * imbalance(P) * 12 * F / P``: the sparse frontier
  (row, entity, value: 12 bytes an active entry) all-gathered, gloo padding every rank's part to the
  largest (``imbalance`` grows with P: :data:`IMBALANCE_PER_RANK`); ``F`` is the frontier's active
  entries over the batch (measured per KG: :data:`FB_FRONTIER_ENTRIES`).

Lazy artifact (rows computed from the embeddings on demand), one process:

* memory = ``LAZY_BASE + embeddings (N + R) x rank x 8 bytes + observed edges x LAZY_BYTES_PER_EDGE +
  row cache``, the row cache at most ``--row-cache-gb`` (two measured points, so this line is a fit).

Lazy artifact, P > 1 ranks (each loads its shard folder from ``kge.shard``: its block's entity embeddings,
the relations', its known edges at 12 bytes and the KG's names):

* memory per rank = ``SHARD_LAZY_BASE + (N / P + R) x rank x 8 + edges / P x SHARD_LAZY_BYTES_PER_EDGE + row
  cache``: a line through the two ranks of the 1M KG at P = 2 (10.5 M and 7.5 M known edges), so also a
  fit; the 1M KG's other P = 2 point (rank 0 right after the load) checks it.  One process loads the whole
  artifact instead (int64 triples and their index: 98 bytes an edge), hence the jump from P = 1 to P = 2.

:func:`measured_points` lists every measured memory point with the model's value for it: the plot draws
those points, and ``tests/test_scale_model.py`` checks each within :data:`TOLERANCE`.

Latency of a hop at P ranks = ``compute / P + ALPHA + bytes / BANDWIDTH``: the local kernel work
splits with the entries, the collective costs a latency ``ALPHA`` plus the bytes over the link.
On the GPU prediction ``compute`` is the projection time measured on an H200
(benchmarks/results/ops_cuda_h200.md: 0.13-0.37 ms for a 1,024-row batch) scaled by entries, ``ALPHA``
NCCL's all-gather latency and ``BANDWIDTH`` NVLink's; both are assumptions, stated in :data:`GPU`.
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass

MIB = 1 << 20
GIB = 1 << 30
#: Largest relative error the model may make on a measured point (tests/test_scale_model.py).
TOLERANCE = 0.10

# ------------------------------------------------------------------ constants fitted to the measurements
#: FB15k-237 eager (benchmarks/results/distributed.md, second slice): entries, and peak RSS (MiB) per rank.
FB = dict(entities=14_505, relations=474, entries=129_401_376)
FB_PEAK_MIB = {1: (2_619, 2_644), 2: (1_430, 1_504), 3: (1_086, 1_126)}  # (lowest, highest) rank over rounds
#: Mean bytes received per rank per exchanging projection hop (KiB), same runs.
FB_HOP_KIB = {2: 1_992, 3: 2_983}
#: Least-squares line through the FB points (memory against entries / P).
EAGER_BYTES_PER_ENTRY = 18.5
EAGER_BASE = 346 * MIB
#: Frontier active entries per exchanging hop over the batch of 1,008 FB queries: 2 x 1,992 KiB / 12 B
#: at P = 2 (imbalance 1 there by definition of F).
FB_FRONTIER_ENTRIES = 2 * FB_HOP_KIB[2] * 1024 / 12
#: gloo pads to the largest part: at P = 3 the parts are ~12 % apart (2,983 KiB where even parts give 2,656).
IMBALANCE_PER_RANK = 0.12

#: Lazy, one process, after loading (``Engine.load``; rank 32 on both): two points, so the line through them
#: (a base and bytes per observed edge: the int64 triples, their index, the observed-cell lookup) is a fit,
#: not a check.  The 120k-entity synthetic KG (1.5 M observed edges with inverses): 0.54 GiB peak for
#: ``engine.answer`` of one 2p query (benchmarks/results/kge_train_large.md); the 1M-entity one (18 M):
#: 2.25 GiB after ``Engine.load`` (benchmarks/results/large_kg_1m.md).
LAZY_BASE = 384 * MIB
LAZY_BYTES_PER_EDGE = 98
KG120K_PEAK_MIB = 553
KG1M_PEAK_MIB = 2_304
KG1M_RANK = 32
KG1M_ROW_CACHE_GB = 0.0  # measured right after the load: no rows computed yet
#: The 1M KG, one process: after the load (2,304 MiB, dist3 and again dist5b) and after its first 13 queries
#: (2,489 MiB, dist4: a few rows cached).
KG1M_P1_MIB = (2_304, 2_489)
#: The 1M KG at P = 2 (benchmarks/results/distributed.md, dist4): (known edges of the rank, peak RSS MiB after 13
#: queries) for rank 0 and rank 1; and rank 0 right after loading its shard (dist5b's 112-query run).
KG1M_P2_RANKS = ((10_500_000, 1_192), (7_500_000, 1_148))
KG1M_P2_AFTER_LOAD_MIB = 1_126
#: The line through KG1M_P2_RANKS: 44 MiB more for 3 M more edges, the rest the base (the names of 1M entities,
#: torch, gloo).
SHARD_LAZY_BYTES_PER_EDGE = (KG1M_P2_RANKS[0][1] - KG1M_P2_RANKS[1][1]) * MIB / (KG1M_P2_RANKS[0][0] - KG1M_P2_RANKS[1][0])
SHARD_LAZY_BASE = KG1M_P2_RANKS[0][1] * MIB - (1_000_000 / 2 + 2_000) * KG1M_RANK * 8 \
    - SHARD_LAZY_BYTES_PER_EDGE * KG1M_P2_RANKS[0][0]


@dataclass(frozen=True)
class KG:
    """What the model needs of a KG: sizes, and (eager) the stored matrix entries."""

    name: str
    entities: int
    relations: int  # with inverses
    edges: int  # observed, with inverses
    entries: float | None = None  # eager matrices' entries; None: lazy


@dataclass(frozen=True)
class Machine:
    """A rank's link and compute: ``alpha_s`` per collective, ``bandwidth`` bytes/s, and the projection
    rate (matrix entries a rank's kernel reads per second)."""

    name: str
    alpha_s: float
    bandwidth: float
    entries_per_s: float


#: The lent H200 (one measured GPU; 8 of them on NVLink assumed): push projection of a 1,024-row batch
#: over FB15k-237's stack took 0.18 ms (ops_cuda_h200.md) for ~0.27 M entries read -> ~1.5e9 entries/s;
#: NCCL all-gather latency ~30 us, NVLink 4 at ~300 GB/s per direction achieved (assumptions).
GPU = Machine("8 x H200 (NVLink)", alpha_s=30e-6, bandwidth=300e9, entries_per_s=1.5e9)
#: This 2-core machine over gloo/loopback (distributed.md: 0.6 s of waiting at the gathers over ~18 hops
#: x rounds; the kernel read ~129 M entries per ~1.2 s).
CPU = Machine("2-core CPU, gloo loopback", alpha_s=2e-3, bandwidth=1e9, entries_per_s=1.1e8)


def imbalance(p: int) -> float:
    """Largest part over the mean part of a P-way entries-balanced split of the frontier."""
    return 1.0 + IMBALANCE_PER_RANK * max(0, p - 2)


def eager_memory_per_rank(entries: float, p: int) -> float:
    """Peak bytes of one rank holding ``entries / p`` matrix entries (shard + transpose)."""
    return EAGER_BASE + EAGER_BYTES_PER_ENTRY * entries / p


def lazy_memory(kg: KG, rank: int, *, row_cache_gb: float = 0.0, p: int = 1, edges: float | None = None) -> float:
    """Peak bytes of a lazy artifact's process (``p`` > 1: one rank, from its shard folder, holding ``edges`` known
    edges, default an even ``kg.edges / p``)."""
    emb = (kg.entities / p + kg.relations) * rank * 8
    if p == 1:
        return LAZY_BASE + emb + LAZY_BYTES_PER_EDGE * kg.edges + row_cache_gb * GIB
    edges = kg.edges / p if edges is None else edges
    return SHARD_LAZY_BASE + emb + SHARD_LAZY_BYTES_PER_EDGE * edges + row_cache_gb * GIB


def measured_points() -> list[tuple[str, int, float, float]]:
    """Every measured memory point: ``(series, P, measured MiB, the model's MiB)`` (what the plot draws and the test
    checks).  The lazy lines are fits (module doc): their points check the fit's residuals, not a prediction."""
    out = [("FB15k-237 eager", p, m, eager_memory_per_rank(FB["entries"], p) / MIB)
           for p, pair in FB_PEAK_MIB.items() for m in pair]
    out += [("1M lazy", 1, m, lazy_memory(KG1M, KG1M_RANK) / MIB) for m in KG1M_P1_MIB]
    out += [("1M lazy", 2, m, lazy_memory(KG1M, KG1M_RANK, p=2, edges=e) / MIB) for e, m in KG1M_P2_RANKS]
    out.append(("1M lazy", 2, KG1M_P2_AFTER_LOAD_MIB, lazy_memory(KG1M, KG1M_RANK, p=2, edges=KG1M_P2_RANKS[0][0]) / MIB))
    out.append(("120k lazy", 1, KG120K_PEAK_MIB, lazy_memory(KG120K, KG1M_RANK) / MIB))
    return out


def hop_bytes(frontier_entries: float, p: int) -> float:
    """Bytes one rank receives in an exchanging hop whose frontier has ``frontier_entries`` active entries."""
    if p <= 1:
        return 0.0
    return (p - 1) * imbalance(p) * 12 * frontier_entries / p


def hop_latency(entries_read: float, frontier_entries: float, p: int, machine: Machine) -> float:
    """Seconds of one projection hop: the local kernel's share of ``entries_read``, plus the exchange."""
    compute = entries_read / p / machine.entries_per_s
    if p <= 1:
        return compute
    return compute + machine.alpha_s + hop_bytes(frontier_entries, p) / machine.bandwidth


# ------------------------------------------------------------------ predictions
#: ogbl-wikikg2 (OGB: 2,500,604 entities, 535 relations, 16,109,182 train edges) and Wikidata5M (transductive:
#: 4,594,485 entities, 822 relations, 20,614,279 edges); relations and edges doubled by the inverses.
WIKIKG2 = KG("ogbl-wikikg2", 2_500_604, 2 * 535, 2 * 16_109_182)
WIKIDATA5M = KG("Wikidata5M", 4_594_485, 2 * 822, 2 * 20_614_279)
#: The measured lazy KGs (observed edges with inverses, after --drop-edges).
KG1M = KG("synthetic 1M", 1_000_000, 2_000, 18_000_000)
KG120K = KG("synthetic 120k", 120_000, 1_500, 1_500_000)
#: Entries an eager stack keeps per observed edge at FB15k-237's threshold (129.4 M entries for 544,230
#: observed edges with inverses: 238 per edge) -- the dense end; a threshold raised to fit memory keeps fewer.
FB_ENTRIES_PER_EDGE = FB["entries"] / 544_230


def predict(kg: KG, *, p: int = 8, rank: int = 256, entries_per_edge: float = FB_ENTRIES_PER_EDGE,
            batch_frontier_per_entry: float | None = None, machine: Machine = GPU) -> dict[str, float]:
    """Memory per GPU (eager at ``entries_per_edge``, and lazy), bytes per hop and latency per hop for ``kg``.

    The frontier of a hop scales with the entries a row holds: FB's measured frontier times the ratio of
    entries per (relation, entity) row (``batch_frontier_per_entry`` overrides: frontier entries per
    stored entry).
    """
    entries = entries_per_edge * kg.edges
    fb_row = FB["entries"] / (FB["entities"] * FB["relations"])
    row = entries / (kg.entities * kg.relations)
    frontier = FB_FRONTIER_ENTRIES * row / fb_row if batch_frontier_per_entry is None \
        else batch_frontier_per_entry * entries
    # the entries a hop reads: FB's hop read its frontier's rows (~row entries each) for the same batch
    read = frontier * row
    return {
        "entries": entries,
        "eager_memory_per_gpu": eager_memory_per_rank(entries, p),
        "lazy_memory_per_gpu": lazy_memory(kg, rank, p=p),
        "hop_bytes": hop_bytes(frontier, p),
        "hop_latency_s": hop_latency(read, frontier, p, machine),
        "hop_latency_1_s": hop_latency(read, frontier, 1, machine),
    }


def table() -> str:
    lines = ["| KG | entities | relations (inv.) | edges (inv.) | eager entries (FB density) | eager GiB / GPU "
             "| lazy GiB / GPU (rank 256) | MiB received / hop | ms / hop at 8 GPUs (1 GPU) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for kg in (WIKIKG2, WIKIDATA5M):
        r = predict(kg)
        lines.append(f"| {kg.name} | {kg.entities:,} | {kg.relations:,} | {kg.edges:,} | {r['entries'] / 1e9:.1f} G "
                     f"| {r['eager_memory_per_gpu'] / GIB:,.0f} | {r['lazy_memory_per_gpu'] / GIB:.1f} "
                     f"| {r['hop_bytes'] / MIB:.2f} | {r['hop_latency_s'] * 1e3:.2f} "
                     f"({r['hop_latency_1_s'] * 1e3:.2f}) |")
    return "\n".join(lines)


def plot(path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    ps = [1, 2, 3, 4]
    colours = {"FB15k-237 eager": "C0", "1M lazy": "C2", "120k lazy": "C3"}
    for series, p, measured, _ in measured_points():
        a.plot([p], [measured], "o", color=colours[series])
    a.plot(ps[:3], [eager_memory_per_rank(FB["entries"], p) / MIB for p in ps[:3]], "--", color="C0",
           label="FB15k-237 eager: model")
    a.plot([1], [lazy_memory(KG1M, KG1M_RANK) / MIB], "x", color="C2", ms=9, label="1M lazy, one process: fit")
    a.plot(ps[1:], [lazy_memory(KG1M, KG1M_RANK, p=p) / MIB for p in ps[1:]], ":", color="C2",
           label="1M lazy, P ranks (shard folder): fit")
    a.plot([1], [lazy_memory(KG120K, KG1M_RANK) / MIB], "x", color="C3", ms=9, label="120k lazy, one process: fit")
    a.set_xticks(ps)
    a.set_xlabel("ranks P")
    a.set_ylabel("peak RSS per rank (MiB)")
    a.set_title("memory per rank (dots: measured)")
    a.legend()
    b.plot(list(FB_HOP_KIB), list(FB_HOP_KIB.values()), "o", color="C1", label="FB15k-237: measured")
    xs = list(range(1, 9))
    b.plot(xs, [hop_bytes(FB_FRONTIER_ENTRIES, p) / 1024 for p in xs], "--", color="C1", label="model")
    b.set_xlabel("ranks P")
    b.set_ylabel("KiB received per rank per hop")
    b.set_title("bytes per exchanging hop")
    b.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python benchmarks/scale_model.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--plot", help="also write the plot (PNG) here")
    args = ap.parse_args(argv)
    print(table())
    if args.plot:
        plot(args.plot)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
