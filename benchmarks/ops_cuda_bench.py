"""Time ``ops.project`` on one device against torch's own sparse max-product (standalone, no pytest).

For a synthetic FB15k-237-sized stack of relation matrices (N = 14,505 entities, 237 relations,
~272k edges with power-law relation and entity frequencies), it times, per batch size B in
(1, 64, 1024), per relation mix (every row through the largest relation, or each row through its
own random relation) and per input kind (one-hot anchors on an entity with out-edges, or dense
random sets):

* the baseline: ``torch.sparse.mm(Mt, X.T, reduce="amax")`` per relation (Mt the relation's
  transpose as a sparse CSR; one call per distinct relation of the batch, the loop a user would
  write).  Where torch has no such kernel for the device (sparse.mm's reduce is CPU-only in torch
  2.x), a pure-torch gather / ``scatter_reduce_("amax")`` per relation on the same device instead;
  the table says which;
* ``ops.project`` with strategy push, pull and auto, values only and with argmax, and negated.

Every timing is a warm-up then repeated calls between two ``torch.cuda.Event`` records (on the
CPU, ``time.perf_counter``), in ms per call.  Every result's values are compared with the
baseline's (max-times products are exact, so they must be equal); a mismatch is flagged in the
table and makes the script exit with status 1.

It runs on the API before the fold as well (``ops.project_multi`` / ``ops.prepare_stacked``; the
new ``ops.project(X, M, rel)`` / ``ops.prepare_matrices`` are tried first), so the code before and
after the fold can be timed in one GPU session; before the fold it adds the single-relation op it
replaced (``ops.project`` / ``ops.project_negated`` on one prepared matrix) for the one-relation rows.

Run from the repository root::

    python benchmarks/ops_cuda_bench.py --device cuda --out bench.md
    python benchmarks/ops_cuda_bench.py --device cpu --quick      # a small smoke run
    python benchmarks/ops_cuda_bench.py --root ../before --out before.md   # another checkout's ops
"""
from __future__ import annotations

import importlib
import inspect
import platform
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent  # the checkout whose ops is timed, unless --root says otherwise
NEG_SCALE = 3.0  # QTO's (kgreason.constants.QTO_NEG_SCALE); a literal: --root may name a tree before it
STRATEGIES = ("push", "pull", "auto")


@dataclass(frozen=True)
class Config:
    """What one run measures (see --help for the defaults)."""

    device: str
    n: int
    relations: int
    edges: int
    batches: tuple[int, ...]
    min_seconds: float
    max_reps: int
    seed: int
    out: Path | None
    root: Path


# ------------------------------------------------------------------------------------------- data
def synthetic_stack(n: int, relations: int, edges: int, seed: int):
    """(crow int64 (R*N+1,), col int32 (nnz,), val float32 (nnz,)) of a power-law KG's stacked CSR.

    Relation frequencies fall as rank^-0.7 and entity frequencies as rank^-0.8 (roughly as skewed as
    FB15k-237); values uniform in [0.01, 1]; duplicate (r, h, t) edges merged."""
    rng = np.random.default_rng(seed)
    rel_p = 1.0 / np.arange(1, relations + 1) ** 0.7
    ent_p = rng.permutation(1.0 / np.arange(1, n + 1) ** 0.8)
    r = rng.choice(relations, size=edges, p=rel_p / rel_p.sum())
    h = rng.choice(n, size=edges, p=ent_p / ent_p.sum())
    t = rng.choice(n, size=edges, p=ent_p / ent_p.sum())
    key = np.unique((r.astype(np.int64) * n + h) * n + t)  # sorted: stack row r*N+h, then column t
    rows, cols = key // n, key % n
    crow = np.zeros(relations * n + 1, dtype=np.int64)
    np.cumsum(np.bincount(rows, minlength=relations * n), out=crow[1:])
    val = rng.uniform(0.01, 1.0, size=len(key)).astype(np.float32)
    return torch.from_numpy(crow), torch.from_numpy(cols.astype(np.int32)), torch.from_numpy(val)


