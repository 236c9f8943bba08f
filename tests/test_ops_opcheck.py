"""``torch.library.opcheck`` of every ``torch.ops.kgreason.*`` op, per device (extension-cpp's standard).

opcheck runs each op on sample inputs and checks its schema (no undeclared
mutation or aliasing), its autograd registration, its fake kernel
(ops/_fake.py: output shapes, dtypes and devices equal to the real kernel's)
and tracing with dynamic shapes (aot_autograd).  A test also pins the list of
ops, so a new op cannot land without a fake kernel and sample inputs here.
"""
from __future__ import annotations

import pytest
import torch
from torch.library import opcheck

import ops
from _ops_helpers import random_batch, random_csr_multigraph, random_matrix
from kgreason.constants import QTO_NEG_SCALE

pytestmark = pytest.mark.skipif(not ops.extension_available(), reason="compiled extension ops._C not built")


def _prepared(gen: torch.Generator, device: str, index_dtype: torch.dtype, n: int = 30) -> ops.StackedMatrices:
    """A one-relation stack (a single N x N matrix)."""
    m, _ = random_matrix(n, 0.15, gen, index_dtype=index_dtype, empty_rows=3, empty_cols=3)
    p = ops.prepare_matrices(m).to(device)
    # Plain tensors: the CSR views of a sparse tensor would drag the sparse base into tracing.
    return ops.StackedMatrices(p.n, 1, *(t.clone() for t in (p.crow, p.col, p.val, p.tcrow, p.trow, p.tval)))


