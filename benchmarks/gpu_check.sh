#!/usr/bin/env bash
# One command for a lent GPU machine: build the CUDA kernels, run every `cuda` test, the GPU benchmarks,
# the push/pull crossover sweep and an end-to-end evaluation on GPU beside the CPU, and write ONE report.
#
#   bash benchmarks/gpu_check.sh --out DIR [--artifact A --queries Q.jsonl] [--budget SECONDS]
#   bash benchmarks/gpu_check.sh --dry-run --out DIR [--artifact A --queries Q.jsonl]   # on a CPU machine
#   bash benchmarks/gpu_check.sh --out DIR --steps env,build,tests --budget 200           # a short lease
#
# A GPU is lent for minutes, so every step runs under its own time cap and the whole run under --budget
# (default 540 s: a device call may last 600): a step runs under the smaller of its cap and the budget left,
# one with under 10 s left is skipped and the report says so; --steps runs only the steps named, and a step that fails or times out does not stop the ones after it. The
# report (DIR/report.md) holds the machine, one row per step (seconds, status, its summary line) and the
# tables the steps wrote; DIR/gpu_check.log holds every step's full output. DIR stays small (at most 8
# files) so that a device call returns all of it.
#
# --dry-run runs the same steps on the CPU with the GPU-only parts replaced by their CPU checks (no build:
# the installed extension is imported; the cuda tests are collected, not run; the ops benchmark runs
# --quick on the CPU; the crossover sweep is collected; the end-to-end step evaluates a few queries per
# structure on the CPU). tests/test_gpu_check.py runs it, so the plumbing is tested where CI runs.
#
# Steps (cap in seconds):
#   env        (20)  nvidia-smi, python, torch, CUDA, nvcc
#   build      (240) python setup.py build_ext --inplace with FORCE_CUDA=1 for this GPU's architecture only
#                    (TORCH_CUDA_ARCH_LIST), MAX_JOBS = cores; skipped when ops._C already has the kernels
#   tests      (150) python -m pytest -m cuda tests (NCCL variants run where the GPUs they need exist; a test
#                    module whose imports are missing on the lent machine is reported, not fatal)
#   ops-bench  (75)  benchmarks/ops_cuda_bench.py: ops.project vs torch's own sparse max-product, CUDA events
#   crossover  (50)  benchmarks/test_ops_bench.py -k push_pull_crossover: the data behind the CUDA auto rule
#   e2e        (150) with --artifact and --queries: engine.evaluate on cuda and on cpu, same queries, metrics
#                    compared; a lazy artifact is also evaluated lazily on cuda, then made eager there
#                    (kge.materialize --device cuda) for the other two runs
#   sanitize   (90)  compute-sanitizer memcheck over the cuda tests of the projection and the calibration
set -u

usage() { sed -n '2,7p' "$0" | sed 's/^# \{0,1\}//'; }

OUT="" ; DRY=0 ; BUDGET=540 ; ARTIFACT="" ; QUERIES="" ; PY="${PYTHON:-python3}"
ALL_STEPS="env,build,tests,ops-bench,crossover,e2e,sanitize" ; STEPS="$ALL_STEPS"
while [ $# -gt 0 ]; do
  case "$1" in
    --out) OUT="${2:-}"; shift 2 ;;
    --dry-run) DRY=1; shift ;;
    --budget) BUDGET="${2:-}"; shift 2 ;;
    --artifact) ARTIFACT="${2:-}"; shift 2 ;;
    --queries) QUERIES="${2:-}"; shift 2 ;;
    --python) PY="${2:-}"; shift 2 ;;
    --steps) STEPS="${2:-}"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "error: gpu_check.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[ -n "$OUT" ] || { echo "error: gpu_check.sh: --out DIR is required (the report folder)" >&2; exit 2; }
case "$BUDGET" in ''|*[!0-9]*) echo "error: gpu_check.sh: --budget '$BUDGET' is not a whole number of seconds" >&2; exit 2 ;; esac
if [ -n "$ARTIFACT" ] && [ ! -f "$ARTIFACT/meta.json" ]; then
  echo "error: gpu_check.sh: --artifact $ARTIFACT: no meta.json there (not an artifact folder)" >&2; exit 2
