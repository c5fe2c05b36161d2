#!/usr/bin/env bash
# Requests while the group commit folds a burst: 2,000 small directories made and
# settled, then 12,000 files of 1 KiB created (60,000 tree changes: the fold starts
# while the burst goes on, at 50,000), and right after, listings of the 2,000
# directories round after round for 8 s, during which the rest of the burst is folded
# (it is 5 s old by then); half a second into them, another process fsyncs the burst's
# directory (as an editor does after a save), a durability barrier while the overlay
# still holds most of the burst. Prints the median, 99th percentile and longest listing (ms)
# of each run, then the median of each over BENCH_RUNS runs (default 3). With UBQ_REF=/path/to/an/older/ubiquity, that build runs too, the two
# alternated. Release build; root not needed.
#   scripts/bench-fold.sh        BENCH_RUNS=5 UBQ_REF=... scripts/bench-fold.sh
set -euo pipefail
export LC_ALL=C
cd "$(dirname "$0")/.."
RUNS=${BENCH_RUNS:-3}
[[ $RUNS =~ ^[1-9][0-9]*$ ]] || { echo "BENCH_RUNS must be a positive number" >&2; exit 2; }
. scripts/bench/common.sh
release_build gcc

W=$(mktemp -d /var/tmp/ubiquity-bench-fold.XXXXXX)
mounted=
cleanup() {
  set +e
  [[ -n $mounted ]] && { "$mounted" unmount "$W/m" >/dev/null 2>&1 || fusermount3 -u "$W/m" 2>/dev/null; }
  rm -rf "$W"
}
trap cleanup EXIT
mkdir "$W/bin"
for c in smallfiles listings; do gcc -O2 -Wall "scripts/bench/$c.c" -o "$W/bin/$c"; done

# one BINARY: a fresh mount, the directories, the burst, the listings; "median p99 max"
# goes to $W/out.
one() {
  rm -rf "$W/m" "$W/s" "$W/b" "$W/xdg"
  mkdir "$W/m"
  XDG_DATA_HOME="$W/xdg" "$1" mount "$W/m" --store "$W/s" --backing "$W/b" >/dev/null
  mounted=$1
  for i in $(seq 0 1999); do mkdir "$W/m/p$i"; echo x >"$W/m/p$i/f"; done
  sleep 3 # the directories folded: the group commit waits 0.3 s after a burst
  mkdir "$W/m/burst"
  "$W/bin/smallfiles" "$W/m/burst" 12000 create >/dev/null
  (sleep 0.5; python3 -c 'import os, sys; fd = os.open(sys.argv[1], os.O_RDONLY); os.fsync(fd)' "$W/m/burst") &
  local fsyncer=$!
  "$W/bin/listings" "$W/m" 2000 8 >"$W/out"
  wait "$fsyncer"
  # The fold may still run: unmount waits for it, and the kernel may hold the mount a
  # moment after the last listing.
  for _ in $(seq 20); do "$1" unmount "$W/m" >/dev/null 2>&1 && break; sleep 0.5; done
  mounted=
}

targets=(ubq)
[[ -n $REF ]] && targets+=(ref)
RAW=$W/raw
: >"$RAW"
for run in $(seq "$RUNS"); do
  for t in "${targets[@]}"; do
    bin=$UBQ
    [[ $t == ref ]] && bin=$REF
    one "$bin"
    read -r median p99 max _ <"$W/out"
    printf '%s\tmedian\t%s\n%s\tp99\t%s\n%s\tmax\t%s\n' "$t" "$median" "$t" "$p99" "$t" "$max" >>"$RAW"
    echo "run $run/$RUNS $t: median $median ms, p99 $p99 ms, longest $max ms" >&2
  done
done

echo
echo "Command: BENCH_RUNS=$RUNS${REF:+ UBQ_REF=$REF} scripts/bench-fold.sh (commit $(git rev-parse --short HEAD), release build); ms per listing, median of $RUNS runs"
echo
echo "| build | median | 99th percentile | longest |"
echo "|---|---|---|---|"
for t in "${targets[@]}"; do
  echo "| $([[ $t == ref ]] && echo reference || echo ubiquity) | $(cell "$t" median) | $(cell "$t" p99) | $(cell "$t" max) |"
done
