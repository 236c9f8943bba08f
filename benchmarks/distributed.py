"""Sharded execution (engine.exec.sharded) against one process: identity, memory per rank, bytes per hop, throughput.

Commands as run for benchmarks/results/distributed.md::

    python -m kge.shard --artifact /tmp/fb-eager --shards 2 --out /tmp/fb-shards2     # and 3
    # one process (T threads): answers with explanations, top 10, of the first 72 queries per structure
    OMP_NUM_THREADS=2 python benchmarks/distributed.py run --artifact /tmp/fb-eager \\
        --queries /tmp/fbq.jsonl --per-structure 72 --threads 2 --save /tmp/dist/p1.pkl
    # P ranks (each 1 thread), the same queries, rank k writes /tmp/dist/p2.rank{k}.pkl
    torchrun --nproc-per-node 2 benchmarks/distributed.py run --artifact /tmp/fb-shards2 \\
        --queries /tmp/fbq.jsonl --per-structure 72 --threads 1 --save /tmp/dist/p2.pkl
    python benchmarks/distributed.py report /tmp/dist/p1.pkl /tmp/dist/p2.pkl /tmp/dist/p3.pkl

``run`` records per rank: the answers (explanation trees included) and the sha256 of every query's
float32 score row over all N entities, peak RSS (``ru_maxrss``) after loading and at the end, the
wall time of ``answer`` + ``scores``, and (sharded) the bytes this rank received per projection
hop and per kind of exchange.  ``report`` prints the comparison (identity per structure, memory
and throughput ratios).
"""
from __future__ import annotations

import argparse
import collections
import dataclasses
import hashlib
import json
import os
import pickle
import resource
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _queries(path: str, per_structure: int) -> list[tuple[str, str]]:
    seen: dict[str, int] = collections.Counter()
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            q = json.loads(line)
            if seen[q["structure"]] < per_structure:
                seen[q["structure"]] += 1
                out.append((q["structure"], q["expr"]))
    return out


def run(args) -> None:
    import torch

    torch.set_num_threads(args.threads)
    from engine.exec.api import Engine
    from engine.exec.sharded_load import torchrun_group

    group = torchrun_group("cpu", 600.0)
    rank = 0 if group is None else torch.distributed.get_rank()
    t0 = time.perf_counter()
    eng = Engine.load(args.artifact, process_group=group, verify=False)
    qs = _queries(args.queries, args.per_structure)
    nodes = eng.queries([e for _, e in qs])
    # rows are prepared on first use (one process: the stack's transpose; a rank: its relations' blocks):
    # prepare them before timing, as loading
    lazy = eng.artifact.is_lazy if group is None else bool(getattr(eng.executor.rows, "lazy", False))
    if lazy:  # rows are computed when a query needs them (that is part of answering)
        pass
    elif group is None:
        eng.executor.rows.full_stack()
    else:
        eng.executor.rows.prepare_all()
    load_s = time.perf_counter() - t0
    rss_loaded = _rss_mib()
    t1, c1 = time.perf_counter(), time.process_time()
    res = eng.answer(nodes, k=10, explain=True)
    t_answer, cpu_answer = time.perf_counter() - t1, time.process_time() - c1
    t2 = time.perf_counter()
    hashes, rows = [], {}
    for idx, y in eng.executor.iter_scores(nodes):
        for k, row in zip(idx, y):
            hashes.append((k, hashlib.sha256(row.contiguous().numpy().tobytes()).hexdigest()))
            if lazy:  # lazy: compared within 1e-6, not by hash
                rows[k] = row.contiguous().numpy().copy()
    t_scores = time.perf_counter() - t2
    # what engine.evaluate computes: every entity's score of every query, without explanations; a rank
    # keeps its own columns (the metrics need no gathered scores)
    ex = eng.executor
    if group is not None:  # the exchanges of answer + scores (the evaluation scores' come on top)
        hops, received, calls = [tuple(h) for h in ex.hops], dict(ex.comm.received), dict(ex.comm.calls)
    t3, c3 = time.perf_counter(), time.process_time()
    ex.scores(nodes) if group is None else ex.block_scores(nodes)
    t_eval, cpu_eval = time.perf_counter() - t3, time.process_time() - c3
    hashes.sort()
    rec = {"artifact": args.artifact, "threads": args.threads, "world": 1 if group is None else
           torch.distributed.get_world_size(), "rank": rank, "structures": [s for s, _ in qs],
           "answers": [dataclasses.replace(r, trace=None) for r in res], "score_sha": [h for _, h in hashes],
           "load_s": load_s, "answer_s": t_answer, "answer_cpu_s": cpu_answer, "scores_s": t_scores, "eval_scores_s": t_eval, "eval_scores_cpu_s": cpu_eval, "rss_loaded_mib": rss_loaded,
           "rss_peak_mib": _rss_mib(), "lazy": lazy, "score_rows": [rows[k] for k in sorted(rows)]}
    if group is not None:
        rec.update(hops=hops, received=received, calls=calls,
                   shard_mib=ex.shard.nbytes / 2**20, prepared_mib=ex.rows.nbytes / 2**20, width=ex.width)
    out = args.save if group is None else f"{os.path.splitext(args.save)[0]}.rank{rank}.pkl"
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    with open(out, "wb") as f:
        pickle.dump(rec, f)
    print(f"rank {rank}: load {load_s:.1f} s, answer {t_answer:.1f} s (CPU {cpu_answer:.1f} s), scores {t_scores:.1f} s, "
          f"evaluation scores {t_eval:.1f} s (CPU {cpu_eval:.1f} s), "
          f"peak RSS {rec['rss_peak_mib']:.0f} MiB", flush=True)
    if group is not None:
        torch.distributed.barrier()