def _samples(op: str, device: str, gen: torch.Generator) -> list[tuple]:
    """Sample argument tuples of ``torch.ops.kgreason.<op>`` covering its modes."""
    out: list[tuple] = []
    if op in ("project", "project_out", "project_strategy"):
        n, r = 20, 3
        stacks = []
        for index_dtype in (torch.int32, torch.int64):
            mats = [random_matrix(n, 0.2, gen, index_dtype=index_dtype)[1] for _ in range(r)]
            st = ops.prepare_matrices(torch.cat(mats).to_sparse_csr(), device=device)
            # plain tensors, as for _prepared
            stacks.append((r, [x.clone() for x in (st.crow.to(index_dtype), st.col.to(index_dtype), st.val,
                                                   st.tcrow.to(index_dtype), st.trow.to(index_dtype), st.tval)]))
            p = _prepared(gen, device, index_dtype, n=n)  # the degenerate one-relation stack, every row relation 0
            stacks.append((1, [p.crow, p.col, p.val, p.tcrow, p.trow, p.tval]))
        for nrel, t in stacks:
            rel = torch.randint(0, nrel, (5,), generator=gen).to(device)
            for kind in ("onehot", "dense"):
                x = random_batch(5, n, kind, gen).to(device)
                if op == "project_strategy":
                    out.append((x, rel, t[0], n))
                    continue
                for strategy in (0, 1, 2):
                    for negated in (False, True):
                        if op == "project_out":  # writes into y (and argmax unless empty)
                            y = torch.empty(x.shape, device=device)
                            a = torch.empty(x.shape if strategy != 1 else (0,), dtype=torch.int32, device=device)
                            out.append((x, rel, *t, n, strategy, negated, QTO_NEG_SCALE, y, a))
                        else:
                            out.append((x, rel, *t, n, strategy, negated, QTO_NEG_SCALE, strategy != 1))
    elif op == "project_multi_sparse":
        from ops.sparse_rows import SparseRows

        n, r = 20, 3
        # (pointer dtype, column dtype) of the stack: the artifact's int64 / int32, and the other mix
        for ptr_dtype, idx_dtype in ((torch.int64, torch.int32), (torch.int32, torch.int64)):
            mats = [random_matrix(n, 0.2, gen)[1] for _ in range(r)]
            st = ops.prepare_matrices(torch.cat(mats).to_sparse_csr(), device=device)
            m = (st.crow.to(ptr_dtype).clone(), st.col.to(idx_dtype).clone(), st.val.clone())
            rel = torch.randint(0, r, (5,), generator=gen).to(device)
            for kind in ("onehot", "dense"):
                x = SparseRows.from_dense(random_batch(5, n, kind, gen).to(device))
                out.append((x.crow, x.col, x.val, rel, *m, n))
        z = torch.zeros(1, dtype=torch.int64, device=device)
        out.append((z, z[:0], torch.zeros(0, device=device), z[:0], *m, n))  # no rows
    elif op == "sparse_align":
        from ops.sparse_rows import SparseRows

        for k in (1, 2, 3):
            xs = [SparseRows.from_dense(torch.rand(5, 17, generator=gen) * (torch.rand(5, 17, generator=gen) < 0.5))
                  for _ in range(k)]
            for intersect in (True, False):
                out.append(([x.crow.to(device) for x in xs], [x.col.to(device) for x in xs],
                            [x.val.to(device) for x in xs], intersect))
    elif op == "calibrate_rows":
        for index_dtype in (torch.int32, torch.int64):
            s = torch.randn(6, 40, generator=gen) * 4
            counts = torch.tensor([0, 2, 1, 0, 40, 3])  # row 4: every column observed
            ptr = torch.zeros(7, dtype=torch.int64)
            torch.cumsum(counts, 0, out=ptr[1:])
            cols = torch.cat([torch.randint(0, 40, (2,), generator=gen), torch.tensor([5]), torch.arange(40),
                              torch.randint(0, 40, (3,), generator=gen)]).to(index_dtype)
            for threshold in (1e-3, 0.9):
                out.append((s.to(device), ptr.to(device), cols.to(device), threshold, 1e-4))
        z = torch.zeros(1, dtype=torch.int64, device=device)
        out.append((torch.zeros(0, 40, device=device), z, z[:0], 1e-3, 1e-4))  # no rows
    elif op == "calibrate_row_stats":
        out += [(torch.randn(6, 40, generator=gen).to(device),), (torch.zeros(0, 40, device=device),),
                (torch.zeros(3, 0, device=device),)]  # a zero-width block
    elif op == "calibrate_rows_normalised":
        s = torch.randn(6, 40, generator=gen) * 4
        m = s.amax(dim=1) + torch.rand(6, generator=gen)  # a larger row max: other blocks' scores
        scale = torch.rand(6, generator=gen) * 0.5 + 0.01
        ptr = torch.tensor([0, 2, 3, 3, 43, 43, 46])
        for index_dtype in (torch.int32, torch.int64):
            cols = torch.cat([torch.randint(0, 40, (3,), generator=gen), torch.arange(40),
                              torch.randint(0, 40, (3,), generator=gen)]).to(index_dtype)
            for threshold in (1e-3, 0.9):
                out.append((s.to(device), m.to(device), scale.to(device), ptr.to(device), cols.to(device), threshold,
                            1e-4))
        z = torch.zeros(1, dtype=torch.int64, device=device)
        e = torch.zeros(0, device=device)
        out.append((torch.zeros(0, 40, device=device), e, e, z, z[:0], 1e-3, 1e-4))  # no rows
    elif op == "csr_transpose":
        for index_dtype in (torch.int32, torch.int64):
            p = _prepared(gen, device, index_dtype)
            out.append((p.crow, p.col, p.val, p.n))
    elif op == "fuzzy_reduce":
        for k in (2, 3):
            xs = [torch.rand(5, 17, generator=gen).to(device) for _ in range(k)]
            out += [(xs, code) for code in range(4)]
    elif op == "dijkstra":
        indptr, tails, rels, costs = random_csr_multigraph(gen, 25, 4, 90)
        n = indptr.numel() - 1
        sources = torch.tensor([0, 3, 3, 7])
        none_i, none_f = torch.empty(0, dtype=torch.int64), torch.empty(0, dtype=torch.float32)
        shared_t, per_t = torch.tensor([5, -1, 9]), torch.randint(-1, n, (4, 2), generator=gen)
        h = torch.zeros(n)
        for targets, heuristic in ((none_i, none_f), (shared_t, none_f), (per_t, h)):
            for max_hops in (-1, 2):
                for preds in (True, False):
                    for heap in (0, 2, 4):
                        out.append((indptr, tails, rels, costs, sources, targets, heuristic, max_hops, preds, heap))
    else:  # pragma: no cover - guarded by test_every_op_has_samples
        raise KeyError(op)
    return out


#: Every op of the extension (csrc/*.cpp); each needs a fake kernel in ops/_fake.py and samples above.
OPS = ["calibrate_row_stats", "calibrate_rows", "calibrate_rows_normalised", "csr_transpose", "dijkstra", "fuzzy_reduce",
       "project", "project_multi_sparse", "project_out", "project_strategy", "sparse_align"]


def test_every_op_is_checked():
    registered = {name.split("::", 1)[1] for name in torch._C._dispatch_get_all_op_names()
                  if name.startswith("kgreason::")}
    assert registered == set(OPS), f"ops without opcheck samples: {registered - set(OPS)}"


