"""Synthetic Freebase-like knowledge graphs: a generator and a CLI that writes a TSV for ``kge.build``.

    python -m experiments.synthetic_kg --entities 120000 --relations 750 --edges 1500000 --seed 0 --out /tmp/syn120k.tsv

The file holds ``head<TAB>relation<TAB>tail`` names (``person_000123``,
``person_r0017_film``), one edge a line, every edge once.  ``kge.graph.load_kg``
reads it as a ``tsv`` KG and adds the inverse ``X^-1`` of every relation
(:func:`kge.graph._with_inverses`), so ``--relations 750`` loads as **1,500
relations** and ``--edges 1500000`` as 3,000,000 directed training edges: the
size of the 120k-entity, 1.5k-relation Freebase subgraph of LGOT's
GraphQuestions experiments.  Every entity and every relation occurs in the
file, so the loaded counts are exactly the requested ones; the edge count is
exact too.  The output is a function of the arguments and ``--seed`` only.

Design (what makes it realistic, and what makes it learnable)
------------------------------------------------------------
* **Types.** Entities have one of ``T`` types (default ``round(sqrt(N) / 7)``,
  at most 50: 49 at 120k) whose sizes follow Zipf's law (exponent 1), as
  Freebase's domains do (people and recordings dwarf airports and rivers).
* **Latent clusters.** Within its type an entity belongs to one of about
  ``sqrt(n_type) / 2`` clusters, also Zipf-sized (exponent 0.8).  Clusters are
  the hidden structure a KGE can learn: every relation's behaviour depends on
  the head's cluster, and the same cluster decides the entity's edges in *all*
  relations, so the held-out half of an entity's edges should be predictable
  from the kept half (a 15-minute build reaches held-out link MRR 0.14-0.15;
  benchmarks/results/kge_train_large.md).
* **Popularity.** Each entity has a weight ``w ~ Pareto(1)`` (``P(w > x) =
  1 / x``, ``x >= 1``); heads and tails are drawn in proportion to it, so
  degrees follow a power law (Freebase's degree exponent is about 2-2.5; here
  the cardinality limits and duplicate rejection trim the hubs, and the fitted
  tail exponent is about 2.5 at 20k and 120k entities), with hubs of thousands
  of edges and a median degree of about 10.
* **Relations.** Each has a domain type and a range type (drawn in proportion
  to ``size^0.7``: popular types are chosen more often, every type is the
  domain of at least one relation), a cardinality class (1-1 7 %, 1-N 11 %,
  N-1 34 %, N-N 48 %, roughly FB15k-237's mix) enforced strictly (an N-1
  relation gives a head at most one tail, a 1-N one a tail at most one head),
  a size (Zipf-distributed edge counts, exponent 0.9, capped by what its
  domain, range and class can hold), the share of head clusters it applies to
  (all for 40 %, otherwise 30-100 %: only some people play for a team) and a
  *latent rule*: each active head cluster maps to 1-3 tail clusters of the
  range type (weights 1, 1/2, 1/4).  An edge draws a head by popularity among
  the active clusters, a tail cluster by the rule and a tail in it by
  popularity; up to 5 % of a relation's edges ignore the rule (noise: a tail
  anywhere in the range type, by popularity).  Chaining two rules maps a
  cluster to a few clusters, so 2p queries have focused answer sets and 2i
  intersections are non-trivial.
* **Compositions and aliases.** With 20 relations or more, 5 % of them are compositions
  ``r3 = r1 . r2`` of two others (their edges are sampled 2-hop paths, like
  ``nationality ~ place_of_birth . country``; ``r2`` is one that applies to the
  clusters ``r1``'s tails fall in) and 2 % are near-duplicates of
  another relation (a 50-90 % sample of its edges plus noise), as Freebase has
  (``/film/film/genre`` and ``/media_common/netflix_title/netflix_genres``).
  Aliases make some held-out edges easy, the way FB15k's were; set
  ``alias_fraction=0`` for a graph without them.
* **Coverage.** Every entity first gets one edge as the head of an N-1 or N-N
  relation of its type that applies to all its clusters (so no entity is
  missing from the file); every relation gets at least one edge.  Hence
  ``--edges`` must be at least ``--entities + --relations``.
* **Exactness.** Edges are drawn in vectorised rounds (per relation: a batch of
  candidates sized by the relation's observed acceptance rate; self loops,
  duplicates and cardinality violations dropped, then the first candidates up
  to the relation's quota kept; rule-ignoring candidates only within the 5 %
  noise budget).  A relation whose rule-following candidates stop being
  accepted is saturated and its remaining quota moves to the other rule
  relations (not to noise: a small relation would otherwise end up mostly
  noise).  Should every relation saturate
  (only for tiny, dense requests) the rest is drawn uniformly within the types,
  then uniformly over all triples (``stats["fallback_edges"]`` counts these).

Why these choices: the loader only knows entities that occur in some triple,
so exact entity counts need the coverage edges; strict cardinality classes
make N-1 relations truly functional, which is what makes their held-out tails
predictable; the popularity exponent is 1 rather than 2 because the
cardinality limits and duplicate rejection steepen the degree tail (Pareto(1.2)
gave a fitted 2.6-2.7, Pareto(1) gives about 2.5); relations that apply to only
some clusters give entities different relation profiles within a type (a
signal for the KGE and for 2i queries).

No duplicate triples, no self loops.  1.5 M edges take about 5 s of CPU and
0.4 GB (measured in docs/artifacts.md).  The stats (``--stats-json``) hold
the degree distribution (max, median, percentiles, a log2 histogram and a
power-law fit of its tail, Clauset et al. 2009), the designed and the measured
cardinality classes (Bordes et al. 2013: tails per head and heads per tail
below 1.5 means "1"), and every type and relation.
"""
from __future__ import annotations

import json
import math
import os
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from kgreason.cli import SEED_MAX, ArgumentParser, Settings, add_settings_arguments, setting, settings_from_args
from kgreason.errors import UserError, cli_main
from kgreason.files import check_output_file, open_output, write_output
from kgreason.resources import available_memory_bytes as _mem_available

__all__ = [
    "KINDS",
    "TYPE_NAMES",
    "SyntheticConfig",
    "SyntheticKG",
    "generate",
    "write_tsv",
    "degree_stats",
    "summary",
    "estimate_peak_bytes",
    "estimate_tsv_bytes",
    "check_fits",
    "SyntheticSettings",
    "SyntheticArgs",
    "parse_args",
    "main",
]