def relation_triples(crow: torch.Tensor, col: torch.Tensor, val: torch.Tensor, n: int, r: int):
    """(rows i, columns j, values) of M_r, int64 / int64 / float32."""
    lo, hi = int(crow[r * n]), int(crow[(r + 1) * n])
    counts = (crow[r * n + 1 : (r + 1) * n + 1] - crow[r * n : (r + 1) * n]).long()
    rows = torch.repeat_interleave(torch.arange(n), counts)
    return rows, col[lo:hi].long(), val[lo:hi]


def batch(kind: str, rel: torch.Tensor, crow: torch.Tensor, n: int, gen: torch.Generator) -> torch.Tensor:
    """(B, N) float32: one-hot rows on a random head of an edge of the row's relation, or dense."""
    b = rel.numel()
    if kind == "dense":
        return torch.rand(b, n, generator=gen)
    x = torch.zeros(b, n)
    for k, r in enumerate(rel.tolist()):
        lo, hi = int(crow[r * n]), int(crow[(r + 1) * n])
        e = lo + int(torch.randint(hi - lo, (1,), generator=gen))
        i = int(torch.searchsorted(crow[r * n : (r + 1) * n + 1], torch.tensor(e), right=True)) - 1
        x[k, i] = 1.0
    return x


# -------------------------------------------------------------------------------------------- API
class Api:
    """``ops.project(X, M, rel)`` / ``ops.prepare_matrices`` after the fold, ``ops.project_multi(X, rel, M)`` /
    ``ops.prepare_stacked`` before it."""

    def __init__(self, root: Path):
        sys.path.insert(0, str(root))
        self.ops = ops = importlib.import_module("ops")
        self.root = Path(ops.__file__).resolve().parent.parent
        params = inspect.signature(ops.project).parameters
        self.folded = "rel" in params
        self.name = "ops.project" if self.folded else "ops.project_multi"
        self.neg_kw = "negate" if "negate" in params else "negated"

    def prepare(self, crow, col, val, n: int, device: str):
        ops = self.ops
        prepare = getattr(ops, "prepare_matrices", None) or ops.prepare_stacked  # after / before the fold
        return prepare((crow, col, val), num_entities=n, device=device)

    def project(self, x, rel, stack, *, strategy: str, argmax: bool, negated: bool):
        ops = self.ops
        if self.folded:
            return ops.project(x, stack, rel, strategy=strategy, return_argmax=argmax, validate=False,
                               **{self.neg_kw: negated, "neg_scale": NEG_SCALE})
        return ops.project_multi(x, rel, stack, strategy=strategy, return_argmax=argmax, validate=False,
                                 negated=negated, neg_scale=NEG_SCALE)

    def pushed_rows(self, x, rel, stack) -> str:
        """How many rows auto pushes (the per-row plan op), or n/a where the device has none."""
        name = "project_strategy" if self.folded else "project_multi_strategy"
        if not self.ops.has_kernel(name, x.device):
            return "n/a"
        codes = getattr(torch.ops.kgreason, name)(x, rel, stack.crow, stack.n)
        return f"{int((codes == 1).sum())}/{codes.numel()}"


# ---------------------------------------------------------------------------------------- timing
ROUNDS = 3  # timed rounds per measurement; the median round is reported (robust to a noisy neighbour)


