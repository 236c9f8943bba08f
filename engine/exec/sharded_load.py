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
import contextlib
import os
from pathlib import Path
from typing import Any, Callable, ContextManager, Iterator, Sequence, cast

import numpy as np

from kge.artifact import Artifact
from kgreason.errors import UserError

from engine.exec.sharded_comm import DEFAULT_TIMEOUT_S, Comm, DistError, in_torchrun, init_from_env

__all__ = ["load_sharded", "torchrun_group", "rank_zero_output", "rank_zero_hooks", "sharded_row_options",
           "ShardVocabulary", "Comm", "DistError", "init_from_env", "in_torchrun", "DEFAULT_TIMEOUT_S"]


class ShardVocabulary(Artifact):
    """The names of a sharded KG (a shard folder's vocabulary): an :class:`~kge.artifact.Artifact`
    without matrices (each rank holds its shard instead).  ``observed`` is the artifact's observed
    triples memory-mapped and ``meta`` the artifact's meta, as the shard folder carries them for the
    LLM bridge on rank 0 (relation questions, entity linking: the prompts one process makes); only
    rank 0 reads them."""

    def __post_init__(self) -> None:  # no matrices to check
        self._entity_index = {name: i for i, name in enumerate(self.entities)}
        self._relation_index = {name: i for i, name in enumerate(self.relations)}
        self._torch_cache = {}
        self._rows_cache = {}

    @classmethod
    def of_folder(cls, folder: str | os.PathLike, meta: dict[str, Any], *, verify: bool = False) -> "ShardVocabulary":
        """``folder``'s vocabulary; ``meta``: its checked ``meta.json`` (:func:`kge.sharding.read_shard_meta`);
        ``verify``: check ``observed.npy``'s sha256 (rank 0, the one rank that reads it)."""
        from kge.sharding import read_shard_observed, read_shard_vocab

        entities, relations = read_shard_vocab(folder)
        observed = read_shard_observed(folder, meta, verify=verify)
        art_meta = meta.get("artifact_meta")
        return cls(entities=entities, relations=relations, matrices=cast(Any, None), observed=observed,
                   missing=np.zeros((0, 3), dtype=np.int64), meta=dict(art_meta) if isinstance(art_meta, dict) else {},
                   path=Path(folder))

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
    from kge.sharding import is_shard_folder, lazy_shard, load_shard, read_shard_meta, shard_matrices

    from engine.exec.sharded import ShardedExecutor

    comm = Comm(process_group, timeout_s)
    error = None
    art: Any = None
    shard = None
    try:
        if isinstance(artifact, (str, os.PathLike)) and is_shard_folder(artifact):
            shard = load_shard(artifact, comm.rank, comm.size, verify=verify)
            art = ShardVocabulary.of_folder(artifact, read_shard_meta(artifact, comm.size),
                                            verify=verify and comm.rank == 0)
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


def sharded_row_options(row_cache_gb: float | None, row_store_gb: float | None) -> dict[str, Any]:
    """The lazy-row flags of a sharded run as :func:`load_sharded`'s keywords: ``--row-cache-gb`` is each rank's row
    cache budget; ``--row-store-gb`` above 0 is refused with one line.

    Why the persisted row store is not used sharded: a rank holds only its block's columns of a row, and
    whether a row still needs its normaliser decides, identically on every rank, which rows take the
    collective exchange (:mod:`engine.exec.sharded_lazy`); per-rank stores that could hold different rows
    (one rank's file evicted, damaged or deleted) would make the ranks disagree there and wait on each other.
    """
    from kge.lazy import check_row_cache_gb, check_row_store_gb

    if row_store_gb is not None and check_row_store_gb(row_store_gb, "--row-store-gb") > 0:
        raise UserError(f"--row-store-gb {row_store_gb:g}: the persisted row store is not used in a sharded run (each "
                        "rank computes its own columns of a row and keeps them in its --row-cache-gb cache); "
                        "leave it out, or run one process")
    return {} if row_cache_gb is None else {"row_cache_gb": check_row_cache_gb(row_cache_gb, "--row-cache-gb")}


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


class RankZeroHook:
    """What a rank > 0 registers for a hook that rank 0 runs (:func:`rank_zero_hooks`): the same name, so that every
    rank's executor has the same hooks on the same nodes and takes part in the exchanges of
    :meth:`ShardedExecutor._apply_hooks <engine.exec.sharded.ShardedExecutor._apply_hooks>`, which calls hooks on
    rank 0 only.  Never called."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __call__(self, ctx: Any, value: Any) -> Any:
        raise RuntimeError(f"hook {self.name!r} runs on rank 0 only; its stand-in on another rank was called")


@contextlib.contextmanager
def rank_zero_hooks(group: Any, make: Callable[[], ContextManager[Sequence[Any]]]) -> Iterator[Sequence[Any]]:
    """``make()``'s hooks, built and entered on rank 0 only; :class:`RankZeroHook` stand-ins of the same names elsewhere.

    How ``engine.answer --llm`` runs under torchrun: only rank 0 builds the LLM client and opens its
    response cache (one set of requests, the cache written by one process, no other rank on the network),
    as only rank 0 runs the hooks.  Collective when ``group`` is given (``None``: one process, ``make()``'s
    context as it is): a :class:`~kgreason.errors.UserError` while rank 0 builds them (a bad cache path) ends
    every rank with its line, not a wait for the timeout.  The hooks' names reach the others in one broadcast.
    """
    if group is None:
        with make() as hooks:
            yield hooks
        return
    comm = Comm(group)
    if comm.rank != 0:
        comm.agree(None)
        names = comm.broadcast_object(None, "hook names")
        yield tuple(RankZeroHook(n) for n in names)
        return
    with contextlib.ExitStack() as stack:
        error = None
        try:
            hooks = stack.enter_context(make())
        except UserError as exc:
            error = str(exc)
        except BaseException:
            comm.agree("rank 0 could not build its hooks")  # the others stop with this line; the error shows here
            raise
        comm.agree(error)
        # a hook's name as Executor.add_hook takes it (its name attribute, else its function or class name)
        names = [getattr(h, "name", None) or getattr(h, "__name__", None) or type(h).__name__ for h in hooks]
        comm.broadcast_object(names, "hook names")
        yield hooks
