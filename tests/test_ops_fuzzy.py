"""Fuzzy intersection / union / negation / top-k pruning, backend selection."""
from __future__ import annotations

import functools

import pytest
import torch

import ops
from _ops_helpers import BACKENDS, require_backend


def _formula(kind: str, tnorm: str, xs: list[torch.Tensor]) -> torch.Tensor:
    if kind == "intersect":
        return functools.reduce(torch.mul if tnorm == "product" else torch.minimum, xs)
    if tnorm == "godel":
        return functools.reduce(torch.maximum, xs)
    return 1.0 - functools.reduce(torch.mul, [1.0 - x for x in xs])


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", ["intersect", "union"])
@pytest.mark.parametrize("tnorm", ops.TNORMS)
@pytest.mark.parametrize("k", [1, 2, 3, 9])
@pytest.mark.parametrize("shape", [(1, 1), (5, 37), (3, 10000)])
def test_reduce_matches_formula(device, seed, backend, kind, tnorm, k, shape):
    require_backend(backend, "fuzzy_reduce", device)
    gen = torch.Generator().manual_seed(seed)
    xs = [torch.rand(*shape, generator=gen) for _ in range(k)]
    xs[0].view(-1)[:3] = torch.tensor([0.0, 1.0, 0.5])[: xs[0].numel()]  # the extremes
    want = _formula(kind, tnorm, xs)
    fn = getattr(ops, kind)
    got = fn(*[x.to(device) for x in xs], tnorm=tnorm, backend=backend).cpu()
    assert torch.equal(got, want), f"{kind}/{tnorm}/{backend} differs (seed={seed})"
    assert not torch.isnan(got).any() and bool(((got >= 0) & (got <= 1)).all())
    assert fn(xs, tnorm=tnorm, backend=backend).shape == shape  # a list works too


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("tnorm", ops.TNORMS)
@pytest.mark.parametrize("kind", ["intersect", "union"])
def test_reduce_closed_on_extremes(device, backend, tnorm, kind):
    require_backend(backend, "fuzzy_reduce", device)
    vals = torch.tensor([0.0, 1.0, 1e-38, 1.0 - 2**-24], device=device)
    xs = [vals[torch.tensor(c)].reshape(2, 2) for c in ([0, 1, 2, 3], [1, 1, 3, 3], [3, 2, 1, 0])]
    got = getattr(ops, kind)(*xs, tnorm=tnorm, backend=backend)
    assert not torch.isnan(got).any() and bool(((got >= 0) & (got <= 1)).all())


def test_negate_closed_on_extremes(device):
    vals = torch.tensor([0.0, 1.0, 1e-38, 1.0 - 2**-24], device=device)
    neg = ops.negate(vals)
    assert torch.equal(neg.cpu(), 1.0 - vals.cpu())


def test_single_input_is_a_copy():
    x = torch.rand(2, 3)
    y = ops.intersect(x)
    assert torch.equal(x, y) and y.data_ptr() != x.data_ptr()


@pytest.mark.parametrize("k", [0, 1, 3, 7, 50])
def test_topk_prune(device, seed, k):
    gen = torch.Generator().manual_seed(seed)
    x = torch.tensor([0.0, 0.25, 0.5, 1.0])[torch.randint(0, 4, (6, 12), generator=gen)]  # many ties
    got = ops.topk_prune(x.to(device), k).cpu()
    _, idx = torch.sort(x, dim=1, descending=True, stable=True)
    want = torch.zeros_like(x)
    kk = min(k, x.shape[1])
    want.scatter_(1, idx[:, :kk], torch.gather(x, 1, idx[:, :kk]))
    assert torch.equal(got, want), f"k={k} (seed={seed})"
    assert bool(((got > 0).sum(dim=1) <= k).all())


def test_backend_selection(monkeypatch):
    assert isinstance(ops.extension_available(), bool)
    try:
        ops.set_backend("reference")
        assert ops.get_backend() == "reference"
        x = torch.rand(2, 3)
        assert torch.equal(ops.union(x, x), 1.0 - (1.0 - x) * (1.0 - x))
        ops.set_backend("auto")
        assert ops.get_backend() is None
        with pytest.raises(ValueError, match="backend"):
            ops.set_backend("fortran")
    finally:
        ops.set_backend(None)
    with pytest.raises(ValueError, match="backend"):
        ops.union(torch.rand(2, 3), torch.rand(2, 3), backend="fortran")
    if not ops.extension_available():
        with pytest.raises(ValueError, match="cpp"):
            ops.set_backend("cpp")
