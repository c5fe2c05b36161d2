#!/usr/bin/env bash
# A mount after kill -9 in the middle of a burst: BENCH_FILES files (default 10,000) are
# made and saved, the mount settles (folded, durable), they are deleted with `rm -r`, and
# the daemon is killed at once, so the deletes wait in the operation log. Then the time of
# `ubiquity mount` (it replays the log, and returns when the mount serves), against a
# clean remount of the same store in the same run (nothing to replay), each the median of
# BENCH_RUNS runs (default 3). Release build; root not needed.
#   scripts/bench-replay.sh       BENCH_RUNS=5 BENCH_FILES=10000 scripts/bench-replay.sh
set -euo pipefail
export LC_ALL=C
cd "$(dirname "$0")/.."
RUNS=${BENCH_RUNS:-3}
FILES=${BENCH_FILES:-10000}
[[ $RUNS =~ ^[1-9][0-9]*$ && $FILES =~ ^[1-9][0-9]*$ ]] || { echo "BENCH_RUNS and BENCH_FILES must be positive numbers" >&2; exit 2; }

. scripts/bench/common.sh
release_build

W=$(mktemp -d /var/tmp/ubiquity-bench-replay.XXXXXX)
cleanup() {
  set +e
  "$UBQ" unmount "$W/m" >/dev/null 2>&1 || fusermount3 -u "$W/m" 2>/dev/null
  rm -rf "$W"
}
trap cleanup EXIT

seconds() { local t0 t1; t0=$(date +%s.%N); "$@" >/dev/null; t1=$(date +%s.%N); echo "$t1 - $t0" | bc; }
mounted() { "$UBQ" mount --store "$W/s" --backing "$W/b" "$W/m"; }

RAW=$W/raw
for run in $(seq "$RUNS"); do
  rm -rf "$W/s" "$W/b" "$W/m"
  mkdir -p "$W/m"
  mounted >/dev/null
  mkdir "$W/m/d"
  for i in $(seq "$FILES"); do printf 'file %d\n' "$i" >"$W/m/d/f$i"; done
  settle_mount "$W/m"
  sleep 11 # the periodic barrier (every 10 s) makes the saves durable
  rm -r "$W/m/d"
  pid=$(head -1 "$W/s/lock")
  kill -9 "$pid"
  while kill -0 "$pid" 2>/dev/null; do sleep 0.01; done
  fusermount3 -u "$W/m" 2>/dev/null || true
  printf 'replay\t%s\n' "$(seconds mounted)" >>"$RAW"
  changes=$(grep -o 'replayed [0-9]* tree changes' "$W/s/daemon.log" | tail -1 | grep -o '[0-9]*')
  printf 'changes\t%s\n' "${changes:-0}" >>"$RAW"
  [[ -z $(ls -A "$W/m") ]] || { echo "run $run: the deleted files came back" >&2; exit 1; }
  "$UBQ" unmount "$W/m" >/dev/null
  printf 'clean\t%s\n' "$(seconds mounted)" >>"$RAW"
  "$UBQ" unmount "$W/m" >/dev/null
done

col() { awk -F'\t' -v k="$1" '$1 == k { print $2 }' "$RAW" | median; }
replay=$(col replay) clean=$(col clean)
echo "mount after kill -9 during rm -r of $FILES files (median of $RUNS): $replay s; clean remount: $clean s; changes replayed: $(col changes)"
awk -v r="$replay" -v c="$clean" -v n="$FILES" 'BEGIN { printf "replay: %.3f s, %.2f s per 100,000 operations\n", r - c, (r - c) / n * 100000 }'
