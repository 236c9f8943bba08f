"""The CUDA projection's strategy rule: auto pushes every row (csrc/cuda/project_cuda.cu says why, with the
H200 measurements), and every strategy returns the same Y and argmax as the pure-torch reference.

Runs only where a GPU and the CUDA build of the extension exist (the `cuda` marker; benchmarks/gpu_check.sh).
"""
from __future__ import annotations

import pytest
import torch

import ops
from _ops_helpers import random_batch, random_matrix

pytestmark = pytest.mark.cuda


def _mixed_stack(n: int, r: int, gen: torch.Generator) -> ops.StackedMatrices:
    dense = [random_matrix(n, 0.05, gen, empty_rows=n // 5, empty_cols=n // 5)[1] for _ in range(r)]
    return ops.prepare_matrices(torch.cat(dense).to_sparse_csr(), num_entities=n)


@pytest.mark.parametrize("n, b", [(1, 1), (257, 33), (2000, 96)])
def test_auto_pushes_every_row_and_all_strategies_agree(seed, n, b):
    if not ops.has_kernel("project", "cuda"):
        pytest.skip("no CUDA kernel in ops._C")
    gen = torch.Generator().manual_seed(seed)
    r = 3
    stack = _mixed_stack(n, r, gen)
    # one-hot anchors, ~2% active sets, dense rows and all-zero rows: the old per-row plan sent the dense
    # rows to pull
    kinds = ("onehot", "sparse", "dense", "zeros")
    x = torch.cat([random_batch(b // 4 + 1, n, k, gen) for k in kinds])
    rel = torch.randint(0, r, (x.shape[0],), generator=gen)
    codes = ops.project_strategies(x.cuda(), stack.to("cuda"), rel.cuda())
    assert codes.device.type == "cuda" and codes.dtype == torch.int32 and codes.shape == (x.shape[0],)
    assert codes.eq(ops.STRATEGIES["push"]).all(), codes
    y_ref, a_ref = ops.project(x, stack, rel, return_argmax=True, backend="reference")
    for strategy in ("auto", "push", "pull"):
        y, a = ops.project(x.cuda(), stack.to("cuda"), rel.cuda(), return_argmax=True, strategy=strategy)
        assert torch.equal(y.cpu(), y_ref), f"{strategy}: Y differs (seed {seed})"
        assert torch.equal(a.cpu(), a_ref), f"{strategy}: argmax differs (seed {seed})"
        y_only = ops.project(x.cuda(), stack.to("cuda"), rel.cuda(), strategy=strategy)
        assert torch.equal(y_only.cpu(), y_ref), f"{strategy} without argmax: Y differs (seed {seed})"
