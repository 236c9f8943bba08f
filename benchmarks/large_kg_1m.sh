#!/usr/bin/env bash
# Issue 30's million-entity run: a 1,000,000-entity, 1,000-relation (2,000 with inverses), 10,000,000-edge synthetic
# KG (experiments.synthetic_kg) end to end with the project's defaults: generate, build (only --drop-edges 0.1 given,
# so that queries have hard answers: the defaults choose rank, batch, training budget and matrix mode), sample
# queries of all 14 structures, answer them one by one (exact, and with --frontier-k 32), load timed apart, in one
# process and at P = 2 (torchrun, from a 2-shard folder; the answers compared with one process's).
# Every step runs under /usr/bin/time -v (wall time, peak RSS).  Results: benchmarks/results/large_kg_1m.md.
#   usage: bash benchmarks/large_kg_1m.sh [--overwrite] [OUT_DIR]   (default /tmp/kgreason-1m; ~35 minutes on 2 cores)
#   smaller: ENTITIES=20000 RELATIONS=100 EDGES=200000 TRAIN_MINUTES=1 PER_STRUCTURE=2 bash benchmarks/large_kg_1m.sh /tmp/s
# OUT_DIR must be new or empty, or hold an earlier run of this script (its .kgreason-large-kg-1m marker), which is
# replaced only with --overwrite (the rules of benchmarks/large_kg.sh).
set -euo pipefail
KG_RUN_DEFAULT=/tmp/kgreason-1m
. "$(dirname "$0")/kg_run_lib.sh"
kg_run_out_dir benchmarks/large_kg_1m.sh .kgreason-large-kg-1m "$@"
cd "$(dirname "$0")/.."
PER=${PER_STRUCTURE:-8}
step generate python -m experiments.synthetic_kg --entities "${ENTITIES:-1000000}" --relations "${RELATIONS:-1000}" --edges "${EDGES:-10000000}" --seed 0 --out "$S/kg.tsv" --stats-json "$S/kg.json"
step build python -m kge.build --kg "$S/kg.tsv" --out "$S/art" --drop-edges 0.1 --overwrite ${TRAIN_MINUTES:+--train-minutes "$TRAIN_MINUTES"}
step sample python -m engine.sample --artifact "$S/art" --per-structure "${SAMPLE_PER_STRUCTURE:-8}" --seed 0 --out "$S/q.jsonl"
# one process (2 threads): exact, a query past TIMEOUT answered again with --frontier-k 32; then all with k = 32
export OMP_NUM_THREADS=2
step latency_exact python benchmarks/query_latency.py --artifact "$S/art" --queries "$S/q.jsonl" --per-structure "$PER" --timeout "${TIMEOUT:-30}" --fallback-k 32 --json "$S/latency_exact.json"
step latency_k32 python benchmarks/query_latency.py --artifact "$S/art" --queries "$S/q.jsonl" --per-structure "$PER" --frontier-k 32 --timeout 120 --json "$S/latency_k32.json"
# P = 2 (1 thread each): the same queries in the same modes from a 2-shard folder, answers compared with one process's
export OMP_NUM_THREADS=1
step shard python -m kge.shard --artifact "$S/art" --shards 2 --out "$S/art.s2" --skip-artifact-checksums
step latency_p2 torchrun --nproc-per-node 2 benchmarks/query_latency.py --artifact "$S/art.s2" --queries "$S/q.jsonl" --per-structure "$PER" --plan "$S/latency_exact.json" --compare "$S/latency_exact.json" --json "$S/latency_p2.json"
step latency_p2_k32 torchrun --nproc-per-node 2 benchmarks/query_latency.py --artifact "$S/art.s2" --queries "$S/q.jsonl" --per-structure "$PER" --frontier-k 32 --compare "$S/latency_k32.json" --json "$S/latency_p2_k32.json"
step answer python -m engine.answer --artifact "$S/art" --query 2p --top-k 3 --frontier-k 32
grep -v '^\s' "$S/build.log" | grep -v '^epoch' | tail -12 >&2
echo "artifact: $S/art  queries: $S/q.jsonl  (P = 2: see benchmarks/results/large_kg_1m.md)" >&2
