"""The collectives a sharded run uses, over one ``torch.distributed`` process group.

Every function here is collective: all ranks call it in the same order with tensors of the
same dtype (sizes may differ where said).  A failed collective (a rank died, or did not
answer within the group's timeout) becomes one :class:`DistError` line naming this rank and
the timeout, instead of a torch traceback or a hang: gloo's collectives wait at most the
timeout the group was created with (``--dist-timeout``, :func:`init_from_env`).
"""
from __future__ import annotations

import datetime
import os
from dataclasses import dataclass, field
from typing import Any, Callable, TypeVar

import torch
import torch.distributed as dist

from kgreason.errors import UserError

__all__ = ["Comm", "DistError", "init_from_env", "in_torchrun", "DEFAULT_TIMEOUT_S"]

#: How long (seconds) a rank waits for the others at a collective before it gives up.
DEFAULT_TIMEOUT_S = 120.0
#: How long (seconds) :func:`init_from_env` waits at least for every rank to join: ranks start apart (each
#: imports torch and the engine first, seconds apart on a busy machine), so a short ``--dist-timeout`` meant
#: for the collectives would otherwise fail the rendezvous.
JOIN_TIMEOUT_S = 60.0

T = TypeVar("T")

#: The timeout :func:`init_from_env` gave the default group (what error messages name).
_GROUP_TIMEOUT_S: list[float] = []


class DistError(UserError):
    """A collective failed: another rank died, was stopped, or did not answer within the timeout."""


def in_torchrun() -> bool:
    """Whether this process is one of several ranks started by torchrun (``WORLD_SIZE`` > 1 in the environment)."""
    try:
        return int(os.environ.get("WORLD_SIZE", "1")) > 1
    except ValueError:
        return False


def _env_int(name: str) -> int:
    text = os.environ.get(name)
    try:
        return int(text)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise UserError(f"${name} is {text!r}: a sharded run needs the variables torchrun sets "
                        "(RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT)") from None


def check_timeout(seconds: float, flag: str = "--dist-timeout") -> float:
    if not (seconds > 0 and seconds < 1e7):
        raise UserError(f"{flag} must be a number of seconds > 0, got {seconds}")
    return float(seconds)


def init_from_env(*, timeout_s: float = DEFAULT_TIMEOUT_S, device: str = "cpu") -> Any:
    """The default process group from torchrun's environment (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR/PORT``).

    gloo on CPU, NCCL on CUDA (the sharded executor itself runs on CPU only for now); collectives wait at most
    ``timeout_s`` seconds, the rendezvous (every rank joining) at most ``max(timeout_s, JOIN_TIMEOUT_S)``.
    Returns the group (already initialised: the default group).
    """
    check_timeout(timeout_s)
    for name in ("RANK", "WORLD_SIZE"):
        _env_int(name)
    if dist.is_initialized():
        return dist.group.WORLD
    backend = "nccl" if str(device).startswith("cuda") else "gloo"
    join_s = max(timeout_s, JOIN_TIMEOUT_S)
    try:
        dist.init_process_group(backend=backend, init_method="env://", timeout=datetime.timedelta(seconds=join_s))
    except (RuntimeError, ValueError) as exc:
        rank = os.environ.get("RANK", "?")
        raise DistError(f"rank {rank}: could not join the process group within {join_s:g} s (the larger of "
                        f"--dist-timeout and {JOIN_TIMEOUT_S:g} s): {_first_line(exc)}") from None
    if join_s != timeout_s:  # the group's timeout is the join's until set: the collectives get --dist-timeout
        dist.distributed_c10d._set_pg_timeout(datetime.timedelta(seconds=timeout_s))
    _GROUP_TIMEOUT_S[:] = [timeout_s]
    return dist.group.WORLD


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:300] if text else type(exc).__name__


