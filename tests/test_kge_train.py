"""ComplEx training settings and pykeen's loops: presets as overrides of TrainConfig's defaults, one set of
checks for Python keywords and kge.build flags, exported embeddings reproduce pykeen's own scores."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from kgreason.errors import UserError
from kge.graph import load_kg
from kge.train import (PRESET_OVERRIDES, SIZE_PRESETS, TrainConfig, complex_scores, default_train_config,
                       train_complex)


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


@pytest.mark.parametrize("loop", ["1n", "slcwa"])
def test_training_is_seeded(nations, loop):
    cfg = TrainConfig(rank=4, epochs=1, batch_size=512, seed=7, eval_max_triples=0, device="cpu", training_loop=loop)
    a = train_complex(nations, cfg, progress=False)
    b = train_complex(nations, cfg, progress=False)
    np.testing.assert_array_equal(a.entity, b.entity)
    assert "mrr" not in a.metrics


def test_size_presets(nations):
    assert default_train_config(nations).rank == SIZE_PRESETS["small"]["rank"]
    assert default_train_config(nations).training_loop == "1n"
    assert default_train_config(nations, rank=3, epochs=None).rank == 3
    assert default_train_config(nations, epochs=None).epochs == SIZE_PRESETS["small"]["epochs"]


def test_defaults_are_the_default_preset_and_presets_are_overrides(nations):
    """TrainConfig() is what ``kge.build --kg umls`` (a small KG) trains with; the other presets only override."""
    from kge.train import size_class

    assert size_class(load_kg("umls").num_entities) == size_class(nations.num_entities) == "small"
    assert default_train_config(nations) == TrainConfig()
    assert PRESET_OVERRIDES["small"] == {}
    defaults = dataclasses.asdict(TrainConfig())
    for name, overrides in PRESET_OVERRIDES.items():
        assert set(overrides) <= set(defaults), name
        # an override that restates a default is a second home for that default
        assert all(defaults[k] != v for k, v in overrides.items()), name
        assert SIZE_PRESETS[name] == {**defaults, **overrides}
        assert dataclasses.asdict(TrainConfig(**overrides)) == SIZE_PRESETS[name]
    # Lacroix et al.'s recipe, the 1n loop: what the old TrainConfig defaults (slcwa, adam, lr 0.01) were not
    t = TrainConfig()
    assert (t.training_loop, t.optimizer, t.lr, t.init_std, t.regularizer_weight) == ("1n", "adagrad", 0.1, 1e-3, 5e-2)


# (field, value, the check's words): TrainConfig(field=value) says "field WORDS", kge.build --field value "--field WORDS"
SAME_CHECK = [
    ("rank", "0", 0, "must be >= 1, got 0"),
    ("epochs", "0", 0, "must be >= 1, got 0"),
    ("batch_size", "-3", -3, "must be >= 1, got -3"),
    ("num_negatives", "0", 0, "must be >= 1, got 0"),
    ("candidates", "0", 0, "must be >= 1, got 0"),
    ("lr", "0", 0.0, "must be in (0, 10], got 0.0"),
    ("lr", "11", 11.0, "must be in (0, 10], got 11.0"),
    ("lr", "nan", float("nan"), "must be in (0, 10], got nan"),
    ("regularizer_weight", "-0.1", -0.1, "must be a finite number >= 0, got -0.1"),
    ("regularizer_weight", "inf", float("inf"), "must be a finite number >= 0, got inf"),
    ("train_minutes", "0", 0.0, "must be a finite number > 0, got 0.0"),
    ("eval_max_triples", "-1", -1, "must be >= 0, got -1"),
    ("seed", "-1", -1, "must be in [0, 4294967295], got -1"),
    # (--optimizer sgd on the command line names the closest known ones first: kge.train.check_optimizer)
]


@pytest.mark.parametrize("field,text,value,words", SAME_CHECK, ids=[f"{c[0]}={c[1]}" for c in SAME_CHECK])
def test_one_check_for_python_keywords_and_build_flags(field, text, value, words, capsys, tmp_path):
    from kge.build import BuildConfig, main

    with pytest.raises(UserError) as exc:
        TrainConfig(**{field: value})
    assert str(exc.value) == f"{field} {words}"
    flag = "--" + field.replace("_", "-")
    assert main(["--kg", "umls", "--out", str(tmp_path / "o"), flag, text]) == 2
    assert capsys.readouterr().err == f"error: {flag} {words}\n"
    assert not (tmp_path / "o").exists()
    if field != "seed":  # a BuildConfig field itself
        with pytest.raises(UserError) as exc:
            BuildConfig(kg="umls", out=str(tmp_path / "o"), train={field: value})
        assert str(exc.value) == f"{flag} {words}"


def test_preset_resolution_names_the_flags(nations):
    """A combination that only a preset makes invalid is named in the caller's words (kge.build: its flags)."""
    from kge.train import check_train_values

    values = {**dataclasses.asdict(TrainConfig()), **PRESET_OVERRIDES["large"], "training_loop": "lcwa",
              "train_minutes": None}
    with pytest.raises(UserError, match=r"^--rank may be left to the time budget only with the 1n loop and "
                                        r"--train-minutes$"):
        check_train_values(values, name=lambda f: "--" + f.replace("_", "-"))
    with pytest.raises(UserError, match=r"^rank may be left to the time budget only with the 1n loop and "
                                        r"train_minutes$"):
        check_train_values(values)
    with pytest.raises(UserError, match="unknown training setting 'rnak'; closest known: 'rank'"):
        default_train_config(nations, rnak=3)


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(rank=0), "rank must be >= 1, got 0"),
        (dict(lr=-1.0), "lr must be in (0, 10], got -1.0"),
        (dict(lr=float("nan")), "lr must be in (0, 10], got nan"),
        (dict(lr=float("inf")), "lr must be in (0, 10], got inf"),
        (dict(seed=-1), "seed must be in [0, 4294967295], got -1"),
        (dict(training_loop="1-n"), "training_loop must be one of 1n, lcwa, slcwa, got '1-n'"),
        (dict(regularizer_weight=-0.1), "regularizer_weight must be a finite number >= 0, got -0.1"),
        (dict(rank="8"), "rank must be a whole number, got '8'"),
        (dict(lr="0.1"), "lr must be a number, got '0.1'"),
        (dict(init_std=0.0), "init_std must be a finite number > 0, got 0.0"),
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
