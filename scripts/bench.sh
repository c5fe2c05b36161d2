#!/usr/bin/env bash
# Benchmarks Ubiquity against a plain directory and libfuse's passthrough_ll example,
# without and with the kernel's writeback cache (-o writeback), all on the same disk, the
# same workloads on all of them in one run. Each cell is the median of BENCH_RUNS runs
# (default 3); the runs interleave the targets (run 1 does every target, then run 2 ...)
# so that drift of the machine (other jobs, the disk's state) falls on all of them alike.
# Prints a markdown table with ratios against both passthrough_ll columns: above 1 means
# ubiquity is faster (throughput: ubiquity/peer, times: peer/ubiquity). A fifth target,
# ubiquity on an encrypted container (`--encrypt`, its own store and backing directory),
# gets a column of its own and its ratio against the plain ubiquity (each row waits for
# the upload of the row before on both).
#
# Release build. Needs root (drops the page cache for cold reads and cold metadata).
#   scripts/bench.sh [--quick]      --quick: 1 run and smaller sizes, a smoke run of a few minutes
#   BENCH_RUNS=5 scripts/bench.sh   more runs per cell
#   BENCH_ROWS=names scripts/bench.sh   only the rows of names and small files (small files,
#                                       tar -x, du, find, rsync, git clone and status, editor saves)
set -euo pipefail
set -E # so that the ERR trap below also names a failure inside a function
export LC_ALL=C # decimal points, and sort's order, whatever the caller's locale
cd "$(dirname "$0")/.."
cmdline="scripts/bench.sh${1:+ $1}"
case "${1:-}" in
  "") quick=0 ;;
  --quick) quick=1 ;;
  *) echo "usage: scripts/bench.sh [--quick]   (BENCH_RUNS=N for N runs per cell)" >&2; exit 2 ;;
esac
[ "$(id -u)" = 0 ] || { echo "bench.sh needs root (it drops the page cache)" >&2; exit 1; }

if [ $quick = 1 ]; then
  RUNS=${BENCH_RUNS:-1}
  SEQ_MB=256        # sequential write/read, and the file of the warm random read
  PRE_MB=128        # fio's default sequential write, dd into a preallocated file
  FILES=2000        # small-file create/stat/read/delete
  TREE_FILES=2000   # tar -x, rsync, du, find
  REPO_FILES=500    # git clone
  SAVES=200         # editor saves
  RAND_SECS=5       # each fio run
else
  RUNS=${BENCH_RUNS:-3}
  SEQ_MB=1024
  PRE_MB=512
  FILES=10000
  # 18,000, not 20,000: passthrough_ll holds a descriptor per inode the kernel knows, and
  # this machine's hard limit is 20,000 descriptors (root cannot raise it here); a
  # 20,000-file tree with its 657 directories made tar -x and du fail with EMFILE there.
  TREE_FILES=18000
  REPO_FILES=3000
  SAVES=1000
  RAND_SECS=15
fi
[ -n "${BENCH_RUNS:-}" ] && cmdline="BENCH_RUNS=$BENCH_RUNS $cmdline"
ROWS=${BENCH_ROWS:-all}
case $ROWS in
  all) ;;
  names) cmdline="BENCH_ROWS=names $cmdline" ;;
  *) echo "BENCH_ROWS must be all or names" >&2; exit 2 ;;
esac
[[ $RUNS =~ ^[1-9][0-9]*$ ]] || { echo "BENCH_RUNS must be a positive number" >&2; exit 2; }

. scripts/deps.sh
. scripts/bench/common.sh
install_missing "${BUILD_PACKAGES[@]}" gcc fio git python3 rsync tar attr >&2

# ---------------------------------------------------------------------------------------
# Work directory, and a cleanup that runs on every exit (error, ^C, kill) and never
# leaves a mount or a daemon behind.

