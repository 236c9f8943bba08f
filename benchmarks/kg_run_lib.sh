# Shared by benchmarks/large_kg.sh and benchmarks/large_kg_1m.sh (sourced, not run): the OUT_DIR rules and the timed step.
# kg_run_out_dir SCRIPT MARKER [--overwrite] [OUT_DIR]: sets S (the absolute OUT_DIR, default $KG_RUN_DEFAULT) after
# checking that it is new or empty, or holds an earlier run of SCRIPT (its MARKER file), replaced only with --overwrite:
# a script never writes into a folder it did not make (the CLI rules, docs/cli.md).  Then creates S and the marker.
kg_run_out_dir() {
  local script=$1 marker=$2; shift 2
  local overwrite=0
  if [ "${1:-}" = "--overwrite" ]; then overwrite=1; shift; fi
  if [ $# -gt 1 ]; then echo "error: usage: bash $script [--overwrite] [OUT_DIR]" >&2; exit 2; fi
  S=$(realpath -m -- "${1:-$KG_RUN_DEFAULT}")  # before any cd: a relative OUT_DIR is the caller's
  local mark="$S/$marker"
  if [ -e "$S" ] && [ ! -d "$S" ]; then echo "error: OUT_DIR $S: is a file, not a folder" >&2; exit 2; fi
  if [ -d "$S" ] && [ -n "$(ls -A -- "$S")" ]; then
    if [ ! -f "$mark" ]; then
      echo "error: OUT_DIR $S: folder exists and was not made by this script; give a new or empty folder (nothing was touched)" >&2
      exit 2
    fi
    if [ $overwrite = 0 ]; then
      echo "error: OUT_DIR $S: holds an earlier run; pass --overwrite to replace it (nothing was touched)" >&2
      exit 2
    fi
  fi
  mkdir -p "$S"
  touch "$mark"
}
# step NAME CMD...: runs CMD under /usr/bin/time -v into $S/NAME.log; prints its wall time and peak RSS (stderr);
# on failure the log's last lines, and the script exits.
step() { local name=$1; shift; echo "== $name" >&2; local t=$(date +%s.%N); /usr/bin/time -v "$@" > "$S/$name.log" 2>&1 || { tail -5 "$S/$name.log" >&2; exit 1; }; \
  echo "   $(python3 -c "print(f'{$(date +%s.%N) - $t:.1f} s')"), peak RSS $(grep 'Maximum resident' "$S/$name.log" | awk '{printf "%.2f GiB", $6/1048576}')" >&2; }
