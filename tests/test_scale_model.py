"""benchmarks/scale_model.py reproduces the measured points it was fitted to (benchmarks/results/distributed.md,
large_kg_1m.md) within its stated TOLERANCE, and its predictions keep the shape the measurements show."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location("scale_model", Path(__file__).resolve().parent.parent
                                               / "benchmarks" / "scale_model.py")
assert _spec is not None and _spec.loader is not None
sm = importlib.util.module_from_spec(_spec)
sys.modules.setdefault("scale_model", sm)  # its dataclasses look their module up there
_spec.loader.exec_module(sm)


def test_every_plotted_memory_point_within_tolerance():
    """The points the plot draws (:func:`measured_points`): FB15k-237 eager at P = 1-3, the 1M lazy KG at P = 1 and 2
    (both ranks, and rank 0 after the load), the 120k lazy KG; each within TOLERANCE of the model (the lazy lines are
    fits: this checks their residuals)."""
    points = sm.measured_points()
    assert {(s, p) for s, p, _, _ in points} >= {("FB15k-237 eager", 3), ("1M lazy", 1), ("1M lazy", 2)}
    for series, p, measured, model in points:
        assert abs(model - measured) <= sm.TOLERANCE * measured, (series, p, measured, model)


def test_plot_draws_the_measured_points(tmp_path, monkeypatch):
    """The plot's memory panel draws exactly :func:`measured_points` (dots), so the test above covers all it shows."""
    pytest.importorskip("matplotlib")
    import matplotlib.axes

    drawn: list = []
    real = matplotlib.axes.Axes.plot

    def spy(self, *args, **kw):
        drawn.append((self, args))
        return real(self, *args, **kw)

    monkeypatch.setattr(matplotlib.axes.Axes, "plot", spy)
    sm.plot(str(tmp_path / "p.png"))
    memory = drawn[0][0]  # the memory panel draws first
    dots = [(x, y) for ax, (xs, ys, fmt, *_) in drawn if ax is memory and fmt == "o" for x, y in zip(xs, ys)]
    assert sorted(dots) == sorted((p, m) for _, p, m, _ in sm.measured_points())
    assert (tmp_path / "p.png").stat().st_size > 0


@pytest.mark.parametrize("p", [1, 2, 3])
def test_eager_memory_per_rank_matches_fb15k237(p):
    model = sm.eager_memory_per_rank(sm.FB["entries"], p) / sm.MIB
    for measured in sm.FB_PEAK_MIB[p]:
        assert abs(model - measured) <= sm.TOLERANCE * measured, (p, model, measured)


@pytest.mark.parametrize("p", [2, 3])
def test_bytes_per_hop_match_fb15k237(p):
    model = sm.hop_bytes(sm.FB_FRONTIER_ENTRIES, p) / 1024
    assert abs(model - sm.FB_HOP_KIB[p]) <= sm.TOLERANCE * sm.FB_HOP_KIB[p], (p, model)


@pytest.mark.parametrize("kg, measured", [("KG1M", "KG1M_PEAK_MIB"), ("KG120K", "KG120K_PEAK_MIB")])
def test_lazy_memory_matches_the_synthetic_kgs(kg, measured):
    model = sm.lazy_memory(getattr(sm, kg), sm.KG1M_RANK, row_cache_gb=sm.KG1M_ROW_CACHE_GB) / sm.MIB
    expected = getattr(sm, measured)
    assert abs(model - expected) <= sm.TOLERANCE * expected, model


def test_predictions_shape():
    """No per-rank term grows as relations x entities; more ranks: less memory, more bytes per hop."""
    for kg in (sm.WIKIKG2, sm.WIKIDATA5M):
        r8, r2 = sm.predict(kg, p=8), sm.predict(kg, p=2)
        assert r8["eager_memory_per_gpu"] < r2["eager_memory_per_gpu"]
        assert r8["lazy_memory_per_gpu"] < r2["lazy_memory_per_gpu"]
        assert r8["hop_bytes"] > r2["hop_bytes"] > 0
        assert sm.predict(kg, p=1)["hop_bytes"] == 0
    assert "Wikidata5M" in sm.table()