#: Cardinality classes: head side - tail side ("N-1": many heads share a tail, a head has one tail).
KINDS = ("1-1", "1-N", "N-1", "N-N")
#: Default share of each class among the relations (roughly FB15k-237's).
KIND_SHARES = (0.07, 0.11, 0.34, 0.48)
#: Relation roles.
ROLES = ("rule", "composition", "alias")
#: Names of the first types (largest first); further types are ``type50``, ``type51``, ...
TYPE_NAMES = (
    "person", "music_recording", "film", "location", "organization", "book", "tv_episode", "music_album",
    "company", "city", "award", "sports_team", "university", "artist", "song", "tv_series", "country",
    "profession", "genre", "event", "language", "building", "athlete", "politician", "character", "species",
    "disease", "drug", "gene", "software", "video_game", "newspaper", "website", "religion", "ethnicity",
    "school", "river", "mountain", "airport", "ship", "military_unit", "battle", "legislation", "currency",
    "instrument", "food", "chemical", "vehicle", "holiday", "theater",
)
#: Relations ids, squared entity counts and so on must fit int64 edge keys ``(r * N + h) * N + t``.
_KEY_LIMIT = 2**62
_ENUMERATE_LIMIT = 20_000_000  # the last fallback lists every free triple below this many


# ------------------------------------------------------------------ configuration
@dataclass(frozen=True)
class SyntheticConfig:
    """What to generate.  Only the first three fields are required; the rest tune the design (module doc)."""

    num_entities: int
    num_relations: int  # before inverses: the loaded KG has twice as many
    num_edges: int  # before inverses
    seed: int = 0
    num_types: int | None = None  # None: round(sqrt(N) / 7), clipped to [1, min(50, relations, N // 2)]
    type_zipf: float = 1.0
    cluster_zipf: float = 0.8
    popularity_shape: float = 1.0  # Pareto shape a: P(w > x) = x^-a (degree tail exponent: module doc)
    relation_zipf: float = 0.9
    kind_shares: tuple[float, float, float, float] = KIND_SHARES
    max_fanout: int = 3  # tail clusters per head cluster
    noise: float = 0.05
    composite_fraction: float = 0.05
    alias_fraction: float = 0.02


_FLAGS = {"num_entities": "--entities", "num_relations": "--relations", "num_edges": "--edges", "seed": "--seed",
          "num_types": "--types"}


