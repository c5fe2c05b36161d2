#!/usr/bin/env bash
# The metadata rows of scripts/bench.sh on their own (a few minutes, for work on the
# metadata path): 1 KiB files created, stat'ed, read and deleted (scripts/bench/smallfiles.c)
# and editor saves (temp file, write, fsync, close, rename over: scripts/bench/editorsave.c),
# on libfuse's passthrough_ll and on Ubiquity (sync on, as a user runs it), on the same
# disk, the targets interleaved, each cell the median of BENCH_RUNS runs (default 3).
# With UBQ_REF=/path/to/an/older/ubiquity, that build gets a column too (before/after).
# Release build; root not needed.
#   scripts/bench-meta.sh       BENCH_RUNS=5 BENCH_FILES=10000 BENCH_SAVES=1000 UBQ_REF=... scripts/bench-meta.sh
set -euo pipefail
export LC_ALL=C
cd "$(dirname "$0")/.."
RUNS=${BENCH_RUNS:-3}
FILES=${BENCH_FILES:-10000}
SAVES=${BENCH_SAVES:-1000}
[[ $RUNS =~ ^[1-9][0-9]*$ && $FILES =~ ^[1-9][0-9]*$ && $SAVES =~ ^[1-9][0-9]*$ ]] ||
  { echo "BENCH_RUNS, BENCH_FILES and BENCH_SAVES must be positive numbers" >&2; exit 2; }
. scripts/bench/common.sh
release_build gcc

W=$(mktemp -d /var/tmp/ubiquity-bench-meta.XXXXXX)
pt_pid=
targets=(pt ubq)
[[ -n $REF ]] && targets+=(ref)
cleanup() {
  set +e
  "$UBQ" unmount "$W/ubq" >/dev/null 2>&1 || fusermount3 -u "$W/ubq" 2>/dev/null
  [[ -n $REF ]] && { "$REF" unmount "$W/ref" >/dev/null 2>&1 || fusermount3 -u "$W/ref" 2>/dev/null; }
  fusermount3 -u "$W/pt" 2>/dev/null
  [[ -n $pt_pid ]] && kill "$pt_pid" 2>/dev/null
  rm -rf "$W"
}
trap cleanup EXIT

mkdir "$W/bin" "$W/pt" "$W/pt-src" "$W/ubq" "$W/ref"
gcc -O2 -Wall /usr/share/doc/libfuse3-dev/examples/passthrough_ll.c $(pkg-config fuse3 --cflags --libs) -o "$W/bin/passthrough_ll"
for c in smallfiles editorsave; do gcc -O2 -Wall "scripts/bench/$c.c" -o "$W/bin/$c"; done
( ulimit -n "$(ulimit -Hn)"; exec "$W/bin/passthrough_ll" -f -o source="$W/pt-src" -o auto_unmount "$W/pt" ) >"$W/pt.log" 2>&1 &
pt_pid=$!
XDG_DATA_HOME="$W/xdg" "$UBQ" mount "$W/ubq" --store "$W/ubq-store" --backing "$W/ubq-backing" >/dev/null
[[ -n $REF ]] && XDG_DATA_HOME="$W/xdg-ref" "$REF" mount "$W/ref" --store "$W/ref-store" --backing "$W/ref-backing" >/dev/null
for _ in $(seq 100); do mountpoint -q "$W/pt" && break; sleep 0.1; done

# Waits until a Ubiquity mount has copied what the run before wrote to its backing
# directory (so no upload of one run overlaps the next).
settle() { if [[ $1 == pt ]]; then sync; else settle_mount "$W/$1"; fi; }

RAW=$W/raw
: >"$RAW"
for run in $(seq "$RUNS"); do
  for t in "${targets[@]}"; do
    d=$W/$t/run$run
    mkdir "$d" "$d/small" "$d/save"
    settle "$t"
    "$W/bin/smallfiles" "$d/small" "$FILES" | awk -v t="$t" -v n="$FILES" '{ printf "%s\t%s\t%.1f\n", t, $1, n / $2 }' >>"$RAW"
    settle "$t"
    "$W/bin/editorsave" "$d/save" "$SAVES" | awk -v t="$t" -v n="$SAVES" '{ printf "%s\tsave\t%.1f\n", t, n / $2 }' >>"$RAW"
    rm -rf "$d"
  done
  echo "run $run/$RUNS done" >&2
done

echo
echo "Command: BENCH_RUNS=$RUNS BENCH_FILES=$FILES BENCH_SAVES=$SAVES${REF:+ UBQ_REF=$REF} scripts/bench-meta.sh (commit $(git rev-parse --short HEAD), release build); per second, median of $RUNS"
echo
if [[ -n $REF ]]; then
  echo "| row | passthrough_ll | ubiquity | vs passthrough_ll | reference build | vs passthrough_ll | this build vs reference |"
  echo "|---|---|---|---|---|---|---|"
else
  echo "| row | passthrough_ll | ubiquity | vs passthrough_ll |"
  echo "|---|---|---|---|"
fi
for k in create stat read delete save; do
  p=$(cell pt $k) u=$(cell ubq $k) r=$([[ -n $REF ]] && cell ref $k || echo 0)
  awk -v k="$k" -v p="$p" -v u="$u" -v r="$r" -v ref="${REF:+1}" -v f="$FILES" -v s="$SAVES" 'BEGIN {
    label["create"] = "create+write 1 KiB (" f " files)"; label["stat"] = "stat (" f " files)"; label["read"] = "read (" f " files)"
    label["delete"] = "delete (" f " files)"; label["save"] = "editor save: temp+fsync+rename (" s "x)"
    printf "| %s | %.0f | %.0f | %.2f× |", label[k], p, u, u / p
    if (ref) printf " %.0f | %.2f× | %.2f× |", r, r / p, u / r
    printf "\n" }'
done