def timer(device: torch.device, cfg: Config):
    """measure(fn) -> ms per call of fn(): two warm-up calls, then ROUNDS rounds of repeated calls (as
    many as fill cfg.min_seconds / ROUNDS, at most cfg.max_reps), timed between CUDA events on a GPU."""
    cuda = device.type == "cuda"

    def elapsed_ms(fn, reps: int) -> float:
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(reps):
                fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end)
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        return (time.perf_counter() - t0) * 1e3

    def measure(fn) -> float:
        fn()
        fn()
        if cuda:
            torch.cuda.synchronize(device)
        once = elapsed_ms(fn, 1)
        reps = int(max(1, min(cfg.max_reps, cfg.min_seconds * 1e3 / ROUNDS / max(once, 1e-3))))
        return sorted(elapsed_ms(fn, reps) / reps for _ in range(ROUNDS))[ROUNDS // 2]

    return measure


class Baseline:
    """Per-relation torch max-product on the device: sparse.mm(reduce="amax") when it runs there."""

    def __init__(self, crow, col, val, n: int, device: torch.device):
        self.n, self.device = n, device
        self.crow, self.col, self.val = crow, col, val
        self.cache: dict[int, object] = {}
        probe = torch.sparse_csr_tensor(torch.tensor([0, 1]), torch.tensor([0]), torch.tensor([0.5]), (1, 1),
                                        check_invariants=True)
        try:
            torch.sparse.mm(probe.to(device), torch.ones(1, 1, device=device), reduce="amax")
            self.kind = 'torch.sparse.mm(Mt, X.T, reduce="amax")'
        except (NotImplementedError, RuntimeError):
            self.kind = 'torch gather + scatter_reduce_("amax") (sparse.mm has no reduce kernel here)'
        self.sparse = self.kind.startswith("torch.sparse")

    def _relation(self, r: int):
        if r not in self.cache:
            rows, cols, vals = relation_triples(self.crow, self.col, self.val, self.n, r)
            if self.sparse:  # Mt[j, i] = M_r[i, j]
                mt = torch.sparse_coo_tensor(torch.stack([cols, rows]), vals, (self.n, self.n),
                                             check_invariants=True).coalesce()
                self.cache[r] = mt.to_sparse_csr().to(self.device)
            else:
                self.cache[r] = (rows.to(self.device), cols.to(self.device), vals.to(self.device))
        return self.cache[r]

    def plan(self, rel: torch.Tensor):
        """[(relation, row indices on the device)] of a batch; built once per case, not timed."""
        rel_cpu = rel.cpu()
        return [(int(r), torch.nonzero(rel_cpu == r).flatten().to(self.device)) for r in torch.unique(rel_cpu)]

    def __call__(self, x: torch.Tensor, groups) -> torch.Tensor:
        y = torch.empty_like(x)
        one = len(groups) == 1
        for r, idx in groups:
            xs = x if one else x.index_select(0, idx)
            m = self._relation(r)
            if self.sparse:
                ys = torch.sparse.mm(m, xs.T.contiguous(), reduce="amax").T
            else:
                rows, cols, vals = m
                ys = torch.zeros_like(xs)
                ys.scatter_reduce_(1, cols.expand(xs.shape[0], -1), xs[:, rows] * vals, reduce="amax")
            if one:
                return ys.contiguous()
            y.index_copy_(0, idx, ys)
        return y


# ------------------------------------------------------------------------------------------ cases
def run(cfg: Config) -> tuple[str, bool]:
    device = torch.device(cfg.device)
    api = Api(cfg.root)
    measure = timer(device, cfg)
    gen = torch.Generator().manual_seed(cfg.seed)
    crow, col, val = synthetic_stack(cfg.n, cfg.relations, cfg.edges, cfg.seed)
    stack = api.prepare(crow, col, val, cfg.n, cfg.device)
    nnz_r = (crow[cfg.n :: cfg.n] - crow[: -1 : cfg.n]).long()
    largest = int(torch.argmax(nnz_r))
    base = Baseline(crow, col, val, cfg.n, device)
    ok = True

    head = ["relations", "X", "B", "baseline", "push", "pull", "auto", "base/auto", "push+arg", "pull+arg",
            "auto+arg", "negated", "auto pushes", "same as baseline"]
    rows = []
    old_rows = []
    for mix in ("one", "mixed"):
        for kind in ("one-hot", "dense"):
            for b in cfg.batches:
                if mix == "one":
                    rel = torch.full((b,), largest, dtype=torch.int64)
                else:
                    rel = torch.randint(cfg.relations, (b,), generator=gen)
                    rel = torch.where(nnz_r[rel] > 0, rel, torch.full_like(rel, largest))
                x = batch(kind, rel, crow, cfg.n, gen).to(device)
                rel_d = rel.to(device)
                groups = base.plan(rel)
                y_ref = base(x, groups)
                t_base = measure(lambda: base(x, groups))
                cells, same, argmaxes = {}, [], []
                for s in STRATEGIES:
                    for arg in (False, True):
                        res = api.project(x, rel_d, stack, strategy=s, argmax=arg, negated=False)
                        y = res[0] if arg else res
                        same.append(torch.equal(y, y_ref))
                        if arg:  # every strategy's argmax the same (the smallest maximising i)
                            argmaxes.append(res[1])
                            same.append(torch.equal(res[1], argmaxes[0]))
                        cells[(s, arg)] = measure(
                            lambda s=s, arg=arg: api.project(x, rel_d, stack, strategy=s, argmax=arg, negated=False))
                t_neg = measure(lambda: api.project(x, rel_d, stack, strategy="auto", argmax=False, negated=True))
                good = all(same)
                ok &= good
                rows.append([
                    "1 (largest)" if mix == "one" else "per row", kind, str(b), f"{t_base:.3f}",
                    *(f"{cells[(s, False)]:.3f}" for s in STRATEGIES), f"{t_base / cells[('auto', False)]:.2f}x",
                    *(f"{cells[(s, True)]:.3f}" for s in STRATEGIES), f"{t_neg:.3f}",
                    api.pushed_rows(x, rel_d, stack), "yes" if good else "**NO**",
                ])
                if mix == "one" and not api.folded:
                    row, good_single = single_relation_row(api.ops, stack, largest, x, y_ref, kind, b, t_base,
                                                           measure)
                    old_rows.append(row)
                    ok &= good_single
                print(f"{rows[-1][0]:>12} {kind:>8} B={b:<5} baseline {t_base:9.3f} ms  auto "
                      f"{cells[('auto', False)]:9.3f} ms  same={good}", file=sys.stderr, flush=True)

    lines = [
        f"# ops.project on {device_name(device)}",
        "",
        f"Command: `python benchmarks/{Path(__file__).name} {' '.join(sys.argv[1:])}`  ",
        f"torch {torch.__version__}, API: `{api.name}` ({'after' if api.folded else 'before'} the fold) "
        f"from {api.root}, host {platform.node()}  ",
        f"Stack: synthetic power-law KG, N = {cfg.n:,}, R = {cfg.relations}, nnz = {stack.nnz:,} "
        f"(largest relation {largest}: {int(nnz_r[largest]):,} entries), seed {cfg.seed}.  ",
        f"Baseline: {base.kind}, one call per distinct relation of the batch.  ",
        f"ms per call (warm-up, then the median of {ROUNDS} rounds of repeated calls"
        f"{', timed by CUDA events' if device.type == 'cuda' else ''}); base/auto > 1 means ops.project "
        "is faster. Negated: strategy auto (always the pull form). \"auto pushes\": rows auto pushes "
        "(ops.project_strategies; the CPU plans each row, CUDA pushes every row). \"same as baseline\": "
        "every strategy's values equal the baseline's and their argmax each other's.",
        "",
        table(head, rows),
    ]
    if old_rows:
        lines += ["", "Before the fold, the single-relation op on the largest relation "
                  "(`ops.project` / `ops.project_negated` on `stack.relation(r)`), ms per call:", "",
                  table(["X", "B", "baseline", "push", "pull", "auto", "base/auto", "push+arg", "pull+arg",
                         "auto+arg", "negated", "same as baseline"], old_rows)]
    return "\n".join(lines) + "\n", ok


def single_relation_row(ops, stack, r: int, x, y_ref, kind: str, b: int, t_base: float,
                        measure) -> tuple[list[str], bool]:
    """The former single-relation op's timings on M_r (the table's cells) and whether its values
    equal the baseline's for every strategy."""
    m = stack.relation(r)
    good = all(torch.equal(ops.project(x, m, strategy=s, validate=False), y_ref) for s in STRATEGIES)
    t = {(s, arg): measure(lambda s=s, arg=arg: ops.project(x, m, strategy=s, return_argmax=arg, validate=False))
         for s in STRATEGIES for arg in (False, True)}
    t_neg = measure(lambda: ops.project_negated(x, m, neg_scale=NEG_SCALE, validate=False))
    return [kind, str(b), f"{t_base:.3f}", *(f"{t[(s, False)]:.3f}" for s in STRATEGIES),
            f"{t_base / t[('auto', False)]:.2f}x", *(f"{t[(s, True)]:.3f}" for s in STRATEGIES), f"{t_neg:.3f}",
            "yes" if good else "**NO**"], good


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"CPU ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"


def table(head: list[str], rows: list[list[str]]) -> str:
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out)