def _signature(value) -> tuple:
    """Dtypes, ranks and emptiness of tensors (recursively): what can change an op's code path in tracing."""
    if isinstance(value, torch.Tensor):
        return (value.dtype, value.dim(), value.numel() == 0)
    if isinstance(value, (list, tuple)):
        return tuple(_signature(v) for v in value)
    return ()


def _distinct(fn, samples: list[tuple]) -> list[tuple]:
    """One sample per distinct (input signature, output shapes) pair: opcheck's aot_autograd
    tracing costs about a second a call; the fake test below still runs every sample."""
    seen, out = set(), []
    for args in samples:
        res = fn(*args)
        res = res if isinstance(res, tuple) else () if res is None else (res,)  # out ops return None
        key = (_signature(args), tuple((r.dim(), r.dtype) for r in res), tuple(
            a for a in args if isinstance(a, bool)))
        if key not in seen:
            seen.add(key)
            out.append(args)
    return out


@pytest.mark.parametrize("op", OPS)
def test_opcheck(device, seed, op):
    if not ops.has_kernel(op, device):
        pytest.skip(f"kgreason::{op} has no {device} kernel")
    gen = torch.Generator().manual_seed(seed)
    fn = getattr(torch.ops.kgreason, op)
    for args in _distinct(fn, _samples(op, device, gen)):
        # raises OpCheckError naming the failed check (schema, autograd registration, fake, aot dispatch)
        opcheck(fn, args)


#: Ops whose output sizes depend on input values: their fakes allocate unbacked sizes (as torch.nonzero's),
#: which needs a ShapeEnv; those dimensions are compared as "any size".
DATA_DEPENDENT = {"calibrate_rows", "calibrate_rows_normalised", "project_multi_sparse", "sparse_align"}


def _static_shape(fake_shape, real_shape) -> tuple:
    """The real shape with the dimensions the fake left symbolic (data-dependent) replaced by None."""
    return tuple(r if isinstance(f, int) else None for f, r in zip(fake_shape, real_shape))


@pytest.mark.parametrize("op", OPS)
def test_fake_kernel_matches_real_outputs(device, seed, op):
    """Under FakeTensorMode each op's outputs have the real kernel's shapes, dtypes and devices."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    if not ops.has_kernel(op, device):
        pytest.skip(f"kgreason::{op} has no {device} kernel")
    gen = torch.Generator().manual_seed(seed)
    fn = getattr(torch.ops.kgreason, op)
    for args in _samples(op, device, gen):
        real = fn(*args)
        shape_env = ShapeEnv() if op in DATA_DEPENDENT else None
        with FakeTensorMode(allow_non_fake_inputs=True, shape_env=shape_env, static_shapes=True) as mode:
            fake_args = [mode.from_tensor(a) if isinstance(a, torch.Tensor) else
                         [mode.from_tensor(t) for t in a] if isinstance(a, list) else a for a in args]
            fake = fn(*fake_args)
        if real is None:  # an out op (project_out): nothing returned
            assert fake is None, f"kgreason::{op}: the real kernel returns None, the fake {fake!r}"
            continue
        real = real if isinstance(real, tuple) else (real,)
        fake = fake if isinstance(fake, tuple) else (fake,)
        assert len(real) == len(fake)
        for i, (r, f) in enumerate(zip(real, fake)):
            assert r.dim() == f.dim(), f"kgreason::{op} output {i}: real {r.dim()}-D, fake {f.dim()}-D"
            static = _static_shape(f.shape, r.shape)
            fake_static = tuple(d if isinstance(d, int) else None for d in f.shape)
            assert (static, r.dtype, r.device) == (fake_static, f.dtype, f.device), \
                f"kgreason::{op} output {i}: real {tuple(r.shape)} {r.dtype} {r.device}, " \
                f"fake {tuple(f.shape)} {f.dtype} {f.device} (seed={seed})"


def test_csr_transpose_kernel_equals_reference(seed):
    """ops.prepare_matrices's transpose of one matrix comes from the kernel when it is built: it must equal the
    torch reference exactly."""
    from ops.prepared import _transpose_reference

    gen = torch.Generator().manual_seed(seed)
    for index_dtype in (torch.int32, torch.int64):
        p = _prepared(gen, "cpu", index_dtype, n=120)
        got = torch.ops.kgreason.csr_transpose(p.crow, p.col, p.val, p.n)
        want = _transpose_reference(p.n, p.crow, p.col, p.val)
        for g, w, name in zip(got, want, ("ccol", "row", "tval")):
            assert g.dtype == w.dtype and torch.equal(g, w), f"{name} differs ({index_dtype}, seed={seed})"