# The disk use grows over the runs even though every workload deletes what it made:
# ubiquity keeps the history of deleted files in its store, and its backing directory
# gets a copy. A rough bound (about twice what a run writes, per run), checked up front
# so that a full disk does not end the benchmark half way.
need_mb=$(( RUNS * 2 * (SEQ_MB + 2 * PRE_MB + 128 + TREE_FILES * 8 / 1024 + 100) + 2 * SEQ_MB + 1024 ))
free_mb=$(df -Pm /var/tmp | awk 'NR == 2 { print $4 }')
[ "$free_mb" -ge "$need_mb" ] || { echo "bench.sh needs about $need_mb MiB free in /var/tmp, there are $free_mb" >&2; exit 1; }

W=$(mktemp -d /var/tmp/ubiquity-bench.XXXXXX)
RAW=$W.raw.tsv            # every measured value; beside the work dir so it outlives it
SHM=/dev/shm/ubiquity-bench.$$ # sources of the copy workloads: in memory, so reading them costs no disk
mounts=()
pids=()

cleanup() {
  local status=$? m p i
  set +e
  trap - EXIT INT TERM HUP ERR
  for m in "${mounts[@]}"; do
    mountpoint -q "$m" || continue
    # A plain unmount lets the daemon finish (ubiquity commits what is pending); retry
    # a little in case a killed workload still holds a file open, then detach lazily.
    for i in 1 2 3 4 5; do fusermount3 -u "$m" 2>/dev/null && break; sleep 1; done
    if mountpoint -q "$m"; then echo "$m is busy: lazy unmount" >&2; fusermount3 -u -z "$m"; fi
  done
  # The daemons exit on unmount (ubiquity after committing): wait up to 60 s, then force.
  for p in "${pids[@]}"; do
    for i in $(seq 600); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$p" 2>/dev/null; then
      echo "process $p still running after unmount: killing it" >&2
      kill "$p" 2>/dev/null; sleep 2; kill -9 "$p" 2>/dev/null
    fi
  done
  rm -rf "$SHM".*
  # rm -rf through a live mount would be wrong, so check before removing the work dir.
  # (The mount table is read whole first: grep -q stopping early would fail the pipe.)
  local table; table=$(findmnt -rn -o TARGET)
  if grep -q "^$W/" <<< "$table"; then
    echo "mounts are left under $W: not removing it" >&2
  else
    rm -rf "$W"
  fi
  exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'exit 129' HUP

die() { echo "bench.sh: $*" >&2; exit 1; }
trap 'echo "bench.sh: line $LINENO failed: $BASH_COMMAND" >&2' ERR

# ---------------------------------------------------------------------------------------
# Build, and start the four targets: all directories on the same disk.

echo "building (release) ..." >&2
swift build -c release >&2
UBQ=$(swift build -c release --show-bin-path)/ubiquity
mkdir "$W/bin"
gcc -O2 -Wall /usr/share/doc/libfuse3-dev/examples/passthrough_ll.c $(pkg-config fuse3 --cflags --libs) -o "$W/bin/passthrough_ll"
for c in smallfiles editorsave mktree; do gcc -O2 -Wall "scripts/bench/$c.c" -o "$W/bin/$c" -lm; done

wait_mount() { # mountpoint pid log: until mounted, or fail if the daemon died
  for _ in $(seq 300); do
    mountpoint -q "$1" && return 0
    kill -0 "$2" 2>/dev/null || { tail -20 "$3" >&2; die "the daemon for $1 exited before mounting"; }
    sleep 0.1
  done
  tail -20 "$3" >&2; die "mount $1 did not appear in 30 s"
}

# passthrough_ll NAME [OPTION...]: over its own source directory $W/NAME-src, a sibling of
# the mount point (a source containing the mount point would loop).
mount_passthrough() {
  local name=$1; shift
  mkdir "$W/$name-src" "$W/$name"
  # passthrough_ll holds a descriptor for every inode the kernel knows: as many as the
  # hard limit allows (the soft one may be 1,024).
  ( ulimit -n "$(ulimit -Hn)"; exec "$W/bin/passthrough_ll" -f -o source="$W/$name-src" -o auto_unmount "$@" "$W/$name" ) >"$W/$name.log" 2>&1 &
  pids+=($!); mounts+=("$W/$name")
  wait_mount "$W/$name" $! "$W/$name.log"
}
mount_passthrough pt
mount_passthrough ptwb -o writeback

# Ubiquity in the foreground as a child of this script, so its pid is known for cleanup.
mkdir "$W/plain" "$W/ubq"
XDG_DATA_HOME="$W/xdg" "$UBQ" mount "$W/ubq" --store "$W/ubq-store" --backing "$W/ubq-backing" --foreground \
  >"$W/ubq.log" 2>&1 &
pids+=($!); mounts+=("$W/ubq")
wait_mount "$W/ubq" $! "$W/ubq.log"
# The same on an encrypted container (issue 25: every object sealed on its way to the
# backing directory; the local store as it is).
mkdir "$W/ubqenc"
printf 'bench passphrase %s\n' "$$" >"$W/passphrase"
XDG_DATA_HOME="$W/xdg" "$UBQ" mount "$W/ubqenc" --store "$W/ubqenc-store" --backing "$W/ubqenc-backing" --encrypt \
  --password-file "$W/passphrase" --foreground >"$W/ubqenc.log" 2>&1 &
pids+=($!); mounts+=("$W/ubqenc")
wait_mount "$W/ubqenc" $! "$W/ubqenc.log"

targets=(plain pt ptwb ubq ubqenc)
declare -A dir=([plain]="$W/plain" [pt]="$W/pt" [ptwb]="$W/ptwb" [ubq]="$W/ubq" [ubqenc]="$W/ubqenc")

# ---------------------------------------------------------------------------------------
# Helpers.

drop_caches() { sync; echo 3 > /proc/sys/vm/drop_caches; }
since() { awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.4f\n", b - a }'; } # seconds since $EPOCHREALTIME was $1
secs() { local s=$EPOCHREALTIME; "$@" >/dev/null; since "$s"; } # wall time of a command
div() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.6g\n", a / b; else print "nan" }'; }
record() { printf '%s\t%s\t%s\t%s\n' "$run" "$t" "$1" "$2" >> "$RAW"; } # workload value (of run $run, target $t)
fio_iops() { # fio's terse v3 output: field 8 is read IOPS, 49 write IOPS
  awk -F';' -v f="$1" '{ print $f }' "$2"
}
# Ubiquity copies new versions to its backing directory in the background. Wait until it
# has (at most 2 minutes) so that copying does not slow the next workload or target down.
ubq_settle() { settle_mount "${1:-$W/ubq}"; } # [MOUNT]: default the plain ubiquity mount

# ---------------------------------------------------------------------------------------
# Test data, made once: in /dev/shm so that reading it costs no disk and drop_caches
# does not make it cold.

# New data for every run (the same for every target of a run): ubiquity keeps what it
# stored, so the same bytes written again would be deduplicated (and read back from its
# verified-chunk cache) in the second and third runs.
make_data() {
  echo "generating test data for run $1 in $SHM.* ..." >&2
  rm -rf "$SHM.rand" "$SHM.tree" "$SHM.tar" "$SHM.repo"
  head -c "${SEQ_MB}M" /dev/urandom > "$SHM.rand"
  "$W/bin/mktree" "$SHM.tree" "$TREE_FILES" "$1" > "$W/tree.info"
  read -r _ tree_bytes tree_dirs < "$W/tree.info"
  tar -cf "$SHM.tar" -C "$SHM.tree" .
  mkdir "$SHM.repo"
  ( cd "$SHM.repo" && git init -q && for i in $(seq "$REPO_FILES"); do d=d$((i % 30)); mkdir -p "$d"; head -c $((RANDOM % 8192 + 100)) /dev/urandom | base64 > "$d/f$i.txt"; done \
    && git add -A && git -c user.email=b@b -c user.name=b commit -qm init )
}

# ---------------------------------------------------------------------------------------
# The workloads on one target. Each deletes what it made before the next starts, so the
# disk use stays bounded (ubiquity keeps deleted files' history in its store, though).

# Before each workload: a sync, so that it does not pay for the dirty pages the one before
# it left (or the previous target's); on ubiquity also the end of the background copying
# of what the workload before made, so each row pays for its own sync work only.
settle() {
  if [[ $t == ubq* ]]; then ubq_settle "${dir[$t]}"; fi
  sync
}

bench_target() {
  settle
  if [ "$ROWS" = all ]; then bench_data; fi
  bench_names
  if [[ $t == ubq* ]]; then ubq_settle "${dir[$t]}"; fi
}

# Sequential and random reads and writes of big files.
bench_data() {
  local d=${dir[$t]} s phase
  # Sequential write of SEQ_MB + fsync; then, after the write's upload (the write's own
  # sync work, not the read's) and dropping the page cache, a cold sequential read of the
  # same file.
  s=$(secs dd if="$SHM.rand" of="$d/big" bs=1M conv=fsync status=none)
  record seqw "$(div "$SEQ_MB" "$s")"
  settle
  drop_caches
  s=$(secs dd if="$d/big" of=/dev/null bs=1M status=none)
  record seqr "$(div "$SEQ_MB" "$s")"
  # 4 KiB random reads of that file, warm: the cold read has just read all of it, and it
  # fits in the page cache. --invalidate=0 keeps fio from dropping the cache first.
  fio --name=warm --filename="$d/big" --size="${SEQ_MB}M" --readonly --invalidate=0 --rw=randread --bs=4k \
      --ioengine=psync --runtime="$RAND_SECS" --time_based --output-format=terse --terse-version=3 \
      > "$W/fio.out" 2>"$W/fio.err" || { cat "$W/fio.err" >&2; die "fio (warm random read) failed on $t"; }
  record warmr "$(fio_iops 8 "$W/fio.out")"
  rm -f "$d/big"

  # Sequential writes as the standard tools do them (issue 26), PRE_MB each: fio with its
  # defaults for a sequential write (psync, 1 MiB blocks, one fsync at the end), and dd
  # into a file fallocate made first (conv=notrunc: the blocks are overwritten in place).
  settle
  fio --name=seq --filename="$d/fio.seq" --rw=write --bs=1M --size="${PRE_MB}M" --ioengine=psync --end_fsync=1 \
      --output-format=terse --terse-version=3 > "$W/fio.out" 2>"$W/fio.err" || { cat "$W/fio.err" >&2; die "fio (sequential write) failed on $t"; }
  record fioseqw "$(awk -F';' '{ printf "%.6g\n", $48 / 1024 }' "$W/fio.out")" # field 48: write bandwidth, KiB/s
  rm -f "$d/fio.seq"
  settle
  # posix_fallocate (-x): passthrough_ll has no fallocate, glibc then writes zeros there.
  fallocate -x -l "${PRE_MB}M" "$d/pre"
  sync
  s=$(secs dd if="$SHM.rand" of="$d/pre" bs=1M count="$PRE_MB" conv=notrunc,fsync status=none)
  record prew "$(div "$PRE_MB" "$s")"
  rm -f "$d/pre"

  # 4 KiB random write, then random read, of a 128 MiB file fio lays out (fio drops
  # that file's page cache before each job).
  settle
  for phase in randwrite randread; do
    fio --name=rw --directory="$d" --size=128M --bs=4k --ioengine=psync --rw=$phase --runtime="$RAND_SECS" --time_based \
        --output-format=terse --terse-version=3 > "$W/fio.out" 2>"$W/fio.err" || { cat "$W/fio.err" >&2; die "fio $phase failed on $t"; }
    if [ $phase = randwrite ]; then record randw "$(fio_iops 49 "$W/fio.out")"; else record randr "$(fio_iops 8 "$W/fio.out")"; fi
  done
  rm -f "$d"/rw.*
}

# Names and small files.
bench_names() {
  local d=${dir[$t]} s out phase n start

  # Small files: create+write, stat, read, delete of FILES files of 1 KiB in one directory.
  settle
  mkdir "$d/small"
  out=$("$W/bin/smallfiles" "$d/small" "$FILES")
  while read -r phase s; do record "$phase" "$(div "$FILES" "$s")"; done <<< "$out"
  rm -rf "$d/small"

  # A tree of TREE_FILES files: tar -x of it; then du -s and find over the extracted tree,
  # each after dropping the caches, so they measure the filesystem's metadata path and
  # not the kernel's dentry and inode caches.
  settle
  mkdir "$d/tarx"
  record tarx "$(secs tar -xf "$SHM.tar" -C "$d/tarx")"
  drop_caches
  record du "$(secs du -s "$d/tarx")"
  drop_caches
  start=$EPOCHREALTIME
  n=$(cd "$d/tarx" && find . -type f | wc -l)
  record find "$(since "$start")"
  [ "$n" = "$TREE_FILES" ] || die "find counted $n files in the tree extracted to $t, not $TREE_FILES"
  rm -rf "$d/tarx"
  # rsync -a of the same tree into a fresh directory.
  settle
  record rsync "$(secs rsync -a "$SHM.tree/" "$d/rsync/")"
  rm -rf "$d/rsync"

  settle
  record clone "$(secs git clone -q --no-hardlinks "$SHM.repo" "$d/clone")"
  # git status of the clone: an lstat of every file against git's index, cold and warm.
  drop_caches
  record gitstatus "$(secs git -C "$d/clone" status --porcelain)"
  record gitstatus2 "$(secs git -C "$d/clone" status --porcelain)"
  rm -rf "$d/clone"

  # Editor saves: temp file + fsync + rename over the target, SAVES times.
  settle
  mkdir "$d/ed"
  out=$("$W/bin/editorsave" "$d/ed" "$SAVES")
  read -r _ s <<< "$out"
  record save "$(div "$SAVES" "$s")"
  rm -rf "$d/ed"
}

echo "raw values: $RAW" >&2
printf 'run\ttarget\tworkload\tvalue\n' > "$RAW"
for run in $(seq "$RUNS"); do
  make_data "$run"
  for t in "${targets[@]}"; do
    echo "== run $run/$RUNS: $t" >&2
    bench_target
  done
done

# ---------------------------------------------------------------------------------------
# One-byte edit in the middle of a 256 MiB file in ubiquity: bytes of new chunk data (the
# chunk files, and chunks/small.sqlite for small chunks) and the time of the close that
# commits it, against the time to hash the whole file once (sha256sum).

chunk_bytes() { du -sb "$W/ubq-store/chunks" | cut -f1; }
head -c 256M /dev/urandom > "$SHM.edit"
cp "$SHM.edit" "$W/ubq/edit.bin"
ubq_settle
before=$(chunk_bytes)
edit_secs=$(secs python3 -c "
import os
fd = os.open('$W/ubq/edit.bin', os.O_RDWR); os.pwrite(fd, b'Z', 128 << 20); os.close(fd)")
after=$(chunk_bytes)
hash_secs=$(secs sha256sum "$SHM.edit")
rm -f "$SHM.edit" "$W/ubq/edit.bin"
store_size=$(du -sh "$W/ubq-store" | cut -f1)
backing_size=$(du -sh "$W/ubq-backing" | cut -f1)

# ---------------------------------------------------------------------------------------
# The table: the median of the runs for each target and workload.

declare -A result
while IFS=$'\t' read -r t k v; do result[$t,$k]=$v; done < <(
  tail -n +2 "$RAW" | sort -t$'\t' -k2,2 -k3,3 -k4,4g | awk -F'\t' '
    function flush() { if (n) printf "%s\t%s\t%.6g\n", key1, key2, (n % 2 ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2) }
    $2 != key1 || $3 != key2 { flush(); key1 = $2; key2 = $3; n = 0 }
    { v[++n] = $4 }
    END { flush() }')

fmt() { awk -v v="$1" 'BEGIN { if (v == "" || v == "nan") print "n/a"; else if (v >= 100) printf "%.0f\n", v; else if (v >= 10) printf "%.1f\n", v; else printf "%.2f\n", v }'; }
ratio() { # ubiquity peer higher-is-better: above 1 when ubiquity is faster
  awk -v u="$1" -v p="$2" -v hib="$3" 'BEGIN { r = hib ? (p > 0 ? u / p : -1) : (u > 0 ? p / u : -1); if (r < 0 || u == "nan" || p == "nan") print "n/a"; else printf "%.2f×\n", r }'
}
row() { # label key unit higher-is-better
  local l=${result[plain,$2]:-} p=${result[pt,$2]:-} w=${result[ptwb,$2]:-} u=${result[ubq,$2]:-} e=${result[ubqenc,$2]:-}
  printf '| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n' "$1" "$3" "$(fmt "$l")" "$(fmt "$p")" "$(fmt "$w")" "$(fmt "$u")" \
    "$(ratio "$u" "$p" "$4")" "$(ratio "$u" "$w" "$4")" "$(fmt "$e")" "$(ratio "$e" "$u" "$4")"
}
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
git diff --quiet HEAD 2>/dev/null || commit="$commit + uncommitted changes"
echo
echo "Machine: $(nproc) cores, $(free -g | awk '/Mem:/{print $2}') GiB, kernel $(uname -r), $(findmnt -no FSTYPE -T /var/tmp) on /var/tmp; $(date -u '+%Y-%m-%d %H:%M UTC')"
echo "Command: $cmdline   (commit $commit, release build)"
echo "Each cell: the median of $RUNS run(s), targets interleaved; raw values: $RAW"
echo
echo "| workload | unit | plain dir | passthrough_ll | passthrough_ll -o writeback | ubiquity | ubiquity vs passthrough_ll | ubiquity vs ptwb | ubiquity encrypted | encrypted vs not |"
echo "|---|---|---|---|---|---|---|---|---|---|"
row "sequential write ${SEQ_MB} MiB + fsync" seqw "MiB/s" 1
row "sequential read (cold)" seqr "MiB/s" 1
row "fio sequential write, its defaults (psync, 1 MiB, end_fsync), ${PRE_MB} MiB" fioseqw "MiB/s" 1
row "dd into a preallocated ${PRE_MB} MiB file (fallocate, conv=notrunc,fsync)" prew "MiB/s" 1
row "4 KiB random write (128 MiB file)" randw "IOPS" 1
row "4 KiB random read (128 MiB file, fio drops its cache)" randr "IOPS" 1
row "4 KiB random read, warm (${SEQ_MB} MiB file in the page cache)" warmr "IOPS" 1
row "create+write 1 KiB ($FILES files)" create "files/s" 1
row "stat ($FILES files)" stat "files/s" 1
row "read ($FILES files)" read "files/s" 1
row "delete ($FILES files)" delete "files/s" 1
row "tar -x ($TREE_FILES files, $tree_dirs dirs, $((tree_bytes >> 20)) MiB)" tarx "s" 0
row "du -s of that tree (after drop_caches)" du "s" 0
row "find . -type f \\| wc -l of that tree (after drop_caches)" find "s" 0
row "rsync -a of that tree (fresh destination)" rsync "s" 0
row "git clone ($REPO_FILES files)" clone "s" 0
row "git status of that clone (after drop_caches)" gitstatus "s" 0
row "git status again (warm)" gitstatus2 "s" 0
row "editor save: temp+fsync+rename ($SAVES×)" save "saves/s" 1
echo
printf 'One-byte edit in the middle of a 256 MiB file: %d bytes of new chunk data, commit at close %.2f s (sha256 of the whole file: %.2f s)\n' \
  "$((after - before))" "$edit_secs" "$hash_secs"
echo "Ubiquity after the run: store $store_size, backing directory $backing_size (they keep the history of what the workloads deleted)"
echo "Ratios: for throughput ubiquity/peer, for times (s) peer/ubiquity, so above 1 means ubiquity is faster."
