"""pykeen ComplEx training: exported embeddings reproduce pykeen's own scores."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from kgreason.errors import UserError
from kge.graph import load_kg
from kge.train import SIZE_PRESETS, TrainConfig, complex_scores, default_train_config, train_complex


@pytest.fixture(scope="module")
def nations():
    return load_kg("nations")


@pytest.mark.parametrize("loop", ["lcwa", "slcwa"])
def test_exported_embeddings_reproduce_pykeen_scores(nations, loop):
    cfg = TrainConfig(rank=8, epochs=2, batch_size=256, num_negatives=4, training_loop=loop, seed=1,
                      eval_max_triples=50, device="cpu")
    res = train_complex(nations, cfg, progress=False)
    assert res.entity.shape == (14, 8) and res.entity.dtype == np.complex64
    assert res.relation.shape == (110, 8) and res.relation.dtype == np.complex64
    assert len(res.losses) == 2 and all(np.isfinite(res.losses))
    rng = np.random.default_rng(0)
    triples = np.stack([rng.integers(0, 14, 64), rng.integers(0, 110, 64), rng.integers(0, 14, 64)], 1)
    with torch.inference_mode():
        theirs = res.model.score_hrt(torch.as_tensor(triples)).numpy().ravel()
    ours = complex_scores(res.entity, res.relation, triples)
    np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-5)
    # the score is not symmetric in h and t (ComplEx uses conj(e_t), not conj(e_h))
    swapped = complex_scores(res.entity, res.relation, triples[:, [2, 1, 0]])
    assert not np.allclose(ours, swapped)
    assert 0.0 < res.metrics["mrr"] <= 1.0
    assert res.metrics["eval_triples"] == 50 and res.metrics["eval_triples_available"] == len(nations.missing)


def test_training_is_seeded(nations):
    cfg = TrainConfig(rank=4, epochs=1, batch_size=512, seed=7, eval_max_triples=0, device="cpu")
    a = train_complex(nations, cfg, progress=False)
    b = train_complex(nations, cfg, progress=False)
    np.testing.assert_array_equal(a.entity, b.entity)
    assert "mrr" not in a.metrics


def test_size_presets(nations):
    assert default_train_config(nations).rank == SIZE_PRESETS["small"]["rank"]
    assert default_train_config(nations).training_loop == "1n"
    assert default_train_config(nations, rank=3, epochs=None).rank == 3
    assert default_train_config(nations, epochs=None).epochs == SIZE_PRESETS["small"]["epochs"]


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(rank=0), "rank must be >= 1, got 0"),
        (dict(lr=-1.0), "lr must be a finite number > 0, got -1.0"),
        (dict(lr=float("nan")), "lr must be a finite number > 0, got nan"),
        (dict(lr=float("inf")), "lr must be a finite number > 0, got inf"),
        (dict(seed=-1), "seed must be in [0, 4294967295], got -1"),
        (dict(training_loop="1-n"), "training loop must be one of 1n, lcwa, slcwa, got '1-n'"),
        (dict(regularizer_weight=-0.1), "regularizer weight must be >= 0, got -0.1"),
    ],
)
def test_train_config_errors(kwargs, message):
    with pytest.raises(UserError) as exc:
        TrainConfig(**kwargs)
    assert str(exc.value) == message


def test_cuda_request_without_cuda(nations):
    if torch.cuda.is_available():
        pytest.skip("CUDA present")
    with pytest.raises(UserError, match="CUDA is not available"):
        train_complex(nations, TrainConfig(rank=2, epochs=1, device="cuda"), progress=False)
