#!/usr/bin/env bash
# Issue 11's large-KG run: a 120,000-entity, 1,500-relation synthetic KG (experiments.synthetic_kg) end to end on a
# laptop-class CPU: generate, build with half the edges held out and the default --matrices auto (lazy here; the `huge` preset:
# sampled-candidate training, 15-minute budget), sample 2p/2i queries, answer them (frontier k = 32, and
# exactly on 50 per structure), and answer one query from the CLI.  Every step runs under /usr/bin/time -v
# (wall time, peak RSS).  Results: benchmarks/results/kge_train_large.md.
#   usage: bash benchmarks/large_kg.sh [--overwrite] [OUT_DIR]   (default /tmp/kgreason-large; ~18 minutes on 2 cores)
#   smaller: ENTITIES=5000 RELATIONS=60 EDGES=40000 TRAIN_MINUTES=1 bash benchmarks/large_kg.sh /tmp/small
# OUT_DIR must be new or empty, or hold an earlier run of this script (its .kgreason-large-kg marker), which is
# replaced only with --overwrite: the script never writes into a folder it did not make (the CLI rules, docs/cli.md).
set -euo pipefail
KG_RUN_DEFAULT=/tmp/kgreason-large
. "$(dirname "$0")/kg_run_lib.sh"
kg_run_out_dir benchmarks/large_kg.sh .kgreason-large-kg "$@"
cd "$(dirname "$0")/.."
step generate python -m experiments.synthetic_kg --entities "${ENTITIES:-120000}" --relations "${RELATIONS:-750}" --edges "${EDGES:-1500000}" --seed 0 --out "$S/syn120k.tsv" --stats-json "$S/syn120k.json"
# no --matrices: the default (auto) picks lazy here, as calibrating 1,500 x 120k rows would take days (the log says so)
step build python -m kge.build --kg "$S/syn120k.tsv" --out "$S/art" --drop-edges 0.5 --overwrite ${TRAIN_MINUTES:+--train-minutes "$TRAIN_MINUTES"}
step sample python -m engine.sample --artifact "$S/art" --structures 2p 2i --per-structure 500 --seed 0 --out "$S/q.jsonl" --no-progress
step evaluate_k32 python -m engine.evaluate --artifact "$S/art" --queries "$S/q.jsonl" --frontier-k 32 --row-cache-gb 2 --json "$S/eval_k32.json" --no-progress
step evaluate_exact50 python -m engine.evaluate --artifact "$S/art" --queries "$S/q.jsonl" --limit 50 --row-cache-gb 2 --json "$S/eval_exact50.json" --no-progress
step evaluate_k32_50 python -m engine.evaluate --artifact "$S/art" --queries "$S/q.jsonl" --limit 50 --frontier-k 32 --row-cache-gb 2 --json "$S/eval_k32_50.json" --no-progress
step answer python -m engine.answer --artifact "$S/art" --query 2p --top-k 3 --frontier-k 32
grep -v '^\s' "$S/build.log" | tail -8 >&2
grep -v '^\s' "$S/evaluate_k32.log" | head -6 >&2