def report(args) -> None:
    base = pickle.load(open(args.single, "rb"))
    print(f"one process: {len(base['answers'])} queries, threads {base['threads']}, load {base['load_s']:.1f} s, "
          f"answer {base['answer_s']:.1f} s, scores {base['scores_s']:.1f} s, peak RSS {base['rss_peak_mib']:.0f} MiB "
          f"(after loading {base['rss_loaded_mib']:.0f})")
    for sharded in args.sharded:
        stem = os.path.splitext(sharded)[0]
        ranks = []
        k = 0
        while os.path.exists(f"{stem}.rank{k}.pkl"):
            ranks.append(pickle.load(open(f"{stem}.rank{k}.pkl", "rb")))
            k += 1
        p = len(ranks)
        by_struct: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0])
        for i, s in enumerate(base["structures"]):
            same = all(r["answers"][i] == base["answers"][i] and r["score_sha"][i] == base["score_sha"][i]
                       for r in ranks)
            by_struct[s][0 if same else 1] += 1
        if base.get("lazy"):  # lazy rows: the same answers in the same order, scores within 1e-6
            import numpy as np

            diff = max(float(np.abs(a - b).max()) for r in ranks for a, b in zip(r["score_rows"], base["score_rows"]))
            order = sum(all([x.id for x in r["answers"][i].answers] == [x.id for x in base["answers"][i].answers]
                            for r in ranks) for i in range(len(base["answers"])))
            print(f"\nP = {p} (lazy): same answers in the same order {order} / {len(base['answers'])}, "
                  f"score rows within {diff:.2g} of one process")
        ident = sum(v[0] for v in by_struct.values())
        print(f"\nP = {p}: identical (answers, explanations, score rows on every rank) {ident} / {len(base['answers'])}: "
              + ", ".join(f"{s} {v[0]}/{sum(v)}" for s, v in by_struct.items()))
        for r in ranks:
            hops = r["hops"]
            nb = [h[0] for h in hops]
            dense = sum(1 for h in hops if h[1])
            print(f"  rank {r['rank']}: width {r['width']}, shard {r['shard_mib']:.0f} MiB "
                  f"(prepared {r.get('prepared_mib', r['shard_mib']):.0f}), peak RSS "
                  f"{r['rss_peak_mib']:.0f} MiB ({r['rss_peak_mib'] / base['rss_peak_mib']:.2f}x one process; after "
                  f"loading {r['rss_loaded_mib']:.0f}), answer {r['answer_s']:.1f} s "
                  f"({base['answer_s'] / r['answer_s']:.2f}x one process's speed), scores {r['scores_s']:.1f} s, "
                  f"hops {len(hops)} ({dense} dense), bytes received per hop: mean {sum(nb) / max(1, len(nb)) / 1024:.0f} "
                  f"KiB, max {max(nb, default=0) / 1024:.0f} KiB; by kind (MiB): "
                  + ", ".join(f"{k} {v / 2**20:.1f}" for k, v in sorted(r["received"].items())))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--artifact", required=True)
    r.add_argument("--queries", required=True)
    r.add_argument("--per-structure", type=int, default=72)
    r.add_argument("--threads", type=int, default=1)
    r.add_argument("--save", required=True)
    rp = sub.add_parser("report")
    rp.add_argument("single")
    rp.add_argument("sharded", nargs="*")
    args = p.parse_args()
    run(args) if args.cmd == "run" else report(args)


if __name__ == "__main__":
    main()
