#!/usr/bin/env bash
# Files on demand (issue 24), each against a reference in the same run; release build,
# a backing directory, every mount on this machine. Rows (BENCH_ROWS picks some):
#   join     a device joins JOIN_FILES (default 100,000) small files with --download
#            on-demand: seconds from the mount until `find` lists them all, and the bytes
#            it read from the backing directory by then, per file (target: at most 300)
#   first    the first read of a 1 MiB file that is not here, against a cold read of the
#            same file on the device that has it (page cache dropped before each; the
#            median of 5 files each; target: at most 3x)
#   cold     `cat` of a 1 GiB file that is not here, against `cat` of its packs in the
#            backing directory (page cache dropped before each; median of 3; target: at
#            least 0.8x the reference's speed)
#   readers  the daemon's RSS before and at its peak while 100 readers fetch 100
#            different 4 MiB files that are not here
#
#   scripts/bench-on-demand.sh
#   BENCH_ROWS="first cold" scripts/bench-on-demand.sh
#   JOIN_FILES=1000000 BENCH_ROWS=join scripts/bench-on-demand.sh
#   JOIN_PERF=/tmp/join.perf BENCH_ROWS=join scripts/bench-on-demand.sh
#            also records the joining daemon with `perf record --call-graph dwarf`
#            into that file (read it with `perf report -i FILE`; slows the join);
#            JOIN_PERF_HZ samples per second (default 299; 49 keeps a 1,000,000-file
#            join's file under a gigabyte)
#
# Needs root (it drops the page cache) and FUSE. Everything lives under a temp directory
# that is removed at the end; every mount is unmounted.
set -euo pipefail
cd "$(dirname "$0")/.."
((EUID == 0)) || { echo "bench-on-demand: needs root (it drops the page cache between reads)" >&2; exit 1; }
files=${JOIN_FILES:-100000}
rows=" ${BENCH_ROWS:-join first cold readers} "
swift build -c release >/dev/null
bindir=$(swift build -c release --show-bin-path)
bin=$bindir/ubiquity
work=$(mktemp -d /tmp/ubiquity-bench-ondemand.XXXXXX)
mounts=()
cleanup() {
  for m in "${mounts[@]}"; do fusermount3 -u "$m" 2>/dev/null || fusermount3 -u -z "$m" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT

now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.3f", b - a }'; }
drop_caches() { sync; echo 3 >/proc/sys/vm/drop_caches; }
median() { sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
# timed COMMAND...: seconds the command took.
timed() { local t0; t0=$(now); "$@" >/dev/null; elapsed "$t0"; }
mount_at() { # mount_at MNT STORE BACKING [OPTION...]
  mkdir -p "$1"
  "$bin" mount "$1" --store "$2" --backing "$3" "${@:4}" >/dev/null
  mounts+=("$1")
}
unmount_at() { "$bin" unmount "$1" >/dev/null; }
sync_status() { getfattr --absolute-names --only-values -n user.ubiquity.sync "$1" | sed -n "s/^$2=//p"; }
wait_for() { # wait_for SECONDS COMMAND...
  local end=$(($(date +%s) + $1))
  shift
  until "$@" 2>/dev/null; do
    (($(date +%s) < end)) || { echo "bench-on-demand: timed out waiting for: $*" >&2; exit 1; }
    sleep 0.05
  done
}
daemon_pid() { sed -n 1p "$1/lock"; }
rss_kib() { awk '/VmRSS/ { print $2 }' "/proc/$1/status"; }
report=()

if [[ $rows == *" join "* ]]; then
  echo "join: filling a container of $files files" >&2
  "$bindir/ubiquity-bench-fill" --small "$work/join-a" "$files" 1 >/dev/null
  mount_at "$work/join-mnt-a" "$work/join-a" "$work/join-backing"
  "$bin" sync "$work/join-mnt-a" >/dev/null
  unmount_at "$work/join-mnt-a"
  last=$((files - 1))
  last_path=$(printf 'd%05d/f%07d.txt' $((last / 100)) "$last")
  all_listed() { [[ $(find "$work/join-mnt-b" -type f | wc -l) -ge $files ]]; }
  t0=$(now)
  mount_at "$work/join-mnt-b" "$work/join-b" "$work/join-backing" --download on-demand --poll 0.2
  if [[ -n ${JOIN_PERF:-} ]]; then
    perf record -q --call-graph dwarf,16384 -F "${JOIN_PERF_HZ:-299}" -p "$(daemon_pid "$work/join-b")" -o "$JOIN_PERF" 2>/dev/null &
    perf_pid=$!
  fi
  wait_for 3600 test -e "$work/join-mnt-b/$last_path"
  wait_for 600 all_listed
  join_s=$(elapsed "$t0")
  # What the joiner wrote to disk by then (its store: SQLite pages, WAL, checkpoints).
  written=$(awk '/^write_bytes/ { print $2 }' "/proc/$(daemon_pid "$work/join-b")/io")
  if [[ -n ${JOIN_PERF:-} ]]; then kill -INT "$perf_pid"; wait "$perf_pid" || true; fi
  down=$(sync_status "$work/join-mnt-b" backing-bytes-down)
  gets=$(sync_status "$work/join-mnt-b" backing-gets)
  report+=("| a device joins $files files on demand: until \`find\` lists them all | ≤ 10 s per 100,000 | ${join_s} s |")
  report+=("| bytes read from the backing directory by then | ≤ 300 B per file | $((down / files)) B per file ($down B, $gets GETs) |")
  report+=("| bytes the joining daemon wrote to its disk by then | (no target) | $((written / files)) B per file ($written B) |")
  unmount_at "$work/join-mnt-b"
  rm -rf "$work/join-a" "$work/join-b" "$work/join-backing"
fi

if [[ $rows == *" first "* || $rows == *" readers "* ]]; then
  echo "first/readers: writing 5 files of 1 MiB and 100 of 4 MiB" >&2
  mount_at "$work/mnt-a" "$work/store-a" "$work/backing"
  for i in 1 2 3 4 5; do head -c $((1 << 20)) /dev/urandom >"$work/mnt-a/one-$i.bin"; done
  mkdir -p "$work/mnt-a/readers"
  for i in $(seq 100); do head -c $((4 << 20)) /dev/urandom >"$work/mnt-a/readers/r$i.bin"; done
  "$bin" sync "$work/mnt-a" >/dev/null
  mount_at "$work/mnt-b" "$work/store-b" "$work/backing" --download on-demand --poll 0.2
  wait_for 120 test -e "$work/mnt-b/readers/r100.bin"
fi

if [[ $rows == *" first "* ]]; then
  local_times=() fetch_times=()
  for i in 1 2 3 4 5; do
    drop_caches
    local_times+=("$(timed cat "$work/mnt-a/one-$i.bin")")
    drop_caches
    fetch_times+=("$(timed cat "$work/mnt-b/one-$i.bin")")
  done
  l=$(printf '%s\n' "${local_times[@]}" | median)
  f=$(printf '%s\n' "${fetch_times[@]}" | median)
  ratio=$(awk -v a="$f" -v b="$l" 'BEGIN { printf "%.2f", a / b }')
  report+=("| first read of a 1 MiB file not here, against a cold local read ($l s) | ≤ 3× | $f s: ${ratio}× |")
fi

if [[ $rows == *" readers "* ]]; then
  pid=$(daemon_pid "$work/store-b")
  before=$(rss_kib "$pid")
  peak=$before
  for i in $(seq 100); do cat "$work/mnt-b/readers/r$i.bin" >/dev/null & done
  while [[ -n $(jobs -r) ]]; do
    r=$(rss_kib "$pid")
    ((r > peak)) && peak=$r
    sleep 0.02
  done
  wait
  report+=("| daemon RSS while 100 readers fetch different 4 MiB files | bounded | $((before / 1024)) MiB before, $((peak / 1024)) MiB at the peak |")
fi

if [[ $rows == *" cold "* ]]; then
  echo "cold: writing a 1 GiB file" >&2
  mount_at "$work/mnt-c" "$work/store-c" "$work/backing-c"
  head -c $((1 << 30)) /dev/urandom >"$work/mnt-c/big.bin"
  "$bin" sync "$work/mnt-c" >/dev/null
  unmount_at "$work/mnt-c"
  mount_at "$work/mnt-d" "$work/store-d" "$work/backing-c" --download on-demand --poll 0.2
  wait_for 120 test -e "$work/mnt-d/big.bin"
  ours=() theirs=()
  for _ in 1 2 3; do
    drop_caches
    theirs+=("$(timed bash -c "find '$work/backing-c/packs' -type f -exec cat {} + >/dev/null")")
    drop_caches
    ours+=("$(timed cat "$work/mnt-d/big.bin")")
    "$bin" evict "$work/mnt-d/big.bin" >/dev/null
  done
  o=$(printf '%s\n' "${ours[@]}" | median)
  t=$(printf '%s\n' "${theirs[@]}" | median)
  ratio=$(awk -v a="$t" -v b="$o" 'BEGIN { printf "%.2f", a / b }')
  report+=("| cold read of a 1 GiB file not here, against \`cat\` of its packs in the backing directory ($t s) | ≥ 0.8× | $o s: ${ratio}× |")
fi

echo
echo "| measure | target | measured |"
echo "|---|---|---|"
printf '%s\n' "${report[@]}"
