#!/usr/bin/env bash
# Benchmarks Ubiquity against libfuse's passthrough_ll and a plain directory, the same
# workloads on all three in one run, and prints a table with ratios (ubiquity /
# passthrough_ll: above 1 is faster for throughput, below 1 is faster for times).
# Release build. Needs root (drops the page cache for cold reads).
#   scripts/bench.sh [--quick]      --quick: smaller sizes, for a smoke run
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
quick=0; [ "${1:-}" = "--quick" ] && quick=1
SEQ_MB=$([ $quick = 1 ] && echo 256 || echo 1024)
FILES=$([ $quick = 1 ] && echo 2000 || echo 10000)
REPO_FILES=$([ $quick = 1 ] && echo 500 || echo 3000)
SAVES=$([ $quick = 1 ] && echo 200 || echo 1000)
RAND_SECS=$([ $quick = 1 ] && echo 5 || echo 15)

W=$(mktemp -d /var/tmp/ubiquity-bench.XXXXXX)
mounts=()
pids=()
cleanup() {
  for m in "${mounts[@]}"; do fusermount3 -u "$m" 2>/dev/null || fusermount3 -u -z "$m" 2>/dev/null || true; done
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  sleep 0.5
  rm -rf "$W"
}
trap cleanup EXIT

echo "building (release) ..." >&2
swift build -c release >&2
UBQ=$(swift build -c release --show-bin-path)/ubiquity
gcc -O2 -Wall /usr/share/doc/libfuse3-dev/examples/passthrough_ll.c $(pkg-config fuse3 --cflags --libs) -o "$W/passthrough_ll"
gcc -O2 -Wall scripts/bench/smallfiles.c -o "$W/smallfiles"
gcc -O2 -Wall scripts/bench/editorsave.c -o "$W/editorsave"

wait_mount() { for _ in $(seq 100); do mountpoint -q "$1" && return 0; sleep 0.1; done; echo "mount $1 did not appear" >&2; exit 1; }

# The three targets, all on the same disk.
mkdir -p "$W/plain" "$W/pt-src" "$W/pt" "$W/ubq" "$W/ubq-store"
"$W/passthrough_ll" -f -o source="$W/pt-src" -o auto_unmount "$W/pt" & pids+=($!); mounts+=("$W/pt")
wait_mount "$W/pt"
XDG_DATA_HOME="$W/xdg" "$UBQ" mount "$W/ubq" --store "$W/ubq-store" --backing "$W/ubq-backing" >&2; mounts+=("$W/ubq")
targets=(plain pt ubq)
declare -A dir=([plain]="$W/plain" [pt]="$W/pt" [ubq]="$W/ubq")
declare -A result

drop_caches() { sync; echo 3 > /proc/sys/vm/drop_caches; }
secs() { local s e; s=$(date +%s.%N); "$@" >/dev/null; e=$(date +%s.%N); echo "$e - $s" | bc -l; }

echo "generating test data ..." >&2
head -c "${SEQ_MB}M" /dev/urandom > /dev/shm/ubiquity-bench-rand
mkdir -p "$W/repo"
( cd "$W/repo" && git init -q && for i in $(seq "$REPO_FILES"); do d=d$((i % 30)); mkdir -p "$d"; head -c $((RANDOM % 8192 + 100)) /dev/urandom | base64 > "$d/f$i.txt"; done \
  && git add -A && git -c user.email=b@b -c user.name=b commit -qm init )