def _check_config(c: SyntheticConfig, flags: Mapping[str, str] | None = None) -> None:
    """UserError for an impossible request, naming the option (CLI) or the field (library) and its value."""
    name = (lambda f: (flags or {}).get(f, f))  # noqa: E731
    for f, lo in (("num_entities", 2), ("num_relations", 1), ("num_edges", 1)):
        v = getattr(c, f)
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < lo:
            raise UserError(f"{name(f)} must be an integer >= {lo}, got {v!r}")
    n, r, e = int(c.num_entities), int(c.num_relations), int(c.num_edges)
    if not isinstance(c.seed, (int, np.integer)) or not 0 <= c.seed <= 2**32 - 1:
        raise UserError(f"{name('seed')} must be in [0, {2**32 - 1}], got {c.seed!r}")
    if r * n * n >= _KEY_LIMIT:
        raise UserError(f"{name('num_entities')} {n:,} with {name('num_relations')} {r:,} is too large "
                        f"(relations x entities^2 must stay below 2^62)")
    if e < n + r:
        raise UserError(f"{name('num_edges')} {e:,} is too small for {name('num_entities')} {n:,} and "
                        f"{name('num_relations')} {r:,}: every entity gets one edge and every relation at least "
                        f"one more, so it must be >= {n + r:,}")
    space = r * n * (n - 1)
    if e > space:
        raise UserError(f"{name('num_edges')} {e:,} exceeds the {space:,} possible triples without self loops "
                        f"({name('num_relations')} x {name('num_entities')} x ({name('num_entities')} - 1))")
    if space > _ENUMERATE_LIMIT and e > space // 2:
        raise UserError(f"{name('num_edges')} {e:,} is more than half of the {space:,} possible triples; "
                        f"this generator makes sparse graphs (use fewer edges or more entities)")
    if c.num_types is not None:
        t = c.num_types
        hi = min(r, n // 2)
        if isinstance(t, bool) or not isinstance(t, (int, np.integer)) or not 1 <= t <= hi:
            raise UserError(f"{name('num_types')} must be an integer in [1, {hi}] (at most {name('num_relations')} "
                            f"and {name('num_entities')} / 2: every type is some relation's domain and has "
                            f">= 2 entities), got {t!r}")
    for f in ("type_zipf", "cluster_zipf", "relation_zipf"):
        v = getattr(c, f)
        if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
            raise UserError(f"{name(f)} must be a finite number >= 0, got {v!r}")
    if not (isinstance(c.popularity_shape, (int, float)) and math.isfinite(c.popularity_shape)
            and c.popularity_shape > 0):
        raise UserError(f"{name('popularity_shape')} must be a finite number > 0, got {c.popularity_shape!r}")
    for f in ("noise", "composite_fraction", "alias_fraction"):
        v = getattr(c, f)
        if not (isinstance(v, (int, float)) and 0 <= v <= 0.5):
            raise UserError(f"{name(f)} must be in [0, 0.5], got {v!r}")
    if c.composite_fraction + c.alias_fraction > 0.5:
        raise UserError("composite_fraction + alias_fraction must be <= 0.5")
    ks = c.kind_shares
    if (len(ks) != 4 or not all(isinstance(x, (int, float)) and math.isfinite(x) and x >= 0 for x in ks)
            or ks[2] + ks[3] <= 0):
        raise UserError(f"kind_shares must be 4 finite shares >= 0 (1-1, 1-N, N-1, N-N) with N-1 + N-N > 0, got {ks!r}")
    if not isinstance(c.max_fanout, (int, np.integer)) or c.max_fanout < 1:
        raise UserError(f"max_fanout must be an integer >= 1, got {c.max_fanout!r}")


# ------------------------------------------------------------------ size estimates
# A lower bound of the peak resident memory of generate() + write_tsv(), fitted to /usr/bin/time's
# maximum RSS of sparse `python -m experiments.synthetic_kg` runs: 273 MB at 400k entities / 1M edges, 642 MB at
# 2M / 2.2M (the interpreter and numpy, per-entity arrays and names, per-edge keys and the sort; table
# in docs/artifacts.md).  Denser graphs need more per edge (candidate batches of the rejection rounds:
# 1.44 GB at 100k / 4M, 2.6x this bound), so only requests that cannot fit are refused.
_BASE_BYTES = 100 * 10**6
_BYTES_PER_ENTITY = 140
_BYTES_PER_EDGE = 110


def estimate_peak_bytes(config: SyntheticConfig) -> int:
    """A lower bound of the bytes of memory :func:`generate` and :func:`write_tsv` need at their peak
    (sparse graphs reach about this; dense ones up to ~3x more)."""
    return _BASE_BYTES + _BYTES_PER_ENTITY * int(config.num_entities) + _BYTES_PER_EDGE * int(config.num_edges)


def estimate_tsv_bytes(config: SyntheticConfig) -> int:
    """About how large the TSV is: per edge two entity names (``type_000123``: a type name of about 8
    characters and as many digits as the entity count has) and a relation name (two type names and
    ``_r0017_``), with tabs and the newline (56 bytes a line at 100k entities, measured: 57 estimated)."""
    digits = len(str(int(config.num_entities)))
    return int(config.num_edges) * (2 * (9 + digits) + 27)


def _gib(b: float) -> str:
    return f"{b / 2**30:.2f} GiB" if b >= 2**30 else f"{b / 2**20:.0f} MiB"


def check_fits(config: SyntheticConfig, out: str | os.PathLike | None = None, *,
               flags: Mapping[str, str] | None = None, override: str = "--skip-size-check") -> None:
    """Refuse, before any allocation, a request whose estimated peak memory exceeds MemAvailable
    (:func:`estimate_peak_bytes`) or whose TSV would not fit the free space of ``out``'s folder
    (:func:`estimate_tsv_bytes`); one :class:`UserError` line naming the sizes and ``override``."""
    name = (lambda f: (flags or {}).get(f, f))  # noqa: E731
    sizes = (f"{name('num_entities')} {int(config.num_entities):,} and {name('num_edges')} "
             f"{int(config.num_edges):,}")
    need, have = estimate_peak_bytes(config), _mem_available()
    if have is not None and need > have:
        raise UserError(f"{sizes} need at least {_gib(need)} of memory, more than the {_gib(have)} available "
                        f"(MemAvailable); use fewer entities or edges, or pass {override} to try anyway")
    if out is not None:
        import shutil

        folder = Path(os.path.abspath(out)).parent
        try:
            free = shutil.disk_usage(folder).free
        except OSError:
            return  # the output checks name a missing folder
        size = estimate_tsv_bytes(config)
        if size > free:
            raise UserError(f"{sizes} make a TSV of about {_gib(size)}, more than the {_gib(free)} free in "
                            f"{str(folder)!r}; write it elsewhere, use fewer edges, or pass {override} to try anyway")


def default_num_types(num_entities: int, num_relations: int) -> int:
    """``round(sqrt(N) / 7)`` clipped to ``[1, min(50, relations, N // 2)]`` (49 types at 120k entities)."""
    return int(max(1, min(round(math.sqrt(num_entities) / 7), 50, num_relations, num_entities // 2)))


# ------------------------------------------------------------------ result
@dataclass(frozen=True, eq=False)
class SyntheticKG:
    """A generated KG: names, the latent design, and ``triples`` (E, 3) int64 ``(head, relation, tail)``.

    Relation ids index ``relations`` (base relations, no inverses); entity ids are grouped by type.
    """

    entities: list[str]
    relations: list[str]
    types: list[str]
    triples: np.ndarray
    entity_type: np.ndarray
    entity_cluster: np.ndarray  # global cluster id
    popularity: np.ndarray
    relation_domain: np.ndarray
    relation_range: np.ndarray
    relation_kind: np.ndarray  # index into KINDS
    relation_role: np.ndarray  # index into ROLES
    relation_sources: np.ndarray  # (R, 2): composition r1, r2 / alias source, -1 if none
    stats: dict[str, Any] = field(default_factory=dict)

    @property
    def num_entities(self) -> int:
        return len(self.entities)

    @property
    def num_relations(self) -> int:
        return len(self.relations)


# ------------------------------------------------------------------ small helpers
def _round_to_total(x: np.ndarray, total: int) -> np.ndarray:
    """Integers summing to ``total``: floors of ``x`` (>= 0, sum ~ total) plus 1 for the largest remainders."""
    base = np.floor(x).astype(np.int64)
    short = int(total - base.sum())
    if short > 0:
        frac = x - base
        base[np.argsort(-frac, kind="stable")[:short]] += 1
    elif short < 0:  # only from rounding error: take from the largest
        for i in np.argsort(-base, kind="stable")[: -short]:
            base[i] -= 1
    return base


def _allocate(total: int, weights: np.ndarray, caps: np.ndarray, minimum: np.ndarray | int = 1) -> np.ndarray:
    """``total`` split in proportion to ``weights``, each part in ``[minimum, cap]`` (water-filling).

    When the caps cannot hold ``total`` the excess is spread in proportion to the weights anyway.
    """
    k = len(weights)
    w = np.asarray(weights, dtype=np.float64) + 1e-12
    lo = np.broadcast_to(np.asarray(minimum, dtype=np.float64), (k,)).copy()
    room = np.maximum(np.asarray(caps, dtype=np.float64) - lo, 0.0)
    alloc = np.zeros(k)
    remaining = float(total - lo.sum())
    active = room > 0
    for _ in range(k + 1):
        if remaining <= 1e-9 or not active.any():
            break
        share = remaining * w[active] / w[active].sum()
        take = np.minimum(share, room[active])
        alloc[active] += take
        room[active] -= take
        remaining -= float(take.sum())
        active &= room > 1e-9
    if remaining > 1e-9:
        alloc += remaining * w / w.sum()
    return _round_to_total(lo + alloc, total)


def _zipf_sizes(total: int, k: int, s: float, minimum: int) -> np.ndarray:
    """``k`` sizes summing to ``total``, proportional to ``rank^-s``, each >= ``minimum`` (largest first)."""
    w = np.arange(1, k + 1, dtype=np.float64) ** -s
    return _allocate(total, w, np.full(k, np.inf), minimum)


def _first_mask(keys: np.ndarray) -> np.ndarray:
    """True at the first occurrence of each key."""
    mask = np.zeros(len(keys), dtype=bool)
    if len(keys):
        mask[np.unique(keys, return_index=True)[1]] = True
    return mask


def _isin_sorted(a: np.ndarray, sorted_keys: np.ndarray) -> np.ndarray:
    if len(sorted_keys) == 0 or len(a) == 0:
        return np.zeros(len(a), dtype=bool)
    i = np.minimum(np.searchsorted(sorted_keys, a), len(sorted_keys) - 1)
    return sorted_keys[i] == a


def _merge_sorted(sorted_keys: np.ndarray, new: np.ndarray) -> np.ndarray:
    new = np.sort(new)
    return np.insert(sorted_keys, np.searchsorted(sorted_keys, new), new)


# ------------------------------------------------------------------ the generator
class _Generator:
    """State of one generation run (see the module docstring for the design)."""

    def __init__(self, c: SyntheticConfig) -> None:
        self.c = c
        self.rng = np.random.default_rng(c.seed)
        self.N, self.R, self.E = int(c.num_entities), int(c.num_relations), int(c.num_edges)
        self._make_entities()
        self._make_relations()
        # accepted edges
        self.parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        self.count = np.zeros(self.R, dtype=np.int64)
        self.keys3 = np.zeros(0, dtype=np.int64)
        self.keysH = np.zeros(0, dtype=np.int64)
        self.keysT = np.zeros(0, dtype=np.int64)
        self.fallback_edges = 0
        self.noise_count = np.zeros(self.R, dtype=np.int64)  # accepted edges with a rule-ignoring tail
        self.rounds = 0
        self._index: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None

    # ---------------------------------------------------------- entities: types, clusters, popularity
    def _make_entities(self) -> None:
        c, rng, N = self.c, self.rng, self.N
        T = c.num_types if c.num_types is not None else default_num_types(N, self.R)
        self.T = int(T)
        self.type_size = _zipf_sizes(N, self.T, c.type_zipf, 2)
        self.type_start = np.concatenate([[0], np.cumsum(self.type_size)])
        self.entity_type = np.repeat(np.arange(self.T), self.type_size)
        n_cl = np.maximum(1, np.ceil(np.sqrt(self.type_size) / 2)).astype(np.int64)
        self.type_clusters = n_cl
        self.cl_type_start = np.concatenate([[0], np.cumsum(n_cl)])  # global cluster ids of type t
        self.C = int(n_cl.sum())
        csize = np.concatenate([_zipf_sizes(int(n), int(k), c.cluster_zipf, 1) for n, k in zip(self.type_size, n_cl)])
        self.csize = csize
        self.cl_type = np.repeat(np.arange(self.T), n_cl)
        # entities in cluster order: a random permutation within each type, cut into cluster blocks
        self.order = np.lexsort((rng.random(N), self.entity_type))
        self.entity_cluster = np.empty(N, dtype=np.int64)
        self.entity_cluster[self.order] = np.repeat(np.arange(self.C), csize)
        self.w = rng.pareto(c.popularity_shape, N) + 1.0
        self.cumw = np.cumsum(self.w[self.order])
        self.cstart = np.concatenate([[0], np.cumsum(csize)])[:-1]
        self.cend = self.cstart + csize
        before = np.concatenate([[0.0], self.cumw])
        self.cbase = before[self.cstart]
        self.cmass = before[self.cend] - self.cbase
        self.tbase = before[self.type_start[:-1]]
        self.tmass = before[self.type_start[1:]] - self.tbase
        names = [TYPE_NAMES[t] if t < len(TYPE_NAMES) else f"type{t}" for t in range(self.T)]
        self.type_names = names
        width = max(6, len(str(int(self.type_size.max()) - 1)))
        local = np.arange(N) - self.type_start[self.entity_type]
        self.entity_names = [f"{names[t]}_{j:0{width}d}" for t, j in zip(self.entity_type.tolist(), local.tolist())]

    def _in_blocks(self, start: np.ndarray, end: np.ndarray, base: np.ndarray, mass: np.ndarray) -> np.ndarray:
        """One entity per block of ``order`` (a cluster or a type), drawn by popularity."""
        u = base + self.rng.random(len(base)) * mass
        pos = np.clip(np.searchsorted(self.cumw, u, side="right"), start, end - 1)
        return self.order[pos]

    def in_clusters(self, cl: np.ndarray) -> np.ndarray:
        return self._in_blocks(self.cstart[cl], self.cend[cl], self.cbase[cl], self.cmass[cl])

    def in_type(self, t: np.ndarray) -> np.ndarray:
        return self._in_blocks(self.type_start[t], self.type_start[t + 1], self.tbase[t], self.tmass[t])

    # ---------------------------------------------------------- relations: domain, range, kind, rule, size
    def _make_relations(self) -> None:
        c, rng, R, T = self.c, self.rng, self.R, self.T
        n_comp = int(round(c.composite_fraction * R)) if R >= 20 else 0
        n_alias = int(round(c.alias_fraction * R)) if R >= 20 else 0
        B = R - n_comp - n_alias
        if B < T:  # every type needs a rule relation as its domain
            n_comp = n_alias = 0
            B = R
        self.B = B
        p_type = self.type_size.astype(np.float64) ** 0.7
        p_type /= p_type.sum()
        dom = np.concatenate([np.arange(T), rng.choice(T, size=R - T, p=p_type)])
        rng_ = rng.choice(T, size=R, p=p_type)
        ks = np.asarray(c.kind_shares, dtype=np.float64)
        anchor_ks = ks * np.array([0, 0, 1, 1])
        kind = np.concatenate([rng.choice(4, size=T, p=anchor_ks / anchor_ks.sum()),
                               rng.choice(4, size=R - T, p=ks / ks.sum())])
        full = np.concatenate([np.ones(T, dtype=bool), rng.random(R - T) < 0.4])
        frac = rng.uniform(0.3, 1.0, size=R)
        role = np.zeros(R, dtype=np.int64)
        sources = np.full((R, 2), -1, dtype=np.int64)
        self.dom, self.rng_type, self.kind, self.full, self.role, self.sources = dom, rng_, kind, full, role, sources
        # latent rules of the rule relations (also kept for compositions/aliases: unused there)
        self.act: list[np.ndarray] = []
        self.act_cum: list[np.ndarray] = []
        self.tgt: list[np.ndarray] = []
        self.tgt_cum: list[np.ndarray] = []
        heads_cap = np.zeros(R)
        tails_cap = np.zeros(R)
        pairs_cap = np.zeros(R)
        K = int(c.max_fanout)
        k_p = 0.5 ** np.arange(K)  # 1, 2, 3 tail clusters with probability 4/7, 2/7, 1/7
        k_p /= k_p.sum()
        col_w = 0.5 ** np.arange(K)
        for r in range(R):
            d, g = int(dom[r]), int(rng_[r])
            dcl = np.arange(self.cl_type_start[d], self.cl_type_start[d + 1])
            if full[r]:
                act = dcl
            else:
                keep = rng.random(len(dcl)) < frac[r]
                if not keep.any():
                    keep[np.argmax(self.cmass[dcl])] = True
                act = dcl[keep]
            gcl = np.arange(self.cl_type_start[g], self.cl_type_start[g + 1])
            p = self.cmass[gcl] ** 0.5
            tgt = rng.choice(gcl, size=(len(act), K), p=p / p.sum())
            k = rng.choice(K, size=len(act), p=k_p) + 1
            wts = np.where(np.arange(K)[None, :] < k[:, None], col_w[None, :], 0.0)
            cum = np.cumsum(wts, axis=1) / wts.sum(axis=1, keepdims=True)
            cum[:, -1] = 1.0
            tgt = np.where(np.arange(K)[None, :] < k[:, None], tgt, tgt[:, :1])
            self.act.append(act)
            self.act_cum.append(np.cumsum(self.cmass[act]))
            self.tgt.append(tgt)
            self.tgt_cum.append(cum)
            heads_cap[r] = self.csize[act].sum()
            tails_cap[r] = self.csize[np.unique(tgt)].sum()
            uniq_row = np.sort(tgt, axis=1)
            dup = np.concatenate([np.zeros((len(act), 1), bool), uniq_row[:, 1:] == uniq_row[:, :-1]], axis=1)
            tail_sizes = self.csize[uniq_row] * ~dup
            pairs_cap[r] = float((self.csize[act] * tail_sizes.sum(axis=1)).sum())
        w_rel = np.arange(1, R + 1, dtype=np.float64) ** -c.relation_zipf
        self.weight = w_rel[rng.permutation(R)]
        # compositions and aliases (ids B..R-1) get the domain/range/kind of their sources, which are
        # drawn in proportion to their size as rule relations (so that they have edges to build on)
        size = _allocate(self.E, self.weight[:B], self._caps(heads_cap, tails_cap, pairs_cap, kind)[:B]
                         ).astype(np.float64)
        base = np.arange(B)
        by_dom = {t: base[dom[:B] == t] for t in range(T)}
        used_pairs: set[tuple[int, int]] = set()
        for r in range(B, B + n_comp):
            pair = None
            for _ in range(20):
                r1 = int(rng.choice(B, p=size / size.sum()))
                cand = by_dom[int(rng_[r1])]
                cand = cand[cand != r1]
                if not len(cand):
                    continue
                # r2 must apply to the clusters r1's tails fall in: weight by that overlap
                mids = np.unique(self.tgt[r1])
                overlap = np.array([np.isin(mids, self.act[r2]).mean() for r2 in cand.tolist()])
                w = size[cand] * overlap
                if w.sum() <= 0:
                    continue
                r2 = int(rng.choice(cand, p=w / w.sum()))
                if (r1, r2) not in used_pairs:
                    pair = (r1, r2)
                    break
            if pair is None:  # no composable pair: stays a rule relation
                continue
            used_pairs.add(pair)
            r1, r2 = pair
            role[r] = 1
            sources[r] = pair
            dom[r], rng_[r] = dom[r1], rng_[r2]
            k1, k2 = KINDS[kind[r1]], KINDS[kind[r2]]
            kind[r] = KINDS.index(k1) if k1 == k2 and k1 != "N-N" else KINDS.index("N-N")
        n_alias = R - B - n_comp
        if n_alias:
            for r, src in zip(range(B + n_comp, R), rng.choice(B, size=n_alias, replace=False, p=size / size.sum())):
                role[r] = 2
                sources[r] = (src, -1)
                dom[r], rng_[r], kind[r] = dom[src], rng_[src], kind[src]
        self.head_fun = np.isin(kind, [KINDS.index("1-1"), KINDS.index("N-1")])
        self.tail_fun = np.isin(kind, [KINDS.index("1-1"), KINDS.index("1-N")])
        self.cap = self._caps(heads_cap, tails_cap, pairs_cap, kind)
        self.cap[role != 0] = np.inf
        self.alias_keep = rng.uniform(0.5, 0.9, size=R)

    @staticmethod
    def _caps(heads: np.ndarray, tails: np.ndarray, pairs: np.ndarray, kind: np.ndarray) -> np.ndarray:
        """Edges a rule relation can hold, with room left for popularity-biased sampling: 30 % of its
        possible heads (N-1), tails (1-N) or both (1-1), 20 % of its rule's (head, tail) pairs (N-N)."""
        head_fun = np.isin(kind, [KINDS.index("1-1"), KINDS.index("N-1")])
        tail_fun = np.isin(kind, [KINDS.index("1-1"), KINDS.index("1-N")])
        cap = np.where(head_fun & tail_fun, 0.3 * np.minimum(heads, tails),
                       np.where(head_fun, 0.3 * heads, np.where(tail_fun, 0.3 * tails, 0.2 * pairs)))
        return np.minimum(cap, 0.5 * pairs)

    def targets(self) -> np.ndarray:
        """Edges per relation (sum E): Zipf weights, capped by capacity; compositions/aliases by their sources."""
        cap = self.cap.copy()
        t = _allocate(self.E, self.weight, cap)
        for _ in range(2):  # compositions and aliases depend on their sources' sizes
            for r in np.flatnonzero(self.role == 1):
                cap[r] = max(1.0, 0.5 * t[self.sources[r, 0]])
            for r in np.flatnonzero(self.role == 2):
                cap[r] = max(1.0, self.alias_keep[r] * t[self.sources[r, 0]])
            t = _allocate(self.E, self.weight, cap)
        return t

    # ---------------------------------------------------------- candidate edges
    def _noise(self, r: int, h: np.ndarray, t: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(h, t, noisy)``: a share ``noise`` of the tails replaced by any entity of the range type."""
        m = self.rng.random(len(t)) < self.c.noise
        if m.any():
            t = t.copy()
            t[m] = self.in_type(np.full(int(m.sum()), self.rng_type[r]))
        return h, t, m

    def _rule_tails(self, r: int, rows: np.ndarray) -> np.ndarray:
        u = self.rng.random(len(rows))
        col = np.minimum((u[:, None] >= self.tgt_cum[r][rows]).sum(axis=1), self.tgt[r].shape[1] - 1)
        return self.in_clusters(self.tgt[r][rows, col])

    def _candidates(self, r: int, n: int, uniform: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Up to ``n`` candidate ``(heads, tails, noisy)`` of relation ``r``."""
        rng = self.rng
        if uniform:  # fallback: anything within the types
            d, g = self.dom[r], self.rng_type[r]
            h = self.type_start[d] + rng.integers(self.type_size[d], size=n)
            t = self.type_start[g] + rng.integers(self.type_size[g], size=n)
            return h, t, np.zeros(n, dtype=bool)
        role = self.role[r]
        if role == 0:
            cum = self.act_cum[r]
            rows = np.minimum(np.searchsorted(cum, rng.random(n) * cum[-1], side="right"), len(cum) - 1)
            h = self.in_clusters(self.act[r][rows])
            return self._noise(r, h, self._rule_tails(r, rows))
        h1, t1 = self._edges_of(int(self.sources[r, 0]))
        if len(h1) == 0:
            return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, bool)
        pick = rng.integers(len(h1), size=n)
        if role == 2:
            return self._noise(r, h1[pick], t1[pick])
        h2, t2 = self._edges_of(int(self.sources[r, 1]))  # sorted by head
        mid = t1[pick]
        lo = np.searchsorted(h2, mid, side="left")
        cnt = np.searchsorted(h2, mid, side="right") - lo
        ok = cnt > 0
        j = lo[ok] + (rng.random(int(ok.sum())) * cnt[ok]).astype(np.int64)
        return self._noise(r, h1[pick][ok], t2[j])

    def _edges_of(self, r: int) -> tuple[np.ndarray, np.ndarray]:
        """Accepted edges of relation ``r``, sorted by head (index rebuilt at each phase)."""
        if self._index is None:
            h, rel, t = self.edges()
            o = np.lexsort((t, h, rel))
            h, rel, t = h[o], rel[o], t[o]
            bounds = np.searchsorted(rel, np.arange(self.R + 1))
            self._index = (h, t, bounds)
        h, t, b = self._index
        return h[b[r]:b[r + 1]], t[b[r]:b[r + 1]]

    def edges(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if not self.parts:
            z = np.zeros(0, np.int64)
            return z, z, z
        return tuple(np.concatenate([p[i] for p in self.parts]) for i in range(3))  # type: ignore[return-value]

    # ---------------------------------------------------------- accepting edges
    def _add(self, h: np.ndarray, r: np.ndarray, t: np.ndarray) -> None:
        N = self.N
        self.parts.append((h, r, t))
        self.count += np.bincount(r, minlength=self.R)
        self.keys3 = _merge_sorted(self.keys3, (r * N + h) * N + t)
        hf, tf = self.head_fun[r], self.tail_fun[r]
        if hf.any():
            self.keysH = _merge_sorted(self.keysH, r[hf] * N + h[hf])
        if tf.any():
            self.keysT = _merge_sorted(self.keysT, r[tf] * N + t[tf])

    def _valid(self, h: np.ndarray, r: np.ndarray, t: np.ndarray) -> np.ndarray:
        """Indices of the candidates that may be added together, in order (the first of a clash wins):
        no self loop, no triple already there, no second tail of a head in an N-1/1-1 relation, no
        second head of a tail in a 1-N/1-1 relation."""
        N = self.N
        k3 = (r * N + h) * N + t
        hf, tf = self.head_fun[r], self.tail_fun[r]
        kH, kT = r * N + h, r * N + t
        ok = (h != t) & ~_isin_sorted(k3, self.keys3)
        ok &= ~(hf & _isin_sorted(kH, self.keysH))
        ok &= ~(tf & _isin_sorted(kT, self.keysT))
        idx = np.flatnonzero(ok)
        idx = idx[_first_mask(k3[idx])]
        for fun, key in ((hf, kH), (tf, kT)):
            sel = fun[idx]
            if sel.any():
                keep = np.ones(len(idx), dtype=bool)
                keep[sel] = _first_mask(key[idx[sel]])
                idx = idx[keep]
        return idx

    def fill(self, deficit: np.ndarray, group: np.ndarray, *, uniform: bool = False, max_rounds: int = 60) -> None:
        """Add edges to the relations of ``group`` until their ``deficit`` (updated in place) is met.

        Noisy candidates (rule-ignoring tails) are kept only up to a share ``noise`` of a relation's
        edges, so that a relation whose structured edges run out does not fill up with noise.  A
        relation whose structured candidates are (nearly) all rejected twice running is saturated:
        its deficit moves to the unsaturated rule relations of the group, in proportion to their weight.
        """
        self._index = None
        R = self.R
        acc = np.ones(R)
        stall = np.zeros(R, dtype=np.int64)
        saturated = np.zeros(R, dtype=bool)
        for _ in range(max_rounds):
            todo = np.flatnonzero(group & (deficit > 0) & ~saturated)
            if len(todo) == 0:
                return
            self.rounds += 1
            hs, rs, ts, ns = [], [], [], []
            gen = np.zeros(R, dtype=np.int64)
            for r in todo.tolist():
                need = int(deficit[r])
                n = int(min(math.ceil(need * 1.3 / max(acc[r], 0.01)) + 16, 50 * need + 1000, 2_000_000))
                h, t, noisy = self._candidates(r, n, uniform)
                gen[r] = n
                hs.append(h)
                ts.append(t)
                ns.append(noisy)
                rs.append(np.full(len(h), r, dtype=np.int64))
            h, rel, t, noisy = np.concatenate(hs), np.concatenate(rs), np.concatenate(ts), np.concatenate(ns)
            idx = self._valid(h, rel, t)
            take = np.zeros(len(idx), dtype=bool)
            grp = rel[idx]  # non-decreasing: candidates were concatenated by relation
            clean = ~noisy[idx]
            good = np.bincount(grp[clean], minlength=R)  # structured candidates that could be added
            g = grp[clean]
            take[clean] = np.arange(len(g)) - np.searchsorted(g, g, side="left") < deficit[g]
            clean_edges = self.count - self.noise_count + np.minimum(good, deficit)
            noise_cap = np.floor(self.c.noise / (1.0 - self.c.noise) * clean_edges).astype(np.int64)
            room = np.minimum(deficit - np.minimum(good, deficit), np.maximum(noise_cap - self.noise_count, 0))
            g = grp[~clean]
            take[~clean] = np.arange(len(g)) - np.searchsorted(g, g, side="left") < room[g]
            take = idx[take]
            if len(take):
                self._add(h[take], rel[take], t[take])
                deficit -= np.bincount(rel[take], minlength=R)
                self.noise_count += np.bincount(rel[take][noisy[take]], minlength=R)
            acc[todo] = good[todo] / np.maximum(gen[todo], 1)
            low = good[todo] < 0.01 * gen[todo]
            stall[todo] = np.where(low, stall[todo] + 1, 0)
            newly = todo[(stall[todo] >= 2) & (deficit[todo] > 0)]
            if len(newly):
                saturated[newly] = True
                keep = (self.count[newly] == 0).astype(np.int64)  # an empty relation keeps 1 for the fallback
                moved = int((deficit[newly] - keep).sum())
                deficit[newly] = keep
                open_ = group & ~saturated & (self.role == 0)  # compositions/aliases keep their sizes
                if open_.any():
                    deficit += _allocate(moved, np.where(open_, self.weight, 0.0), np.where(open_, np.inf, 0.0), 0)
                else:  # nothing left to take it: park it on the saturated relations for the caller
                    deficit[newly[0]] += moved

    # ---------------------------------------------------------- the whole run
    def run(self) -> None:
        N, R, E, rng = self.N, self.R, self.E, self.rng
        target = self.targets()
        # 1. coverage: one edge per entity, as head of a fully active N-1/N-N rule relation of its type
        eligible = (self.role == 0) & self.full & np.isin(self.kind, [KINDS.index("N-1"), KINDS.index("N-N")])
        anchor_rel = np.empty(N, dtype=np.int64)
        for ty in range(self.T):
            rels = np.flatnonzero(eligible & (self.dom == ty))
            lo, hi = self.type_start[ty], self.type_start[ty + 1]
            cum = np.cumsum(target[rels].astype(np.float64))
            anchor_rel[lo:hi] = rels[np.minimum(np.searchsorted(cum, rng.random(hi - lo) * cum[-1], side="right"),
                                                len(rels) - 1)]
        heads = np.arange(N)
        tails = np.empty(N, dtype=np.int64)
        o = np.argsort(anchor_rel, kind="stable")
        bounds = np.searchsorted(anchor_rel[o], np.arange(R + 1))
        for r in np.flatnonzero(np.diff(bounds)).tolist():
            hs = o[bounds[r]:bounds[r + 1]]
            rows = self.entity_cluster[hs] - self.cl_type_start[self.dom[r]]
            _, t, noisy = self._noise(r, hs, self._rule_tails(r, rows))
            self.noise_count[r] += int(noisy.sum())
            for _ in range(3):  # redraw self loops
                loop = t == hs
                if not loop.any():
                    break
                t[loop] = self._rule_tails(r, rows[loop])
            loop = t == hs
            if loop.any():  # any other entity of the range type
                g = self.rng_type[r]
                j = rng.integers(self.type_size[g] - 1, size=int(loop.sum()))
                j += j >= hs[loop] - self.type_start[g]
                t[loop] = self.type_start[g] + j
            tails[hs] = t
        self._add(heads, anchor_rel, tails)
        # 2. quotas for the rest (every relation without an edge needs one)
        need = np.maximum(target - self.count, 0)
        empty = self.count == 0
        deficit = _allocate(E - N, need + 1e-9, np.maximum(need, empty), empty.astype(np.int64))
        rule = self.role == 0
        later = np.where(rule, 0, deficit)
        deficit = np.where(rule, deficit, 0)
        # 3. rule relations, then compositions and aliases (from the rule relations' edges)
        self.fill(deficit, rule)
        deficit += later
        self.fill(deficit, ~rule)
        # 4. what saturated relations could not take goes to the rule relations that still accept, then
        #    uniformly within the types (a relation still without an edge gets one there)
        for uniform in (False, True):
            left = int(deficit.sum())
            if left == 0:
                break
            before = int(self.count.sum())
            empty = self.count == 0
            deficit[:] = _allocate(left, np.where(rule, self.weight, 0.0), np.where(rule, np.inf, empty), empty)
            self.fill(deficit, np.ones(R, dtype=bool), uniform=uniform)
            if uniform:
                self.fallback_edges += int(self.count.sum()) - before
        left = E - int(self.count.sum())
        if left > 0:
            self._untyped(left)

    def _untyped(self, left: int) -> None:
        """Last resort for dense requests: ``left`` more triples uniformly over all free ones (kinds and types ignored)."""
        N, R, rng = self.N, self.R, self.rng
        space = R * N * (N - 1)
        if space <= _ENUMERATE_LIMIT:
            keys = np.arange(R * N * N, dtype=np.int64)
            h, t = (keys // N) % N, keys % N
            keys = keys[(h != t) & ~_isin_sorted(keys, self.keys3)]
            pick = np.sort(rng.choice(len(keys), size=left, replace=False))
            k = keys[pick]
        else:
            k = np.zeros(0, dtype=np.int64)
            for _ in range(100):
                cand = rng.integers(0, R * N * N, size=2 * (left - len(k)) + 16)
                h, t = (cand // N) % N, cand % N
                cand = cand[(h != t) & ~_isin_sorted(cand, self.keys3) & ~np.isin(cand, k)]
                cand = cand[_first_mask(cand)]
                k = np.concatenate([k, cand[: left - len(k)]])
                if len(k) == left:
                    break
            else:  # unreachable below half density (checked by _check_config)
                raise UserError(f"could not place {left:,} more edges; ask for fewer edges")
        self._add((k // N) % N, k // (N * N), k % N)
        self.fallback_edges += left


def generate(config: SyntheticConfig) -> SyntheticKG:
    """Generate the KG ``config`` describes (deterministic for ``config``; see the module docstring)."""
    _check_config(config)
    t0, c0 = time.perf_counter(), time.process_time()
    g = _Generator(config)
    g.run()
    h, r, t = g.edges()
    o = np.lexsort((t, r, h))
    triples = np.stack([h[o], r[o], t[o]], axis=1).astype(np.int64)
    assert len(triples) == g.E, (len(triples), g.E)
    relations = [f"{g.type_names[g.dom[k]]}_r{k:04d}_{g.type_names[g.rng_type[k]]}" for k in range(g.R)]
    kg = SyntheticKG(
        entities=g.entity_names, relations=relations, types=list(g.type_names), triples=triples,
        entity_type=g.entity_type, entity_cluster=g.entity_cluster, popularity=g.w, relation_domain=g.dom,
        relation_range=g.rng_type, relation_kind=g.kind, relation_role=g.role, relation_sources=g.sources,
    )
    kg.stats.update(_stats(kg, g, config, time.perf_counter() - t0, time.process_time() - c0))
    return kg


# ------------------------------------------------------------------ statistics
def _powerlaw_fit(deg: np.ndarray) -> dict[str, Any]:
    """Power-law fit of the degree tail (Clauset, Shalizi & Newman 2009): the ``x_min`` minimising the KS
    distance, and the discrete-approximation MLE ``alpha = 1 + n / sum(ln(x / (x_min - 0.5)))``."""
    x = np.sort(deg[deg > 0]).astype(np.float64)
    best: dict[str, Any] = {"alpha": None, "xmin": None, "tail_entities": 0, "ks": None}
    if len(x) < 50:
        return best
    cands = np.unique(np.round(np.geomspace(1, max(1.0, x[-50]), 40)))
    for xmin in cands:
        tail = x[x >= xmin]
        if len(tail) < 50:
            break
        alpha = 1.0 + len(tail) / np.log(tail / (xmin - 0.5)).sum()
        emp = np.searchsorted(tail, tail, side="left") / len(tail)  # P(X < x) in the tail
        fit = 1.0 - ((tail - 0.5) / (xmin - 0.5)) ** (1.0 - alpha)  # same continuous approximation
        ks = float(np.abs(fit - emp).max())
        if best["ks"] is None or ks < best["ks"]:
            best = {"alpha": round(float(alpha), 3), "xmin": int(xmin), "tail_entities": int(len(tail)),
                    "ks": round(ks, 4)}
    return best


def degree_stats(triples: np.ndarray, num_entities: int) -> dict[str, Any]:
    """Degree (in + out, each edge once) summary: max, median, mean, percentiles, log2 histogram, power-law fit."""
    tr = np.asarray(triples, dtype=np.int64).reshape(-1, 3)
    deg = np.bincount(tr[:, 0], minlength=num_entities) + np.bincount(tr[:, 2], minlength=num_entities)
    hist = np.bincount(np.floor(np.log2(np.maximum(deg, 1))).astype(np.int64))
    top = np.sort(deg)[::-1][: max(1, num_entities // 100)]
    return {
        "max": int(deg.max()), "median": float(np.median(deg)), "mean": round(float(deg.mean()), 2),
        "min": int(deg.min()), "p90": float(np.percentile(deg, 90)), "p99": float(np.percentile(deg, 99)),
        "degree_1_entities": int((deg == 1).sum()),
        "top1pct_endpoint_share": round(float(top.sum() / max(1, deg.sum())), 4),
        "log2_histogram": [[2**k, int(c)] for k, c in enumerate(hist.tolist())],  # [lowest degree of bin, entities]
        "powerlaw": _powerlaw_fit(deg),
    }


def _measured_kinds(triples: np.ndarray, num_relations: int) -> np.ndarray:
    """Cardinality class of each relation from its edges (Bordes et al. 2013: tph/hpt < 1.5 is "1")."""
    out = np.full(num_relations, -1, dtype=np.int64)
    r = triples[:, 1]
    n = np.bincount(r, minlength=num_relations).astype(np.float64)
    n_ent = int(triples[:, [0, 2]].max()) + 1 if len(triples) else 1
    heads = np.bincount(np.unique(r * n_ent + triples[:, 0]) // n_ent, minlength=num_relations)
    tails = np.bincount(np.unique(r * n_ent + triples[:, 2]) // n_ent, minlength=num_relations)
    ok = n > 0
    tph = n[ok] / heads[ok]
    hpt = n[ok] / tails[ok]
    many_t, many_h = tph >= 1.5, hpt >= 1.5
    out[ok] = np.where(many_h, np.where(many_t, 3, 2), np.where(many_t, 1, 0))  # KINDS order
    return out


def _stats(kg: SyntheticKG, g: _Generator, c: SyntheticConfig, seconds: float, cpu: float) -> dict[str, Any]:
    tr = kg.triples
    per_rel = np.bincount(tr[:, 1], minlength=kg.num_relations)
    measured = _measured_kinds(tr, kg.num_relations)
    types = [{"name": n, "entities": int(s), "clusters": int(k)}
             for n, s, k in zip(kg.types, g.type_size, g.type_clusters)]
    rels = []
    for r in range(kg.num_relations):
        item = {"name": kg.relations[r], "domain": kg.types[g.dom[r]], "range": kg.types[g.rng_type[r]],
                "kind": KINDS[g.kind[r]], "measured_kind": KINDS[measured[r]] if measured[r] >= 0 else None,
                "role": ROLES[g.role[r]], "edges": int(per_rel[r])}
        if g.role[r] == 1:
            item["composition_of"] = [kg.relations[g.sources[r, 0]], kg.relations[g.sources[r, 1]]]
        elif g.role[r] == 2:
            item["alias_of"] = kg.relations[g.sources[r, 0]]
        rels.append(item)
    cfg = asdict(c)
    cfg["num_types"] = g.T
    return {
        "entities": kg.num_entities, "relations": kg.num_relations,
        "relations_with_inverses": 2 * kg.num_relations, "edges": int(len(tr)),
        "edges_with_inverses": 2 * int(len(tr)), "types": g.T, "clusters": g.C, "seed": int(c.seed),
        "config": cfg, "seconds": round(seconds, 2), "cpu_seconds": round(cpu, 2), "rounds": g.rounds,
        "degree": degree_stats(tr, kg.num_entities),
        "relation_edges": {"max": int(per_rel.max()), "median": float(np.median(per_rel)), "min": int(per_rel.min())},
        "kinds_designed": {k: int((g.kind == i).sum()) for i, k in enumerate(KINDS)},
        "kinds_measured": {k: int((measured == i).sum()) for i, k in enumerate(KINDS)},
        "roles": {k: int((g.role == i).sum()) for i, k in enumerate(ROLES)},
        "fallback_edges": int(g.fallback_edges),
        "type_list": types, "relation_list": rels,
    }


# ------------------------------------------------------------------ writing
def write_tsv(kg: SyntheticKG, path: str | os.PathLike, *, progress: bool = False, what: str = "--out") -> Path:
    """Write ``head<TAB>relation<TAB>tail`` lines atomically (``kgreason.files.open_output``)."""
    from kgreason.progress import progress_bar

    ents, rels = kg.entities, kg.relations
    tr = kg.triples
    step = 200_000
    with open_output(path, what=what) as f, progress_bar(total=len(tr), unit="edge", unit_scale=True, desc="writing",
                                                 disable=not progress, mininterval=0.5) as bar:
        for s in range(0, len(tr), step):
            part = tr[s:s + step].tolist()
            f.write("".join([f"{ents[h]}\t{rels[r]}\t{ents[t]}\n" for h, r, t in part]))
            bar.update(len(part))
    return Path(path)


# ------------------------------------------------------------------ CLI
@dataclass(frozen=True, kw_only=True)
class SyntheticSettings(Settings):
    """What ``python -m experiments.synthetic_kg`` was asked to do; each field's flag is declared with it.

    The ranges here are the flags' (one line naming the flag); :func:`_check_config` checks what needs
    several fields (enough edges, the key space, the types) and the library's own fields."""

    entities: int = setting(low=2, integer=True, help="number of entities (all of them occur)")
    relations: int = setting(low=1, integer=True,
                             help="number of relations before inverses (the loader adds X^-1: twice as many)")
    edges: int = setting(low=1, integer=True, help="number of distinct triples (before inverses)")
    seed: int = setting(0, low=0, high=SEED_MAX, integer=True, help="random seed, 0 to 2**32-1")
    types: int | None = setting(None, shown_default="round(sqrt(entities) / 7), <= 50",
                                help="entity types, 1 to min(relations, entities / 2)")
    out: Path = setting(help="TSV file to write")
    stats_json: Path | None = setting(None, help="also write the statistics as JSON here")
    progress: bool = setting(True, flag="--quiet", negate=True, help="no progress bar and no summary")
    size_check: bool = setting(True, flag="--skip-size-check", negate=True,
                               help="generate even when the estimated memory exceeds MemAvailable or the TSV the "
                                    "free disk space")

    @property
    def config(self) -> SyntheticConfig:
        """The generator's configuration of these settings."""
        return SyntheticConfig(num_entities=self.entities, num_relations=self.relations, num_edges=self.edges,
                               seed=self.seed, num_types=self.types)


#: The former name (before the settings rule, docs/cli.md "Settings classes").
SyntheticArgs = SyntheticSettings


def _parser() -> ArgumentParser:
    p = ArgumentParser(prog="python -m experiments.synthetic_kg", description=__doc__.split("\n\n")[0])
    add_settings_arguments(p, SyntheticSettings)
    return p


def parse_args(argv: Sequence[str] | None = None) -> SyntheticSettings:
    """The settings of ``argv``, checked before anything is allocated: the sizes together
    (:func:`_check_config`), the outputs, and (unless ``--skip-size-check``) memory and disk (:func:`check_fits`)."""
    settings = settings_from_args(SyntheticSettings, _parser().parse_args(argv))
    config = settings.config
    _check_config(config, _FLAGS)
    check_output_file(settings.out, what="--out")
    if settings.stats_json is not None:
        if os.path.realpath(settings.stats_json) == os.path.realpath(settings.out):
            raise UserError(f"--stats-json {settings.stats_json}: is the same file as --out; give another name")
        check_output_file(settings.stats_json, what="--stats-json")
    if settings.size_check:
        check_fits(config, settings.out, flags=_FLAGS)
    return settings


def summary(kg: SyntheticKG) -> str:
    s, d = kg.stats, kg.stats["degree"]
    pl = d["powerlaw"]
    fit = (f", power-law tail alpha {pl['alpha']} for degree >= {pl['xmin']} ({pl['tail_entities']:,} entities)"
           if pl["alpha"] is not None else "")
    return (f"{s['entities']:,} entities ({s['types']} types, {s['clusters']:,} clusters), {s['relations']:,} relations "
            f"({s['relations_with_inverses']:,} with inverses), {s['edges']:,} edges; degree max {d['max']:,}, "
            f"median {d['median']:g}, mean {d['mean']:g}, p99 {d['p99']:g}{fit}; kinds "
            + ", ".join(f"{k} {v}" for k, v in s["kinds_measured"].items()) + " (measured)")


@cli_main
def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    kg = generate(args.config)
    t = time.perf_counter()
    write_tsv(kg, args.out, progress=args.progress)
    kg.stats["seconds_write"] = round(time.perf_counter() - t, 2)
    if args.stats_json is not None:
        write_output(args.stats_json, json.dumps(kg.stats, indent=1) + "\n", what="--stats-json")
    if args.progress:
        print(f"{args.out}: {summary(kg)}; generated in {kg.stats['seconds']:.1f} s, "
              f"written in {kg.stats['seconds_write']:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
