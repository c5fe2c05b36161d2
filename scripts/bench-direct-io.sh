#!/usr/bin/env bash
# What turning off asynchronous direct I/O (issue 22) costs: fio with libaio and O_DIRECT
# (iodepth 16) on ubiquity, on a second ubiquity binary (BASE_UBIQUITY, e.g. a build of
# the commit before) and on libfuse's passthrough_ll, all on the same disk in one run,
# interleaved, median of BENCH_RUNS (default 3). Also a buffered sequential write (fio's
# defaults), which the change must not touch. Release builds.
#   BASE_UBIQUITY=/path/to/old/ubiquity scripts/bench-direct-io.sh
set -euo pipefail
export LC_ALL=C
cd "$(dirname "$0")/.."
RUNS=${BENCH_RUNS:-3}
SIZE=${BENCH_SIZE:-256M}
swift build -c release >/dev/null
NEW=$(swift build -c release --show-bin-path)/ubiquity
BASE=${BASE_UBIQUITY:-}
. scripts/deps.sh
install_missing "${BUILD_PACKAGES[@]}" gcc fio libaio-dev >&2

W=$(mktemp -d /var/tmp/ubiquity-bench-dio.XXXXXX)
mounts=()
cleanup() {
  set +e
  for m in "${mounts[@]}"; do mountpoint -q "$m" && { fusermount3 -u "$m" || fusermount3 -u -z "$m"; }; done
  sleep 2
  rm -rf "$W"
}
trap cleanup EXIT INT TERM
gcc -O2 /usr/share/doc/libfuse3-dev/examples/passthrough_ll.c $(pkg-config fuse3 --cflags --libs) -o "$W/passthrough_ll.bin"

targets=(new)
[ -n "$BASE" ] && targets+=(base)
targets+=(passthrough_ll)
for t in "${targets[@]}"; do
  mkdir -p "$W/$t" "$W/$t-store" "$W/$t-backing" "$W/$t-src"
  case $t in
    new) "$NEW" mount "$W/$t" --store "$W/$t-store" --backing "$W/$t-backing" >/dev/null ;;
    base) "$BASE" mount "$W/$t" --store "$W/$t-store" --backing "$W/$t-backing" >/dev/null ;;
    passthrough_ll) "$W/passthrough_ll.bin" -o source="$W/$t-src" -o auto_unmount "$W/$t" & sleep 1 ;;
  esac
  mounts+=("$W/$t")
done

# job NAME ARGS...: MiB/s of one fio run (write or read bandwidth, whichever it did).
job() {
  local dir=$1; shift
  fio --name=j --directory="$dir" --output-format=terse --terse-version=3 "$@" 2>/dev/null |
    awk -F';' '{ bw = $7 + $48; printf "%.1f\n", bw / 1024 }'
  rm -f "$dir"/j.*
}
declare -A results
workloads=("aio-direct-seq-write" "aio-direct-rand-write-4k" "aio-direct-seq-read" "buffered-seq-write")
for ((r = 1; r <= RUNS; r++)); do
  for t in "${targets[@]}"; do
    d="$W/$t"
    results[$t,aio-direct-seq-write]+=" $(job "$d" --rw=write --bs=1M --size=$SIZE --direct=1 --ioengine=libaio --iodepth=16)"
    results[$t,aio-direct-rand-write-4k]+=" $(job "$d" --rw=randwrite --bs=4k --size=64M --direct=1 --ioengine=libaio --iodepth=16 --time_based --runtime=10)"
    fio --name=j --directory="$d" --rw=write --bs=1M --size=$SIZE >/dev/null 2>&1
    results[$t,aio-direct-seq-read]+=" $(job "$d" --rw=read --bs=1M --size=$SIZE --direct=1 --ioengine=libaio --iodepth=16)"
    results[$t,buffered-seq-write]+=" $(job "$d" --rw=write --bs=1M --size=$SIZE --ioengine=psync --end_fsync=1)"
  done
done
median() { tr ' ' '\n' | grep -v '^$' | sort -n | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }'; }
echo "# BENCH_RUNS=$RUNS BASE_UBIQUITY=${BASE:-none} scripts/bench-direct-io.sh ($(date -u +%F), MiB/s, median of $RUNS)"
printf '| workload |'; for t in "${targets[@]}"; do printf ' %s |' "$t"; done
[ -n "$BASE" ] && printf ' new / base |'
printf ' new / passthrough_ll |\n'
printf '|---|'; for t in "${targets[@]}"; do printf -- '---|'; done; [ -n "$BASE" ] && printf -- '---|'; printf -- '---|\n'
# passthrough_ll (libfuse's example) passes O_DIRECT on to its source file and writes from
# unaligned buffers: its direct writes fail with EINVAL, so fio reports 0 there.
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf " %.2fx |", a / b; else printf " n/a (EINVAL there) |" }'; }
for w in "${workloads[@]}"; do
  printf '| %s |' "$w"
  for t in "${targets[@]}"; do
    v=$(echo "${results[$t,$w]}" | median)
    if [ "$v" = 0.0 ]; then printf ' fails (EINVAL) |'; else printf ' %s |' "$v"; fi
  done
  new=$(echo "${results[new,$w]}" | median)
  [ -n "$BASE" ] && ratio "$new" "$(echo "${results[base,$w]}" | median)"
  ratio "$new" "$(echo "${results[passthrough_ll,$w]}" | median)"
  echo
done
