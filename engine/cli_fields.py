"""The settings fields that several of the engine's CLIs share (``engine.answer``, ``engine.evaluate``), each
declared once with its flag, default, range and help (:func:`kgreason.cli.setting`).

Each function returns a fresh dataclass field::

    @dataclass(frozen=True, kw_only=True)
    class EvaluateSettings(Settings):
        tnorm: str = tnorm_setting()
        neg_scale: float = neg_scale_setting()

The constants behind them live with the code that uses them (``ops.fuzzy.TNORMS``, ``kge.lazy``'s budgets);
they are read only when the flags are built or checked, so that importing a CLI module loads no torch.
"""
from __future__ import annotations

from typing import Any

from kgreason.cli import check_device, setting
from kgreason.constants import QTO_NEG_SCALE

__all__ = ["tnorm_setting", "neg_scale_setting", "device_setting", "frontier_k_setting", "row_cache_gb_setting",
           "row_store_gb_setting"]


def _tnorms() -> tuple[str, ...]:
    from ops.fuzzy import TNORMS  # loads torch

    return tuple(TNORMS)


def _row_cache_gb(value: float, flag: str) -> None:
    from kge.lazy import check_row_cache_gb

    check_row_cache_gb(value, flag)


def _row_store_gb(value: float, flag: str) -> None:
    from kge.lazy import check_row_store_gb

    check_row_store_gb(value, flag)


def tnorm_setting(help: str = "intersection t-norm (unions use its dual t-conorm)") -> Any:
    return setting("product", choices=_tnorms, help=help)


def neg_scale_setting() -> Any:
    return setting(QTO_NEG_SCALE, low=0.0, low_open=True, metavar="S", help="s in QTO's negation 1-min(1, s*M)")


def device_setting() -> Any:
    return setting("cpu", check=check_device, metavar="DEV", help="torch device: cpu, cuda or cuda:N")


def frontier_k_setting() -> Any:
    return setting(None, low=1, integer=True, metavar="K", shown_default="all, exact",
                   help="keep the K best entities of every projection's input (as CQD-beam)")


def row_cache_gb_setting() -> Any:
    return setting(None, check=_row_cache_gb, metavar="G", shown_default="as built",
                   help="lazy artifacts: calibrated-row cache budget in GiB")


def _row_store_default() -> str:
    from kge.lazy import DEFAULT_ROW_STORE_GB

    return f"{DEFAULT_ROW_STORE_GB:g}; 0: off"


def row_store_gb_setting() -> Any:
    return setting(None, check=_row_store_gb, metavar="G", shown_default=_row_store_default,
                   help="lazy artifacts: disk budget of the rows persisted for later runs, in GiB under "
                        "$KGREASON_HOME/rows")
