"""What bit-reproducible training cost (docs/artifacts.md, "Reproducibility"): the 1n trainer's gathers.

    python benchmarks/train_gather_cost.py 1      # threads
    python benchmarks/train_gather_cost.py 2

UMLS after ``--drop-edges 0.5`` with the ``small`` preset.  ``old`` is the loss as it was (``entity[h]``
gathers, whose backward ``index_put_`` adds with parallel atomics on the CPU, so runs differ at more than
one thread), ``new`` is :func:`kge.complex_n3.batch_loss` (``index_select``).  In one process, interleaved:
per-step time (median of 6 rounds x 40 steps) and whole 20-epoch trainings (median of 3), with the hash of
each run's entity table: the new runs must share one hash, the old ones need not.
"""
from __future__ import annotations

import hashlib
import statistics
import sys
import time

import torch
import torch.nn.functional as F

import kge.complex_n3 as c
from kge.graph import drop_edges, load_kg
from kge.train import default_train_config

NEW = c.batch_loss


def old_batch_loss(entity, relation, h, r, t, *, weight, precision="fp32"):
    ce = F.cross_entropy(c.tail_scores(entity, relation, h, r, precision=precision), t)
    n3 = c.n3_penalty(entity[h], relation[r], entity[t])
    return ce + weight * n3, ce, n3


def _order(rnd: int):
    pair = [("old", old_batch_loss), ("new", NEW)]
    return pair if rnd % 2 == 0 else pair[::-1]


def per_step(n=135, nrel=92, d=128, b=256, steps=40, rounds=6) -> None:
    g = torch.Generator().manual_seed(0)
    res: dict[str, list[float]] = {"old": [], "new": []}
    for rnd in range(rounds):
        for name, fn in _order(rnd):
            c.batch_loss = fn
            ent = (torch.randn(n, 2 * d, generator=g) * 1e-3).requires_grad_()
            rel = (torch.randn(nrel, 2 * d, generator=g) * 1e-3).requires_grad_()
            opt = torch.optim.Adagrad([ent, rel], lr=0.1)
            idx = torch.stack([torch.randint(n, (b,), generator=g), torch.randint(nrel, (b,), generator=g),
                               torch.randint(n, (b,), generator=g)], 1)
            kw = dict(weight=0.05, precision="fp32", candidates=None, generator=g, optimizer_name="adagrad")
            c._train_step(ent, rel, opt, idx, **kw)  # warm-up
            t0 = time.perf_counter()
            for _ in range(steps):
                c._train_step(ent, rel, opt, idx, **kw)
            res[name].append((time.perf_counter() - t0) / steps)
    c.batch_loss = NEW
    for name, xs in res.items():
        print(f"step (N={n}, rank {d}, batch {b}), {torch.get_num_threads()} thread(s): {name} "
              f"median {statistics.median(xs) * 1e3:.2f} ms")


def whole_training(epochs=20, rounds=3) -> None:
    kg = drop_edges(load_kg("umls"), 0.5, 0)
    cfg = default_train_config(kg, seed=0, epochs=epochs, device="cpu", eval_max_triples=0)
    res: dict[str, list[tuple[float, str]]] = {"old": [], "new": []}
    for rnd in range(rounds):
        for name, fn in _order(rnd):
            c.batch_loss = fn
            t0 = time.perf_counter()
            run = c.train_1n(kg, cfg, progress=False)
            res[name].append((time.perf_counter() - t0, hashlib.sha256(run.entity.tobytes()).hexdigest()[:10]))
    c.batch_loss = NEW
    for name, xs in res.items():
        print(f"train UMLS {epochs} epochs, {torch.get_num_threads()} thread(s): {name} median "
              f"{statistics.median(x[0] for x in xs):.1f} s of {[round(x[0], 1) for x in xs]}, "
              f"hashes {[x[1] for x in xs]}")


if __name__ == "__main__":
    torch.set_num_threads(int(sys.argv[1]) if len(sys.argv) > 1 else 1)
    per_step()
    whole_training()