fi
if [ -n "$QUERIES" ] && [ ! -f "$QUERIES" ]; then
  echo "error: gpu_check.sh: --queries $QUERIES: no such file" >&2; exit 2
fi
if { [ -n "$ARTIFACT" ] && [ -z "$QUERIES" ]; } || { [ -z "$ARTIFACT" ] && [ -n "$QUERIES" ]; }; then
  echo "error: gpu_check.sh: --artifact and --queries go together (the end-to-end step needs both)" >&2; exit 2
fi
for s_ in ${STEPS//,/ }; do
  case ",$ALL_STEPS," in *",$s_,"*) ;; *) echo "error: gpu_check.sh: --steps: unknown step '$s_' (choose from $ALL_STEPS)" >&2; exit 2 ;; esac
done
command -v "$PY" >/dev/null 2>&1 || { echo "error: gpu_check.sh: --python $PY: not found" >&2; exit 2; }

cd "$(dirname "$0")/.." || exit 2
ROOT="$(pwd)"
mkdir -p "$OUT" || exit 2
OUT="$(cd "$OUT" && pwd)"
LOG="$OUT/gpu_check.log" ; REPORT="$OUT/report.md" ; ROWS="$OUT/.rows"
: > "$LOG" ; : > "$ROWS"
export PYTHONUNBUFFERED=1 PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
START=$SECONDS
if [ "$DRY" = 1 ]; then DEV=cpu; else DEV=cuda; fi
WORK="$(mktemp -d "${TMPDIR:-/tmp}/gpu_check.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
# caches (the lazy row store among them) go to the scratch folder, never into the report folder
export KGREASON_HOME="$WORK/home"
touch "$WORK/start"

wants() { case ",$STEPS," in *",$1,"*) return 0 ;; *) return 1 ;; esac; }

# step NAME CAP SUMMARY_REGEX -- CMD...: run CMD under `timeout CAP`, its output appended to the log; the last
# output line matching SUMMARY_REGEX becomes the report row's summary.
step() {
  local name="$1" cap="$2" pat="$3"; shift 4
  if ! wants "$name"; then printf '%s\t-\tskipped\tnot in --steps\n' "$name" >> "$ROWS"; return 0; fi
  local left=$(( BUDGET - (SECONDS - START) ))
  [ "$left" -lt 0 ] && left=0
  if [ "$left" -lt 10 ]; then
    printf '%s\t-\tskipped\t%s s of the budget left\n' "$name" "$left" >> "$ROWS"
    echo "== $name: skipped ($left s of the budget left)" | tee -a "$LOG"; return 0
  fi
  [ "$left" -lt "$cap" ] && cap=$left
  echo "== $name: $*" | tee -a "$LOG"
  local t0=$SECONDS rc
  if declare -F "$1" >/dev/null; then  # a function of this script: timeout runs programs, so through bash
    timeout --kill-after=10 "$cap" bash -c "$*" > "$WORK/$name.out" 2>&1; rc=$?
  else
    timeout --kill-after=10 "$cap" "$@" > "$WORK/$name.out" 2>&1; rc=$?
  fi
  cat "$WORK/$name.out" >> "$LOG"
  local status="ok"
  [ "$rc" = 0 ] || status="FAILED (exit $rc)"
  { [ "$rc" = 124 ] || [ "$rc" = 137 ]; } && status="TIMED OUT after $cap s"
  local summary
  summary="$(grep -E "$pat" "$WORK/$name.out" 2>/dev/null | tail -1 | tr '\t|' '  ' | cut -c1-200)"
  printf '%s\t%s\t%s\t%s\n' "$name" "$((SECONDS - t0))" "$status" "$summary" >> "$ROWS"
  echo "== $name: $status in $((SECONDS - t0)) s" | tee -a "$LOG"
  return 0
}

has_cuda_kernels() {
  "$PY" -c "import ops, sys; sys.exit(0 if ops.has_kernel('project', 'cuda') and ops.has_kernel('calibrate_rows', 'cuda') else 1)" 2>/dev/null
}

