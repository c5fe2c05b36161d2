#!/usr/bin/env bash
# Sequential writes as the standard tools make them, on libfuse's passthrough_ll and on
# Ubiquity (sync on, and paused: what syncing costs the writer), on the same disk, the
# targets interleaved, each cell the median of BENCH_RUNS runs (default 3):
#   fresh  dd bs=1M conv=fsync into a new file
#   pre    dd bs=1M conv=notrunc,fsync into a file made with fallocate -x first
#   fio    fio's defaults for a sequential write (psync, 1 MiB blocks, fallocate, end_fsync)
# Release build; root not needed. A subset of scripts/bench.sh's rows, quick (a few
# minutes), for work on the write path.
#   scripts/bench-write.sh            BENCH_RUNS=5 BENCH_MB=1024 scripts/bench-write.sh
set -euo pipefail
export LC_ALL=C
cd "$(dirname "$0")/.."
RUNS=${BENCH_RUNS:-3}
MB=${BENCH_MB:-512}
[[ $RUNS =~ ^[1-9][0-9]*$ && $MB =~ ^[1-9][0-9]*$ ]] || { echo "BENCH_RUNS and BENCH_MB must be positive numbers" >&2; exit 2; }

. scripts/bench/common.sh
release_build gcc fio util-linux

W=$(mktemp -d /var/tmp/ubiquity-bench-write.XXXXXX)
SRC=/dev/shm/ubiquity-bench-write.$$
pt_pid=
cleanup() {
  set +e
  "$UBQ" unmount "$W/ubq" >/dev/null 2>&1 || fusermount3 -u "$W/ubq" 2>/dev/null
  fusermount3 -u "$W/pt" 2>/dev/null
  [[ -n $pt_pid ]] && kill "$pt_pid" 2>/dev/null
  rm -rf "$W" "$SRC"
}
trap cleanup EXIT

gcc -O2 -Wall /usr/share/doc/libfuse3-dev/examples/passthrough_ll.c $(pkg-config fuse3 --cflags --libs) -o "$W/passthrough_ll"
mkdir "$W/pt" "$W/pt-src" "$W/ubq"
( ulimit -n "$(ulimit -Hn)"; exec "$W/passthrough_ll" -f -o source="$W/pt-src" -o auto_unmount "$W/pt" ) >"$W/pt.log" 2>&1 &
pt_pid=$!
"$UBQ" mount "$W/ubq" --store "$W/ubq-store" --backing "$W/ubq-backing" >/dev/null
for _ in $(seq 100); do mountpoint -q "$W/pt" && break; sleep 0.1; done

# Waits until Ubiquity has copied what the row before wrote to its backing directory.
settle() { settle_mount "$W/ubq"; }

RAW=$W/raw
: >"$RAW"
for run in $(seq "$RUNS"); do
  head -c "${MB}M" /dev/urandom >"$SRC"
  for target in pt ubq ubq-paused; do
    d=$W/${target%-paused}
    [[ $target == ubq-paused ]] && "$UBQ" pause "$W/ubq" >/dev/null
    for kind in fresh pre fio; do
      settle
      f=$d/$kind.$run
      [[ $kind == pre ]] && { fallocate -x -l "${MB}M" "$f"; sync; }
      start=$EPOCHREALTIME
      case $kind in
        fresh) dd if="$SRC" of="$f" bs=1M conv=fsync status=none ;;
        pre) dd if="$SRC" of="$f" bs=1M conv=notrunc,fsync status=none ;;
        fio) fio --name=seq --filename="$f" --rw=write --bs=1M --size="${MB}M" --ioengine=psync --end_fsync=1 >/dev/null ;;
      esac
      awk -v a="$start" -v b="$EPOCHREALTIME" -v m="$MB" -v t="$target" -v k="$kind" 'BEGIN { printf "%s\t%s\t%.1f\n", t, k, m / (b - a) }' >>"$RAW"
      rm -f "$f"
    done
    [[ $target == ubq-paused ]] && "$UBQ" resume "$W/ubq" >/dev/null
  done
  echo "run $run/$RUNS done" >&2
done

echo
echo "Command: BENCH_RUNS=$RUNS BENCH_MB=$MB scripts/bench-write.sh (commit $(git rev-parse --short HEAD), release build); MiB/s, median of $RUNS"
echo
echo "| write of $MB MiB | passthrough_ll | ubiquity | vs passthrough_ll | ubiquity, sync paused | vs passthrough_ll |"
echo "|---|---|---|---|---|---|"
for kind in fresh pre fio; do
  p=$(cell pt $kind) u=$(cell ubq $kind) q=$(cell ubq-paused $kind)
  awk -v k="$kind" -v p="$p" -v u="$u" -v q="$q" 'BEGIN {
    label["fresh"] = "dd bs=1M conv=fsync, new file"; label["pre"] = "dd conv=notrunc,fsync into a fallocated file"; label["fio"] = "fio, its defaults (fallocate, psync, 1 MiB, end_fsync)"
    printf "| %s | %.0f | %.0f | %.2f× | %.0f | %.2f× |\n", label[k], p, u, u / p, q, q / p }'
done