@dataclass
class Comm:
    """One rank's view of the group, with byte counters (what each rank received, per kind of exchange)."""

    group: Any
    #: the group's collective timeout, for messages (default: what :func:`init_from_env` set)
    timeout_s: float | None = None
    received: dict[str, int] = field(default_factory=dict)
    calls: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.rank = dist.get_rank(self.group)
        self.size = dist.get_world_size(self.group)
        if self.timeout_s is None and _GROUP_TIMEOUT_S:
            self.timeout_s = _GROUP_TIMEOUT_S[0]

    def _run(self, what: str, fn: Callable[[], T]) -> T:
        try:
            return fn()
        except (RuntimeError, ValueError) as exc:  # gloo: connection closed / timed out (DistError is a RuntimeError)
            limit = "the group's timeout" if self.timeout_s is None else f"{self.timeout_s:g} s"
            raise DistError(f"rank {self.rank}: {what} failed: another rank died, was stopped or did not answer "
                            f"within {limit} (--dist-timeout): {_first_line(exc)}") from None

    def _count(self, kind: str, tensors: list[torch.Tensor]) -> None:
        mine = self.rank
        nbytes = sum(t.numel() * t.element_size() for k, t in enumerate(tensors) if k != mine)
        self.received[kind] = self.received.get(kind, 0) + nbytes
        self.calls[kind] = self.calls.get(kind, 0) + 1

    def all_gather(self, t: torch.Tensor, kind: str) -> list[torch.Tensor]:
        """Every rank's ``t`` (same shape and dtype on every rank), in rank order."""
        t = t.contiguous()
        outs = [torch.empty_like(t) for _ in range(self.size)]
        self._run(f"all_gather ({kind})", lambda: dist.all_gather(outs, t, group=self.group))
        self._count(kind, outs)
        return outs

    def all_reduce_sum(self, t: torch.Tensor, kind: str) -> torch.Tensor:
        """The element-wise sum of every rank's ``t`` (same shape and dtype on every rank); ``t`` is left as it was."""
        out = t.contiguous().clone()
        self._run(f"all_reduce ({kind})", lambda: dist.all_reduce(out, op=dist.ReduceOp.SUM, group=self.group))
        # what a ring all-reduce receives: about (P-1)/P of the tensor twice (reduce-scatter, then all-gather)
        nbytes = 2 * (self.size - 1) * out.numel() * out.element_size() // max(1, self.size)
        self.received[kind] = self.received.get(kind, 0) + nbytes
        self.calls[kind] = self.calls.get(kind, 0) + 1
        return out

    def sizes(self, n: int, kind: str) -> list[int]:
        """Every rank's ``n``."""
        got = self.all_gather(torch.tensor([n], dtype=torch.int64), kind)
        return [int(g[0]) for g in got]

    def all_gather_rows(self, t: torch.Tensor, kind: str, sizes: list[int] | None = None) -> list[torch.Tensor]:
        """Every rank's ``t`` (sizes along dim 0 may differ; the rest of the shape and the dtype may not).

        ``sizes``: the ranks' ``t.shape[0]`` when already known (saves one exchange).
        """
        if sizes is None:
            sizes = self.sizes(int(t.shape[0]), kind + " sizes")
        m = max(sizes)
        pad = t.new_zeros((m,) + tuple(t.shape[1:]))
        pad[: t.shape[0]] = t
        outs = self.all_gather(pad, kind)
        return [o[:s] for o, s in zip(outs, sizes)]

    def broadcast_object(self, obj: Any, kind: str, src: int = 0) -> Any:
        """Rank ``src``'s ``obj`` (any picklable object; the others pass ``None``) on every rank."""
        box = [obj if self.rank == src else None]
        self._run(f"broadcast ({kind})", lambda: dist.broadcast_object_list(box, src=src, group=self.group))
        if self.rank != src:
            import pickle

            self.received[kind] = self.received.get(kind, 0) + len(pickle.dumps(box[0]))
        self.calls[kind] = self.calls.get(kind, 0) + 1
        return box[0]

    def agree(self, error: str | None) -> None:
        """Collective: raise on every rank the first rank's error (``None``: no error here), else return.

        How a problem one rank finds (its shard file changed) ends the run on all of them with one line.
        """
        msg = (error or "").encode("utf-8", "replace")[:1000]
        buf = torch.zeros(1024, dtype=torch.uint8)
        buf[0] = 1 if error is not None else 0
        buf[1] = len(msg) >> 8
        buf[2] = len(msg) & 0xFF
        if msg:
            buf[3:3 + len(msg)] = torch.frombuffer(bytearray(msg), dtype=torch.uint8)
        for k, got in enumerate(self.all_gather(buf, "status")):
            if int(got[0]):
                n = (int(got[1]) << 8) | int(got[2])
                text = bytes(got[3:3 + n].tolist()).decode("utf-8", "replace")
                raise UserError(text if k == self.rank else f"rank {k}: {text}")