build() {
  if has_cuda_kernels; then echo "ops._C already has the CUDA kernels: not rebuilt"; return 0; fi
  local arch
  arch="$("$PY" -c "import torch; print('%d.%d' % torch.cuda.get_device_capability())")" || return 1
  echo "building for compute capability $arch with $(nproc --all) jobs"
  FORCE_CUDA=1 TORCH_CUDA_ARCH_LIST="$arch" MAX_JOBS="$(nproc --all)" "$PY" setup.py -q build_ext --inplace || return 1
  has_cuda_kernels && echo "built: ops._C has the CUDA kernels"
}

env_info() {
  date -u '+%Y-%m-%d %H:%M UTC'
  uname -srm
  echo "cores: $(nproc --all)"
  if command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv,noheader
  else
    echo "nvidia-smi: not found"
  fi
  command -v nvcc >/dev/null 2>&1 && nvcc --version | tail -2 | head -1
  "$PY" -c "import sys, torch; print('python', sys.version.split()[0], '| torch', torch.__version__, '| CUDA', torch.version.cuda, '| GPUs', torch.cuda.device_count())"
}

e2e() {
  # runs: label artifact device; a lazy artifact is evaluated lazily on the GPU too, then made eager on the GPU
  local lim=() runs=() t0 t1 label art dev
  [ "$DRY" = 1 ] && lim=(--limit 5)
  if [ "$DRY" = 0 ] && "$PY" -c "import json, sys; sys.exit(0 if json.load(open(sys.argv[1])).get('matrices') == 'lazy' else 1)" "$ARTIFACT/meta.json"; then
    runs+=("$DEV-lazy" "$ARTIFACT" "$DEV")
    t0=$(date +%s.%N)
    # the lent machine's MemAvailable starts far below the memory it grows to, so the build's memory check
    # (which reads MemAvailable) is off; the budget only has to hold FB15k-237-sized matrices
    "$PY" -m kge.materialize --artifact "$ARTIFACT" --out "$WORK/eager" --device "$DEV" --max-matrix-gb 16 \
      --no-memory-check --quiet || return 1
    awk -v a="$t0" -v b="$(date +%s.%N)" -v d="$DEV" 'BEGIN { printf "kge.materialize on %s: %.1f s\n", d, b - a }'
    runs+=("$DEV" "$WORK/eager" "$DEV" cpu "$WORK/eager" cpu)
  elif [ "$DEV" = cpu ]; then
    runs+=(cpu "$ARTIFACT" cpu)
  else
    runs+=("$DEV" "$ARTIFACT" "$DEV" cpu "$ARTIFACT" cpu)
  fi
  local labels=()
  while [ ${#runs[@]} -gt 0 ]; do
    label="${runs[0]}" art="${runs[1]}" dev="${runs[2]}"; runs=("${runs[@]:3}"); labels+=("$label")
    t0=$(date +%s.%N)
    "$PY" -m engine.evaluate --artifact "$art" --queries "$QUERIES" --device "$dev" --no-progress \
      --skip-artifact-checksums --json "$WORK/eval-$label.json" "${lim[@]}" > "$WORK/eval-$label.txt" || return 1
    t1=$(date +%s.%N)
    echo "$t0 $t1" > "$WORK/eval-$label.time"
  done
  "$PY" benchmarks/gpu_check_e2e.py "$WORK" "${labels[@]}"
}

export -f build env_info e2e has_cuda_kernels
export PY DEV DRY ARTIFACT QUERIES WORK OUT
echo "gpu_check: out $OUT, budget $BUDGET s, device $DEV$([ "$DRY" = 1 ] && echo ', dry run')" | tee -a "$LOG"
step env 20 "torch" -- env_info
if [ "$DRY" = 1 ]; then
  step build 60 "extension" -- "$PY" -c "import ops; assert ops.has_kernel('project', 'cpu'); print('extension imported (dry run: not rebuilt)')"
  step tests 120 "collected|passed|failed|error" -- "$PY" -m pytest -q -p no:cacheprovider -m cuda --collect-only tests/test_ops_validation.py
  step ops-bench 90 "^error|[*][*]NO" -- "$PY" benchmarks/ops_cuda_bench.py --device cpu --quick --out "$OUT/ops_cuda_bench.md" --overwrite
  step crossover 60 "collected|passed|failed|error" -- "$PY" -m pytest -q -p no:cacheprovider benchmarks/test_ops_bench.py -k push_pull_crossover --collect-only
else
  step build 240 "built|already|rror" -- build
  step tests 150 "passed|failed|error" -- "$PY" -m pytest -q -p no:cacheprovider -m cuda --maxfail=20 --continue-on-collection-errors tests
  step ops-bench 75 "^error|[*][*]NO" -- "$PY" benchmarks/ops_cuda_bench.py --device cuda --out "$OUT/ops_cuda_bench.md" --overwrite
  step crossover 50 "passed|failed|error|skipped" -- env KGREASON_BENCH_DEVICE=cuda "$PY" -m pytest -q -p no:cacheprovider benchmarks/test_ops_bench.py -k push_pull_crossover
  # the sweep rewrites the committed table: copied only when this run wrote it
  [ benchmarks/results/ops_push_pull_crossover_cuda.md -nt "$WORK/start" ] && cp benchmarks/results/ops_push_pull_crossover_cuda.md "$OUT/"
fi
if [ -n "$ARTIFACT" ] || ! wants e2e; then
  step e2e 150 "ratio|identical|differ" -- e2e
else
  printf 'e2e\t-\tskipped\tno --artifact/--queries given\n' >> "$ROWS"
fi
if ! wants sanitize || { [ "$DRY" = 0 ] && command -v compute-sanitizer >/dev/null 2>&1; }; then
  # out-of-bounds accesses and races in the kernels, on the small random cases of their tests (torch's caching
  # allocator off, so an access past a tensor's end is past an allocation's end)
  # (memcheck ran ~60% of the three ops' cuda tests in 90 s on an H200: the projection's and calibration's)
  step sanitize 90 "ERROR SUMMARY|passed|failed" -- env PYTORCH_NO_CUDA_MEMORY_CACHING=1 compute-sanitizer --tool memcheck \
    --error-exitcode 3 "$PY" -m pytest -q -p no:cacheprovider -m cuda -x tests/test_ops_project_cuda.py \
    tests/test_ops_calibrate_rows.py
else
  printf 'sanitize\t-\tskipped\t%s\n' "$([ "$DRY" = 1 ] && echo 'dry run' || echo 'compute-sanitizer not found')" >> "$ROWS"
fi

{
  echo "# GPU check"
  echo
  echo "Command: \`bash benchmarks/gpu_check.sh$([ "$DRY" = 1 ] && echo ' --dry-run') --out $(basename "$OUT")$([ -n "$ARTIFACT" ] && echo " --artifact $ARTIFACT --queries $QUERIES") --budget $BUDGET$([ "$STEPS" != "$ALL_STEPS" ] && echo " --steps $STEPS")\`, $((SECONDS - START)) s in all"
  echo
  echo '```'
  cat "$WORK/env.out" 2>/dev/null
  echo '```'
  echo
  echo "| step | seconds | status | summary |"
  echo "|---|---:|---|---|"
  while IFS=$'\t' read -r n s st sm; do echo "| $n | $s | $st | $sm |"; done < "$ROWS"
  for f in "$OUT/ops_cuda_bench.md" "$OUT/ops_push_pull_crossover_cuda.md" "$WORK/e2e.out"; do
    [ -s "$f" ] || continue
    echo; echo "## $(basename "$f")"; echo
    if [ "$(basename "$f")" = e2e.out ]; then echo '```'; cat "$f"; echo '```'; else cat "$f"; fi
  done
  if grep -q "FAILED\|TIMED OUT" "$ROWS"; then
    echo; echo "## Failures (the last 40 lines of each failed step)"
    while IFS=$'\t' read -r n s st sm; do
      case "$st" in FAILED*|TIMED*) echo; echo "### $n"; echo '```'; tail -40 "$WORK/$n.out"; echo '```' ;; esac
    done < "$ROWS"
  fi
} > "$REPORT"
rm -f "$ROWS"
cat "$REPORT"
grep -q "FAILED\|TIMED OUT" "$REPORT" && exit 1
exit 0