# --------------------------------------------------------------------------------------------- CLI
def parse(argv: list[str] | None) -> Config:
    """The command line as a :class:`Config`; mistakes (and an ``--out`` that exists without ``--overwrite``,
    is a folder or lies inside ``--root``'s ops package) are one-line UserErrors before any timing."""
    from kgreason.cli import ArgumentParser, check_seed
    from kgreason.errors import UserError
    from kgreason.files import check_output_file

    p = ArgumentParser(prog="python benchmarks/ops_cuda_bench.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                   help="device to time on (default: cuda when available)")
    p.add_argument("--quick", action="store_true",
                   help="a small smoke run: N = 2,000, 20 relations, 20k edges, B in (1, 16), short timings")
    p.add_argument("--seed", type=int, default=0, help="seed of the synthetic KG and the batches (default 0)")
    p.add_argument("--out", type=Path, metavar="FILE", help="also write the markdown table to FILE")
    p.add_argument("--root", type=Path, default=ROOT, metavar="DIR",
                   help="time the ops package of this checkout (its extension built), e.g. the code before a "
                        "change (default: the checkout holding this script)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --out file")
    a = p.parse_args(argv)
    check_seed(a.seed)
    try:
        device = torch.device(a.device)
    except (RuntimeError, ValueError):
        p.error(f"--device: unknown device {a.device!r} (e.g. cpu, cuda, cuda:1)")
    if device.type == "cuda" and not torch.cuda.is_available():
        p.error("--device: CUDA is not available here (torch.cuda.is_available() is False); try --device cpu")
    if not (a.root / "ops" / "__init__.py").is_file():
        p.error(f"--root: {a.root} holds no ops package (ops/__init__.py)")
    if a.out is not None:
        check_output_file(a.out, what="--out", inputs=[("--root's ops", a.root / "ops")])
        if a.out.exists() and not a.overwrite:
            raise UserError(f"--out {a.out}: already exists; pass --overwrite to replace it")
    if a.quick:
        return Config(a.device, 2_000, 20, 20_000, (1, 16), 0.02, 5, a.seed, a.out, a.root)
    return Config(a.device, 14_505, 237, 272_115, (1, 64, 1024), 0.2, 200, a.seed, a.out, a.root)


def main(argv: list[str] | None = None) -> int:
    """The CLI (one-line errors, status 2: :func:`kgreason.errors.cli_main`)."""
    from kgreason.errors import cli_main

    return cli_main(_main)(argv)


def _main(argv: list[str] | None = None) -> int:
    from kgreason.files import write_output

    cfg = parse(argv)
    # torch's one-time notice on creating a sparse CSR tensor (the baseline's matrices)
    warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta", category=UserWarning)
    # torch 2.11's notice on the same tensors (seen on a lent GPU machine's image)
    warnings.filterwarnings("ignore", message="Sparse invariant checks are implicitly disabled", category=UserWarning)
    if cfg.device == "cpu" or cfg.device.startswith("cpu"):
        torch.set_num_threads(max(1, min(2, torch.get_num_threads())))
    text, ok = run(cfg)
    print(text)
    if cfg.out is not None:
        write_output(cfg.out, text, what="--out")
    if not ok:
        print("error: a result differs from the baseline (rows marked **NO**)", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
