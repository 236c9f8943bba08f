"""CLI: PNG of an artifact's training curve (validation MRR and loss per epoch, from meta.json).

    python -m experiments.train_curve --artifact artifacts/FB15k-237 --out benchmarks/results/kge_curve_fb15k237.png

Needs the ``plots`` extra (matplotlib).  The artifact is verified as every tool
verifies it (:func:`kge.artifact.read_meta`; ``--skip-artifact-checksums``), and
``--out`` may not be inside it.  Artifacts trained with the 1n loop
record the curve under ``meta.json["train"]["curve"]``; others have none.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from kgreason.cli import ArgumentParser, Settings, add_settings_arguments, setting, settings_from_args, verify_setting
from kgreason.errors import UserError, cli_main
from kgreason.files import check_output_file, write_output

__all__ = ["training_curve_png", "TrainCurveSettings", "PlotArgs", "parse_args", "main"]


def training_curve_png(train: dict[str, Any], *, title: str = "") -> bytes:
    """PNG bytes: validation MRR (left axis) and mean training loss (right axis) per epoch.

    ``train`` is ``meta.json["train"]``; a UserError when it holds no curve.
    """
    curve = train.get("curve") if isinstance(train, dict) else None
    if not isinstance(curve, dict) or not curve.get("epoch"):
        raise UserError("this artifact records no training curve (only the 1n loop writes one)")
    ep = curve.get("epoch")
    columns = [curve.get(k) for k in ("epoch", "valid_mrr", "loss")]
    if not all(isinstance(c, list) and len(c) == len(ep) for c in columns) or not all(
            isinstance(x, (int, float)) and not isinstance(x, bool) for x in ep + curve["loss"]) or not all(
            x is None or (isinstance(x, (int, float)) and not isinstance(x, bool)) for x in curve["valid_mrr"]):
        raise UserError("meta.json: train.curve must hold lists 'epoch', 'valid_mrr' and 'loss' of numbers of one "
                        "length; rebuild the artifact")
    try:
        import matplotlib
    except ImportError:
        raise UserError("plotting needs matplotlib: pip install -e '.[plots]'") from None
    matplotlib.use("Agg")
    import io

    import matplotlib.pyplot as plt

    pts = [(e, m) for e, m in zip(ep, curve["valid_mrr"]) if m is not None]
    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    ax.plot([e for e, _ in pts], [m for _, m in pts], "o-", color="tab:blue", label="validation MRR (filtered, tail)")
    best = train.get("best_epoch")
    if best in ep and curve["valid_mrr"][ep.index(best)] is not None:
        ax.axvline(best, color="tab:blue", ls=":", lw=1)
        ax.annotate(f"best: epoch {best}, {curve['valid_mrr'][ep.index(best)]:.3f}",
                    (best, curve["valid_mrr"][ep.index(best)]), textcoords="offset points", xytext=(-10, -28),
                    ha="right", fontsize=8, color="tab:blue")
    if isinstance(train.get("mrr"), (int, float)) and not isinstance(train.get("mrr"), bool):
        ax.axhline(train["mrr"], color="tab:green", ls="--", lw=1,
                   label=f"held-out MRR, pykeen evaluator ({train['mrr']:.3f})")
    ax.set_xlabel("epoch")
    ax.set_ylabel("MRR")
    ax2 = ax.twinx()
    ax2.plot(ep, curve["loss"], "s--", color="tab:red", ms=3, label="training loss")
    ax2.set_ylabel("loss (cross-entropy + N3)")
    lines = ax.get_legend_handles_labels()
    lines2 = ax2.get_legend_handles_labels()
    ax.legend(lines[0] + lines2[0], lines[1] + lines2[1], loc="center right", fontsize=8)
    secs = curve.get("seconds") if isinstance(curve.get("seconds"), list) else []
    timed = bool(secs) and isinstance(secs[-1], (int, float)) and not isinstance(secs[-1], bool)
    sub = f"{len(ep)} epochs, {secs[-1] / 60:.1f} min" if timed else f"{len(ep)} epochs"
    ax.set_title((title + "\n" if title else "") + sub, fontsize=9)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=120)
    plt.close(fig)
    return buf.getvalue()


@dataclass(frozen=True, kw_only=True)
class TrainCurveSettings(Settings):
    """What ``python -m experiments.train_curve`` was asked to do; each field's flag is declared with it."""

    artifact: Path = setting(help="artifact folder")
    out: Path = setting(help="PNG file to write (not inside the artifact)")
    verify: bool = verify_setting()


#: The former name (before the settings rule, docs/cli.md "Settings classes").
PlotArgs = TrainCurveSettings


def _parser() -> ArgumentParser:
    p = ArgumentParser(prog="python -m experiments.train_curve", description=__doc__.split("\n\n")[0])
    add_settings_arguments(p, TrainCurveSettings)
    return p


def parse_args(argv: Sequence[str] | None = None) -> TrainCurveSettings:
    """The settings of ``argv``; ``--out`` checked as an output file outside ``--artifact``."""
    settings = settings_from_args(TrainCurveSettings, _parser().parse_args(argv))
    check_output_file(settings.out, what="--out", inputs=[("--artifact", settings.artifact)])
    return settings


@cli_main
def main(argv: Sequence[str] | None = None) -> int:
    from kge.artifact import read_meta

    args = parse_args(argv)
    meta = read_meta(args.artifact, verify=args.verify)
    tc = meta.get("train_config") if isinstance(meta.get("train_config"), dict) else {}
    train = meta.get("train") if isinstance(meta.get("train"), dict) else {}
    title = f"{Path(str(meta.get('source', args.artifact))).name}: ComplEx-N3 rank {tc.get('rank')}, {train.get('precision', '')}"
    write_output(args.out, training_curve_png(train, title=title), what="--out")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
