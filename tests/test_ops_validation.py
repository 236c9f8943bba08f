"""Bad input raises ValueError (kgreason.errors.UserError) naming the argument and what it got."""
from __future__ import annotations

import pytest
import torch

import ops
from kgreason.errors import UserError


def _csr(n=4, index_dtype=torch.int32, values=None):
    d = torch.eye(n) * 0.5
    m = d.to_sparse_csr()
    vals = m.values() if values is None else values
    return torch.sparse_csr_tensor(m.crow_indices().to(index_dtype), m.col_indices().to(index_dtype), vals,
                                   size=(n, n), check_invariants=True)


def _raw_csr(crow, col, val, n):
    return torch.sparse_csr_tensor(torch.tensor(crow, dtype=torch.int32), torch.tensor(col, dtype=torch.int32),
                                   torch.tensor(val), size=(n, n), check_invariants=False)


X = torch.rand(2, 4)


@pytest.mark.parametrize(
    "x,match",
    [
        (torch.rand(2, 4).double(), r"X: expected dtype torch.float32, got torch.float64"),
        (torch.rand(4), r"X: expected a 2-D tensor .*unsqueeze"),
        (torch.rand(2, 5), r"X: expected shape \(B, N\) with N = 4"),
        (torch.full((2, 4), 1.5), r"X: values must lie in \[0, 1\], got min .* max 1.5"),
        (torch.full((2, 4), -0.1), r"X: values must lie in \[0, 1\]"),
        (torch.full((2, 4), float("nan")), r"X: values must lie in \[0, 1\]"),
        (torch.rand(2, 4).to_sparse(), r"X: expected a dense"),
        ([[0.5] * 4], r"X: expected a torch.Tensor, got list"),
    ],
)
def test_bad_x(x, match):
    for negate in (False, True):
        with pytest.raises(UserError, match=match):
            ops.project(x, _csr(), negate=negate)


@pytest.mark.parametrize(
    "m,match",
    [
        (torch.eye(4), r"M: expected layout torch.sparse_csr, got torch.strided"),
        (torch.eye(4).to_sparse_coo(), r"M: expected layout torch.sparse_csr"),
        (torch.rand(4, 5).to_sparse_csr(), r"M: expected a square N x N matrix, got shape \(4, 5\)"),
        (torch.eye(4, dtype=torch.float64).to_sparse_csr(), r"M: expected dtype torch.float32"),
        (_csr(values=torch.full((4,), 2.0)), r"M: values must lie in \[0, 1\], got min 2.0"),
        (_raw_csr([0, 1, 2, 3, 5], [0, 1, 2, 3], [0.5] * 4, 4), r"M: crow_indices must start at 0 and end at nnz=4"),
        (_raw_csr([0, 2, 1, 3, 4], [0, 1, 2, 3], [0.5] * 4, 4), r"M: crow_indices must be non-decreasing"),
        (_raw_csr([0, 1, 2, 3, 4], [0, 1, 2, 9], [0.5] * 4, 4), r"M: column indices must lie in \[0, 4\), got 0..9"),
        ("relation", r"M: expected a sparse CSR \(N, N\) matrix or \(R\*N, N\) stack, a StackedMatrices or a "
                     r"\(crow, col, val\) triple, got str"),
    ],
)
def test_bad_matrix(m, match):
    with pytest.raises(ValueError, match=match):
        ops.project(X, m)
    with pytest.raises(ValueError, match=match):
        ops.prepare_matrices(m)


def test_bad_options():
    with pytest.raises(UserError, match=r"strategy: expected one of \('auto', 'push', 'pull'\), got 'sideways'"):
        ops.project(X, _csr(), strategy="sideways")
    with pytest.raises(UserError, match=r"neg_scale: expected a finite number >= 0, got -1.0"):
        ops.project(X, _csr(), negate=True, neg_scale=-1)
    with pytest.raises(UserError, match=r"neg_scale: expected a number, got 'x'"):
        ops.project(X, _csr(), negate=True, neg_scale="x")
    with pytest.raises(UserError, match=r"tnorm: expected one of \('product', 'godel'\), got 'lukasiewicz'"):
        ops.intersect(X, X, tnorm="lukasiewicz")
    with pytest.raises(UserError, match=r"union argument 1: shape \(3, 4\) differs from argument 0's \(2, 4\)"):
        ops.union(X, torch.rand(3, 4))
    with pytest.raises(UserError, match=r"intersect argument 1: values must lie in \[0, 1\]"):
        ops.intersect(X, X + 1)
    with pytest.raises(UserError, match=r"intersect: needs at least one fuzzy set"):
        ops.intersect()
    with pytest.raises(UserError, match=r"k: expected an integer >= 0, got -1"):
        ops.topk_prune(X, -1)
    with pytest.raises(UserError, match=r"X: values must lie in \[0, 1\]"):
        ops.negate(X * 3)


def test_validate_false_skips_only_the_value_scan():
    ops.project(X, _csr(), validate=False)
    with pytest.raises(UserError, match="dtype"):
        ops.project(X.double(), _csr(), validate=False)


@pytest.mark.cuda
def test_device_mismatch():
    with pytest.raises(UserError, match=r"X: is on cuda:0 but the matrix M is on cpu"):
        ops.project(X.cuda(), _csr())


