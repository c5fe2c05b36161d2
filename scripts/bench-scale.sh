#!/usr/bin/env bash
# How costs grow with the container: builds containers of N files (default 10,000 and
# 100,000) through a real mount, then measures, per size, through the mount:
#   mount time and daemon RSS after mounting; daemon CPU per one-file save; daemon CPU
#   of an idle sync cycle; `find` of the mount; `ls -la` of a 1,000-entry directory
#   under .versions/ (one file saved 1,000 times).
# and prints one table with the growth ratio largest/smallest of each row.
#
#   scripts/bench-scale.sh                 # 10000 and 100000 files (release build)
#   BENCH_SIZES="10000 1000000" scripts/bench-scale.sh
#
# Needs FUSE (root or a user allowed to mount). Everything lives under a temp directory
# that is removed at the end; every mount is unmounted.
set -euo pipefail
cd "$(dirname "$0")/.."

sizes=(${BENCH_SIZES:-10000 100000})
swift build -c release >/dev/null
bin=$(swift build -c release --show-bin-path)/ubiquity
work=$(mktemp -d /tmp/ubiquity-bench-scale.XXXXXX)
mnt=$work/mnt
cleanup() {
  fusermount3 -u "$mnt" 2>/dev/null || fusermount3 -u -z "$mnt" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

now() { date +%s.%N; }
# cpu_ticks PID: utime + stime of a process, in clock ticks.
cpu_ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }
tick=$(getconf CLK_TCK)
daemon_pid() { sed -n 1p "$1/lock"; }

declare -A result
for n in "${sizes[@]}"; do
  store=$work/store-$n
  rm -rf "$mnt"; mkdir -p "$mnt"
  "$bin" mount "$mnt" --store "$store" --backing "$work/backing-$n" >/dev/null
  echo "building $n files (100 per directory) through the mount..." >&2
  python3 - "$mnt" "$n" <<'PY'
import os, sys
root, n = sys.argv[1], int(sys.argv[2])
for i in range(n):
    d = os.path.join(root, "d%05d" % (i // 100))
    if i % 100 == 0:
        os.mkdir(d)
    with open(os.path.join(d, "f%07d.txt" % i), "w") as f:
        f.write("file %d\n" % i)
hot = os.path.join(root, "hot.txt")
for i in range(1000):
    with open(hot, "w") as f:
        f.write("version %d\n" % i)
PY
  "$bin" unmount "$mnt" >/dev/null
  t0=$(now)
  "$bin" mount "$mnt" --store "$store" --backing "$work/backing-$n" >/dev/null
  t1=$(now)
  pid=$(daemon_pid "$store")
  result[$n,mount]=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.2f", b - a }')
  sleep 3 # the first sync cycle after mounting walks the tree once
  result[$n,rss]=$(awk '/VmRSS/ { printf "%.0f", $2 / 1024 }' "/proc/$pid/status")

  # Idle: CPU over 10 one-second cycles.
  c0=$(cpu_ticks "$pid"); sleep 10; c1=$(cpu_ticks "$pid")
  idle_ms=$(awk -v a="$c0" -v b="$c1" -v t="$tick" 'BEGIN { printf "%.1f", (b - a) * 1000 / t / 10 }')
  result[$n,idle]=$idle_ms

  # 20 saves of one small file, one every 0.5 s; CPU less the idle baseline.
  c0=$(cpu_ticks "$pid")
  for i in $(seq 20); do echo "save $i" >"$mnt/d00000/f0000000.txt"; sleep 0.5; done
  c1=$(cpu_ticks "$pid")
  result[$n,save]=$(awk -v a="$c0" -v b="$c1" -v t="$tick" -v idle="$idle_ms" 'BEGIN { v = (b - a) * 1000 / t / 20 - idle / 2; printf "%.1f", v < 0 ? 0 : v }')

  t0=$(now); find "$mnt" >/dev/null; t1=$(now)
  result[$n,find]=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.2f", b - a }')
  t0=$(now); ls -la "$mnt/.versions/hot.txt" >/dev/null; t1=$(now)
  result[$n,versions]=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.2f", b - a }')
  "$bin" unmount "$mnt" >/dev/null
done

first=${sizes[0]} last=${sizes[-1]}
printf '\n| row | %s | growth %s/%s |\n|---|%s---|\n' "$(printf '%s files | ' "${sizes[@]}" | sed 's/ | $//')" "$last" "$first" "$(printf -- '---|%.0s' "${sizes[@]}")"
for row in "mount:mount time (s)" "rss:daemon RSS after mount (MiB)" "save:daemon CPU per one-file save (ms)" \
           "idle:daemon CPU per idle sync cycle (ms)" "find:find of the mount (s)" "versions:ls -la of 1,000 versions (s)"; do
  key=${row%%:*} label=${row#*:}
  line="| $label |"
  for n in "${sizes[@]}"; do line+=" ${result[$n,$key]} |"; done
  growth=$(awk -v a="${result[$first,$key]}" -v b="${result[$last,$key]}" 'BEGIN { if (a > 0) printf "%.1f×", b / a; else print "-" }')
  echo "$line $growth |"
done
