"""Loading a sharded run on torch.distributed: one KG's relation matrices split by tail entity across P ranks.

From Python (every rank runs the same code; see docs/distributed.md)::

    import torch.distributed as dist
    from engine import Engine
    dist.init_process_group("gloo")                      # or engine.exec.sharded_load.init_from_env()
    eng = Engine.load("artifacts/FB15k-237.shards2", process_group=dist.group.WORLD)
    res = eng.answer("(p r1 A)")                         # the same results on every rank

From the command line: ``torchrun --nproc-per-node P -m engine.answer --artifact DIR ...``
(``DIR`` a shard folder from ``python -m kge.shard``, or an artifact, eager or lazy, that every
rank then loads whole and cuts its shard from).  See :mod:`engine.exec.sharded` for how the
work is split and :mod:`engine.exec.sharded_comm` for the collectives and their timeout.
"""
from __future__ import annotations

import atexit
import os
from pathlib import Path
from typing import Any, Callable, cast

import numpy as np

from kge.artifact import Artifact
from kgreason.errors import UserError

from engine.exec.sharded_comm import DEFAULT_TIMEOUT_S, Comm, DistError, in_torchrun, init_from_env

__all__ = ["load_sharded", "torchrun_group", "rank_zero_output", "ShardVocabulary", "Comm", "DistError",
           "init_from_env", "in_torchrun", "DEFAULT_TIMEOUT_S"]


class ShardVocabulary(Artifact):
    """The names of a sharded KG (a shard folder's vocabulary): an :class:`~kge.artifact.Artifact`
    without matrices or triples (each rank holds its shard instead)."""

    def __post_init__(self) -> None:  # no matrices to check
        self._entity_index = {name: i for i, name in enumerate(self.entities)}
        self._relation_index = {name: i for i, name in enumerate(self.relations)}
        self._torch_cache = {}
        self._rows_cache = {}

    @classmethod
    def of_folder(cls, folder: str | os.PathLike) -> "ShardVocabulary":
        from kge.sharding import read_shard_vocab

        entities, relations = read_shard_vocab(folder)
        empty = np.zeros((0, 3), dtype=np.int64)
        return cls(entities=entities, relations=relations, matrices=cast(Any, None), observed=empty, missing=empty,
                   meta={}, path=Path(folder))

    def relation_rows(self, *, device: str = "cpu"):
        raise UserError(f"{self.path}: a shard folder holds one rank's entries, not the whole matrices; "
                        "load the artifact it was written from")


def load_sharded(artifact: Any, process_group: Any, *, open_artifact: Callable[..., Artifact], verify: bool = True,
                 timeout_s: float | None = None, **executor_kwargs: Any) -> tuple[Artifact, Any]:
    """``(artifact, executor)``: the KG's names and this rank's :class:`~engine.exec.sharded.ShardedExecutor`
    (what ``Engine.load(..., process_group=)`` wraps).

    ``artifact``: a shard folder (``python -m kge.shard``; this rank reads its own shard file
    only), or what ``open_artifact(artifact, verify=)`` opens (:func:`engine.exec.api.open_artifact`:
    an artifact folder, eager or lazy (:mod:`engine.exec.sharded_lazy`), an :class:`~kge.artifact.Artifact`, ``None`` for the default KG),
    from whose whole matrices every rank cuts its shard.  Collective: a problem any rank finds
    while loading (a changed or missing shard, a shard count that is not the world size) is
    raised on every rank as one :class:`~kgreason.errors.UserError` line.  ``timeout_s``: the
    group's collective timeout, for error messages (default: what :func:`init_from_env` set).
    """
    from kge.sharding import is_shard_folder, lazy_shard, load_shard, shard_matrices

    from engine.exec.sharded import ShardedExecutor

    comm = Comm(process_group, timeout_s)
    error = None
    art: Any = None
    shard = None
    try:
        if isinstance(artifact, (str, os.PathLike)) and is_shard_folder(artifact):
            shard = load_shard(artifact, comm.rank, comm.size, verify=verify)
            art = ShardVocabulary.of_folder(artifact)
        else:
            art = open_artifact(artifact, verify=verify)
            if comm.size > art.num_entities:
                raise UserError(f"{comm.size} ranks for {art.num_entities} entities: use at most one rank per entity")
            if art.is_lazy:
                m = art.matrices
                shard = lazy_shard(m.entity, m.relation, m.observed, comm.rank, comm.size, threshold=m.threshold,
                                   delta=m.delta)
            else:
                shard = shard_matrices(art.matrices, art.num_entities, comm.rank, comm.size)
    except UserError as exc:
        error = str(exc)
    comm.agree(error)
    assert shard is not None
    return art, ShardedExecutor(art, shard, comm, **executor_kwargs)


def torchrun_group(device: str = "cpu", timeout_s: float | None = None) -> Any:
    """The process group of a torchrun of several ranks (``WORLD_SIZE`` > 1), else ``None`` (one process).

    Collectives wait at most ``timeout_s`` (``--dist-timeout``); the group is destroyed at exit.
    """
    if not in_torchrun():
        return None

    group = init_from_env(timeout_s=DEFAULT_TIMEOUT_S if timeout_s is None else timeout_s, device=device)
    atexit.register(_destroy)
    return group


def _destroy() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        try:
            dist.destroy_process_group()
        except Exception:  # noqa: BLE001 (at exit after a failed collective: nothing left to tell the user)
            pass


def rank_zero_output(group: Any, out: Any) -> Any:
    """``out`` on rank 0 (or without a group); a discarding stream on the other ranks (they compute the same)."""
    if group is None:
        return out
    import torch.distributed as dist

    return out if dist.get_rank(group) == 0 else open(os.devnull, "w", encoding="utf-8")  # noqa: SIM115
