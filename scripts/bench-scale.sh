#!/usr/bin/env bash
# How costs grow with the container (issue 12). For each size N it builds a container
# with `ubiquity-bench-fill` (through the store API: N files in directories of 100, every
# fifth with 5 more versions, `hot.txt` with 100,000 versions, `thousand.txt` with 1,000),
# lets a first mount upload it to a backing directory, then measures through real mounts:
#   mount time; daemon RSS after mounting and after `ls -R`; daemon CPU of an idle sync
#   cycle; `ubiquity query` of every file, the daemon's RSS after it, and the idle CPU
#   with a `query --watch` and a `kv watch` connected; daemon CPU per one-file save (a small file, and hot.txt); open+read latency of
#   random files while one file is saved per second (p50/p99/max); `ubiquity status`;
#   `find` and `du` of the mount (cold kernel caches, when root), and `find` of the same
#   tree (plain files on /dev/shm) through libfuse's passthrough_ll and its high-level
#   passthrough (passthrough_ll needs a file descriptor per inode: where the open-file
#   limit is too low for the tree it reports "failed"); `ls -la` of the 1,000 entries of .versions/thousand.txt; how long a
#   second device, mounted on the same backing directory, takes to catch up (its last
#   file shows and a `ubiquity sync` of it returns), and then to show a one-file change
#   (default 1 s poll).
# Times of status, ls, find and du are the median of three runs. It prints one table
# with the growth ratio largest/smallest size of each row.
#
#   scripts/bench-scale.sh                          # 10,000 and 100,000 files
#   BENCH_SIZES="10000 1000000" scripts/bench-scale.sh
#   BENCH_HOT=1000 scripts/bench-scale.sh           # a smaller hot file (default 100000)
#
# Release build; needs FUSE (root, or a user allowed to mount) and a C compiler for
# passthrough_ll. Everything lives under a temp directory that is removed at the end;
# every mount is unmounted. Random file choices print their seed.
set -euo pipefail
cd "$(dirname "$0")/.."