for t in "${targets[@]}"; do
  d=${dir[$t]}
  echo "== $t" >&2
  s=$(secs dd if=/dev/shm/ubiquity-bench-rand of="$d/big" bs=1M conv=fsync status=none)
  result[$t,seqw]=$(echo "$SEQ_MB / $s" | bc -l)
  drop_caches
  s=$(secs dd if="$d/big" of=/dev/null bs=1M status=none)
  result[$t,seqr]=$(echo "$SEQ_MB / $s" | bc -l)
  rm -f "$d/big"
  fio --name=rw --directory="$d" --size=128M --bs=4k --ioengine=psync --rw=randwrite --runtime="$RAND_SECS" --time_based \
      --output-format=terse --terse-version=3 > "$W/fio-w.$t" 2>/dev/null
  result[$t,randw]=$(awk -F';' '{print $49}' "$W/fio-w.$t")
  fio --name=rw --directory="$d" --size=128M --bs=4k --ioengine=psync --rw=randread --runtime="$RAND_SECS" --time_based \
      --output-format=terse --terse-version=3 > "$W/fio-r.$t" 2>/dev/null
  result[$t,randr]=$(awk -F';' '{print $8}' "$W/fio-r.$t")
  rm -f "$d"/rw.*
  mkdir -p "$d/small"
  while read -r phase s; do result[$t,$phase]=$(echo "$FILES / $s" | bc -l); done < <("$W/smallfiles" "$d/small" "$FILES")
  rmdir "$d/small"
  result[$t,clone]=$(secs git clone -q --no-hardlinks "$W/repo" "$d/clone")
  rm -rf "$d/clone"
  mkdir -p "$d/ed"
  read -r _ s < <("$W/editorsave" "$d/ed" "$SAVES")
  result[$t,save]=$(echo "$SAVES / $s" | bc -l)
  rm -rf "$d/ed"
done

# One-byte edit in the middle of a 256 MiB file: new chunk bytes and the time of the
# close that commits it, against the time to hash the whole file once (sha256sum).
head -c 256M /dev/urandom > /dev/shm/ubiquity-bench-edit
cp /dev/shm/ubiquity-bench-edit "$W/ubq/edit.bin"
before=$(du -sb "$W/ubq-store/chunks" | cut -f1)
edit_secs=$(secs python3 -c "
import os
fd = os.open('$W/ubq/edit.bin', os.O_RDWR); os.pwrite(fd, b'Z', 128 << 20); os.close(fd)")
after=$(du -sb "$W/ubq-store/chunks" | cut -f1)
hash_secs=$(secs sha256sum /dev/shm/ubiquity-bench-edit)
rm -f /dev/shm/ubiquity-bench-rand /dev/shm/ubiquity-bench-edit

row() { # label key unit higher-is-better
  local p=${result[pt,$2]} u=${result[ubq,$2]} l=${result[plain,$2]} ratio
  if [ "$4" = 1 ]; then ratio=$(echo "$u / $p" | bc -l); else ratio=$(echo "$p / $u" | bc -l); fi
  printf '| %s | %s | %.1f | %.1f | %.1f | %.2f× |\n' "$1" "$3" "$l" "$p" "$u" "$ratio"
}
echo
echo "Machine: $(nproc) cores, $(free -g | awk '/Mem:/{print $2}') GiB, $(uname -r); $(date -u +%Y-%m-%d)"
echo
echo "| workload | unit | plain dir | passthrough_ll | ubiquity | ubiquity vs passthrough_ll |"
echo "|---|---|---|---|---|---|"
row "sequential write ${SEQ_MB} MiB + fsync" seqw "MiB/s" 1
row "sequential read (cold)" seqr "MiB/s" 1
row "4 KiB random write" randw "IOPS" 1
row "4 KiB random read" randr "IOPS" 1
row "create+write 1 KiB ($FILES files)" create "files/s" 1
row "stat ($FILES files)" stat "files/s" 1
row "read ($FILES files)" read "files/s" 1
row "delete ($FILES files)" delete "files/s" 1
row "git clone ($REPO_FILES files)" clone "s" 0
row "editor save: temp+fsync+rename ($SAVES×)" save "saves/s" 1
echo
printf 'One-byte edit in the middle of a 256 MiB file: %d bytes of new chunks, commit at close %.2f s (sha256 of the whole file: %.2f s)\n' \
  "$((after - before))" "$edit_secs" "$hash_secs"
echo "Ratios: for throughput ubiquity/passthrough_ll, for times passthrough_ll/ubiquity, so above 1 means ubiquity is faster."