sizes=(${BENCH_SIZES:-10000 100000})
hot=${BENCH_HOT:-100000}
seed=${BENCH_SEED:-$RANDOM}
echo "bench-scale: sizes ${sizes[*]}, hot file $hot versions, seed $seed" >&2
swift build -c release >/dev/null
bindir=$(swift build -c release --show-bin-path)
bin=$bindir/ubiquity
work=$(mktemp -d /tmp/ubiquity-bench-scale.XXXXXX)
mounts=()
cleanup() {
  for m in "${mounts[@]}"; do fusermount3 -u "$m" 2>/dev/null || fusermount3 -u -z "$m" 2>/dev/null || true; done
  [[ -n ${saver:-} ]] && kill "$saver" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

examples=/usr/share/doc/libfuse3-dev/examples
for reference in passthrough_ll passthrough; do
  cc -O2 -Wall -o "$work/$reference" "$examples/$reference.c" $(pkg-config --cflags --libs fuse3)
done

now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.3f", b - a }'; }
# cpu_ticks PID: utime + stime of a process, in clock ticks.
cpu_ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }
tick=$(getconf CLK_TCK)
# The daemon's CPU time in nanoseconds, all its threads (the scheduler's accounting: the
# idle rows are a millisecond a second, below what clock ticks resolve over 20 s).
cpu_ns() { cat /proc/"$1"/task/*/schedstat 2>/dev/null | awk '{ s += $1 } END { print s }'; }
# idle_cpu_ms PID: the daemon's CPU per second over 20 s of an idle mount (one sync cycle a second).
idle_cpu_ms() {
  local a b
  a=$(cpu_ns "$1"); sleep 20; b=$(cpu_ns "$1")
  awk -v a="$a" -v b="$b" 'BEGIN { printf "%.2f", (b - a) / 1e6 / 20 }'
}
rss_mib() { awk '/VmRSS/ { printf "%.0f", $2 / 1024 }' "/proc/$1/status"; }
daemon_pid() { sed -n 1p "$1/lock"; }
mount_at() { # mount_at MNT STORE BACKING
  mkdir -p "$1"
  "$bin" mount "$1" --store "$2" --backing "$3" >/dev/null
  mounts+=("$1")
}
unmount_at() { "$bin" unmount "$1" >/dev/null; }
# The kernel forgets cached names and inodes (FUSE ones too), so `find` and `du` start
# cold; needs root (otherwise they run with whatever is cached).
drop_caches() { sync; echo 2 >/proc/sys/vm/drop_caches 2>/dev/null || true; }
# median3 [--cold] COMMAND...: the median seconds of three runs (--cold: kernel caches
# dropped before each).
median3() {
  local cold=0; [[ $1 == --cold ]] && { cold=1; shift; }
  local times=() t0
  for _ in 1 2 3; do
    ((cold)) && drop_caches
    t0=$(now); "$@" >/dev/null 2>&1; times+=("$(elapsed "$t0")")
  done
  printf '%s\n' "${times[@]}" | sort -n | sed -n 2p
}
wait_for() { # wait_for SECONDS COMMAND...: polls every 0.05 s
  local limit=$1; shift
  local start; start=$(now)
  until "$@" 2>/dev/null; do
    if awk -v a="$start" -v b="$(now)" -v l="$limit" 'BEGIN { exit !(b - a > l) }'; then return 1; fi
    sleep 0.05
  done
}
# cpu_per_save PID FILE: daemon CPU (ms) per save of FILE (with the sync cycle that
# uploads it), 40 saves 0.5 s apart, less the idle baseline.
cpu_per_save() {
  local c0 c1
  c0=$(cpu_ticks "$1")
  for i in $(seq 40); do echo "save $i" >"$2"; sleep 0.5; done
  c1=$(cpu_ticks "$1")
  awk -v a="$c0" -v b="$c1" -v t="$tick" -v idle="$idle_ms" \
    'BEGIN { v = (b - a) * 1000 / t / 40 - idle / 2; printf "%.1f", v < 0 ? 0 : v }'
}
# find_through REFERENCE MOUNT SOURCE: seconds for a cold `find` of SOURCE through
# libfuse's example REFERENCE mounted at MOUNT ("failed" if it cannot serve the tree:
# passthrough_ll keeps a file descriptor per inode it has seen, and this machine allows
# no more open files than `ulimit -Hn`).
find_through() {
  local args
  case $1 in
    passthrough_ll) args=(-o source="$3" "$2") ;;
    passthrough) args=("$2" -o modules=subdir,subdir="$3") ;;
  esac
  bash -c 'ulimit -n "$(ulimit -Hn)"; exec "$@"' - "$work/$1" "${args[@]}"
  mounts+=("$2")
  if find "$2" >/dev/null 2>&1; then median3 --cold find "$2"; else echo failed; fi
  fusermount3 -u "$2"
}

declare -A result
for n in "${sizes[@]}"; do
  store=$work/store-$n backing=$work/backing-$n mnt=$work/mnt-$n
  echo "== $n files: building the container through the store API..." >&2
  t0=$(now)
  "$bindir/ubiquity-bench-fill" "$store" "$n" "$hot"
  echo "   built in $(elapsed "$t0") s; first mount uploads it..." >&2
  t0=$(now)
  mount_at "$mnt" "$store" "$backing"
  "$bin" sync "$mnt" >/dev/null
  unmount_at "$mnt"
  echo "   uploaded in $(elapsed "$t0") s" >&2

  t0=$(now)
  mount_at "$mnt" "$store" "$backing"
  result[$n,mount]=$(elapsed "$t0")
  pid=$(daemon_pid "$store")
  result[$n,rss]=$(rss_mib "$pid")

  sleep 2
  idle_ms=$(idle_cpu_ms "$pid")
  result[$n,idle]=$idle_ms
  result[$n,save]=$(cpu_per_save "$pid" "$mnt/d00000/f0000000.txt")
  result[$n,hotsave]=$(cpu_per_save "$pid" "$mnt/hot.txt")

  # Reads of random files (cold in the kernel's caches) while another file is saved
  # every second.
  ( i=0; while true; do echo "busy $i" >"$mnt/d00001/f0000100.txt"; i=$((i + 1)); sleep 1; done ) &
  saver=$!
  read -r p50 p99 max < <(python3 - "$mnt" "$n" "$seed" <<'PY'
import os, random, sys, time
root, n, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rng = random.Random(seed)
lat = []
end = time.monotonic() + 10
while time.monotonic() < end:
    i = rng.randrange(n)
    path = "%s/d%05d/f%07d.txt" % (root, i // 100, i)
    t0 = time.perf_counter()
    fd = os.open(path, os.O_RDONLY)
    os.read(fd, 4096)
    os.close(fd)
    lat.append(time.perf_counter() - t0)
lat.sort()
q = lambda p: lat[min(len(lat) - 1, int(p * len(lat)))] * 1000
print("%.2f %.2f %.1f" % (q(0.5), q(0.99), lat[-1] * 1000))
PY
)
  kill "$saver"; wait "$saver" 2>/dev/null || true; saver=
  result[$n,p50]=$p50 result[$n,p99]=$p99 result[$n,max]=$max

  sleep 2 # the saver's last upload
  result[$n,status]=$(median3 "$bin" status "$mnt")
  result[$n,versions]=$(median3 ls -la "$mnt/.versions/thousand.txt")
  result[$n,find]=$(median3 --cold find "$mnt")
  result[$n,du]=$(median3 --cold du -s "$mnt")
  ls -R "$mnt" >/dev/null
  result[$n,rssls]=$(rss_mib "$pid")

  # A live query: the whole listing (one snapshot, streamed), the daemon's memory after
  # it, and the daemon's idle CPU while a query --watch and a kv watch are connected.
  result[$n,query]=$(median3 "$bin" query --mount "$mnt" --json)
  result[$n,rssquery]=$(rss_mib "$pid")
  "$bin" query --mount "$mnt" --watch --json >"$work/watch.out" 2>&1 &
  w1=$!
  "$bin" kv watch --mount "$mnt" >/dev/null 2>&1 &
  w2=$!
  wait_for 600 grep -q '"event":"gathered"' "$work/watch.out"
  sleep 2
  result[$n,watchidle]=$(idle_cpu_ms "$pid")
  kill "$w1" "$w2"; wait "$w1" "$w2" 2>/dev/null || true

  # The same tree as plain files, through passthrough_ll (its source is on /dev/shm, so
  # the reference pays for FUSE, not for a disk).
  plain=$(mktemp -d /dev/shm/ubiquity-bench-plain.XXXXXX)
  python3 - "$plain" "$n" <<'PY'
import os, sys
root, n = sys.argv[1], int(sys.argv[2])
for i in range(n):
    d = os.path.join(root, "d%05d" % (i // 100))
    if i % 100 == 0:
        os.mkdir(d)
    with open(os.path.join(d, "f%07d.txt" % i), "w") as f:
        f.write("content %d\n" % i)
for name in ("hot.txt", "thousand.txt"):
    open(os.path.join(root, name), "w").close()
PY
  pmnt=$work/passthrough-$n; mkdir -p "$pmnt"
  result[$n,pllfind]=$(find_through passthrough_ll "$pmnt" "$plain")
  result[$n,pfind]=$(find_through passthrough "$pmnt" "$plain")
  rm -rf "$plain"

  # A second device on the same backing directory: its catch-up, then one change.
  mntb=$work/mnt-b-$n
  t0=$(now)
  mount_at "$mntb" "$work/store-b-$n" "$backing"
  last=$((n - 1))
  wait_for 7200 test -e "$mntb/$(printf 'd%05d/f%07d.txt' $((last / 100)) "$last")"
  wait_for 600 test -e "$mntb/thousand.txt"
  # The last file shows while the device still takes in the log's last segments (at
  # 1,000,000 files up to two seconds of them): caught up is when a sync cycle of its
  # own has taken in everything listed, so the next row measures one change alone.
  "$bin" sync "$mntb" >/dev/null
  result[$n,catchup]=$(elapsed "$t0")
  echo "propagated $n" >"$mnt/propagate.txt"
  t0=$(now)
  wait_for 120 grep -qx "propagated $n" "$mntb/propagate.txt"
  result[$n,propagate]=$(elapsed "$t0")
  unmount_at "$mntb"
  unmount_at "$mnt"
  rm -rf "$work/store-b-$n" "$store" "$backing"
done

rows=(mount "mount (s)" rss "RSS after mount (MiB)" rssls "RSS after ls -R (MiB)" idle "idle sync cycle CPU (ms)"
      query "ubiquity query of every file (s)" rssquery "RSS after the query (MiB)"
      watchidle "idle sync cycle CPU with two watchers connected (ms)"
      save "CPU per one-file save (ms)" hotsave "CPU per save of the 100,000-version file (ms)"
      p50 "read p50 while saving (ms)" p99 "read p99 while saving (ms)" max "read max while saving (ms)"
      status "ubiquity status (s)" versions "ls -la of 1,000 versions (s)" find "find of the mount (s)"
      pllfind "find through passthrough_ll (s)" pfind "find through passthrough (s)" du "du of the mount (s)" catchup "second device catches up (s)"
      propagate "one change reaches the second device (s)")
first=${sizes[0]} last=${sizes[-1]}
printf '| %s |' "measure"; for n in "${sizes[@]}"; do printf ' %s files |' "$n"; done; printf ' %s/%s |\n' "$last" "$first"
printf '|---|'; for _ in "${sizes[@]}"; do printf -- '---|'; done; printf -- '---|\n'
for ((i = 0; i < ${#rows[@]}; i += 2)); do
  key=${rows[i]} label=${rows[i + 1]}
  printf '| %s |' "$label"
  for n in "${sizes[@]}"; do printf ' %s |' "${result[$n,$key]}"; done
  awk -v a="${result[$first,$key]}" -v b="${result[$last,$key]}" 'BEGIN { if (a > 0) printf " %.2f |\n", b / a; else print " – |" }'
done
