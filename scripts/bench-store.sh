#!/usr/bin/env bash
# What versions of small files cost on disk (issue 13). Builds a container of N files of
# 20 bytes with 5 versions each (every version distinct content) through the store API
# (`ubiquity-bench-fill --small`), then measures:
#   - the store's size on disk (du), against the target 1.5 x (content + 200 B/version),
#     and its parts (metadata database, small-chunk database, chunk files);
#   - the backing directory's size after a real mount uploaded everything, against the
#     same target, and how many files it holds;
#   - a prune to one version per file (`prune --keep-within 1s`) and a gc through the live
#     mount, timed, while a reader opens and reads random files and writes every tenth
#     (latency p50/p99/max of each, against p99 <= 10 ms); then the store's size again,
#     against 1.2 x the live content and against a store that only ever had the live
#     versions; and the backing directory's size after the gc rewrote the journal.
#
#   scripts/bench-store.sh                  # 100,000 files (500,000 versions)
#   BENCH_FILES=20000 scripts/bench-store.sh
#
# Release build; needs FUSE for the upload. Everything lives under a temp directory that
# is removed at the end; the mount is unmounted.
set -euo pipefail
cd "$(dirname "$0")/.."

files=${BENCH_FILES:-100000}
versions=5
swift build -c release >/dev/null
bindir=$(swift build -c release --show-bin-path)
bin=$bindir/ubiquity
work=$(mktemp -d /tmp/ubiquity-bench-store.XXXXXX)
mnt=$work/mnt
cleanup() {
  fusermount3 -u "$mnt" 2>/dev/null || fusermount3 -u -z "$mnt" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

disk() { du -s --block-size=1 "$@" 2>/dev/null | awk '{ s += $1 } END { print s + 0 }'; }
mib() { awk -v b="$1" 'BEGIN { printf "%.1f MiB", b / 1048576 }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }
now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

store=$work/store backing=$work/backing
echo "bench-store: $files files x $versions versions of 20 bytes" >&2
start=$(now)
"$bindir/ubiquity-bench-fill" --small "$store" "$files" "$versions"
echo "bench-store: filled in $(elapsed "$start") s" >&2

content=$((files * versions * 20))
target=$(( (content + 200 * files * versions) * 3 / 2 ))
store_bytes=$(disk "$store")
meta_bytes=$(disk "$store"/meta.sqlite*)
small_bytes=$(disk "$store"/chunks/small.sqlite*)
file_bytes=$((store_bytes - meta_bytes - small_bytes))

echo "bench-store: uploading through a real mount" >&2
mkdir -p "$mnt" "$backing"
start=$(now)
"$bin" mount "$mnt" --store "$store" --backing "$backing" >/dev/null
"$bin" sync "$mnt" >/dev/null # returns once this cycle uploaded everything
pending=$(getfattr --only-values -n user.ubiquity.sync "$mnt" 2>/dev/null | sed -n 's/^pending=//p')
[[ $pending == 0 ]] || { echo "bench-store: $pending records still pending after sync" >&2; exit 1; }
upload_time=$(elapsed "$start")
backing_bytes=$(disk "$backing")
backing_files=$(find "$backing" -type f | wc -l)

echo "bench-store: prune to one version per file, then gc through the live mount while it serves" >&2
"$bin" prune --keep-within 1s --keep-deleted-within 1s "$mnt" >/dev/null
# Random reads of the files, and a write every tenth operation, until told to stop: for
# as long as gc runs, and for the same time without gc (the reference).
load() {
python3 - "$mnt" "$files" "$work/stop" <<'PY'

import os, random, sys, time
root, n, stop = sys.argv[1], int(sys.argv[2]), sys.argv[3]
rng = random.Random(1)
reads, writes = [], []
k = 0
while not os.path.exists(stop):
    i = rng.randrange(n)
    path = "%s/d%05d/f%07d.txt" % (root, i // 100, i)
    t0 = time.perf_counter()
    if k % 10 == 9:
        fd = os.open(path, os.O_WRONLY | os.O_TRUNC)
        os.write(fd, b"written during gc %d\n" % k)
        os.close(fd)
        writes.append(time.perf_counter() - t0)
    else:
        fd = os.open(path, os.O_RDONLY)
        os.read(fd, 4096)
        os.close(fd)
        reads.append(time.perf_counter() - t0)
    k += 1
for name, lat in (("reads", reads), ("writes", writes)):
    lat.sort()
    q = lambda p: lat[min(len(lat) - 1, int(p * len(lat)))] * 1000
    print("%s %d %.2f %.2f %.1f" % (name, len(lat), q(0.5), q(0.99), lat[-1] * 1000))
PY
}
load >"$work/latency" &
loader=$!
sleep 1
start=$(now)
gc_out=$("$bin" gc --grace 0s "$mnt")
gc_time=$(elapsed "$start")
touch "$work/stop"
wait "$loader"
rm "$work/stop"
load >"$work/reference" &
loader=$!
sleep "$gc_time"
touch "$work/stop"
wait "$loader"
# The loads wrote a second version of some files: prune and gc again, so that what is
# measured next is one version per file.
sleep 1.1
"$bin" prune --keep-within 1s --keep-deleted-within 1s "$mnt" >/dev/null
"$bin" gc --grace 0s "$mnt" >/dev/null
read -r _ reads read_p50 read_p99 read_max < <(grep '^reads' "$work/latency")
read -r _ writes write_p50 write_p99 write_max < <(grep '^writes' "$work/latency")
read -r _ ref_reads ref_read_p50 ref_read_p99 ref_read_max < <(grep '^reads' "$work/reference")
read -r _ ref_writes ref_write_p50 ref_write_p99 ref_write_max < <(grep '^writes' "$work/reference")
"$bin" unmount "$mnt" >/dev/null
pruned_bytes=$(disk "$store")
pruned_backing=$(disk "$backing")
live=$((files * 20))
# The reference for "after prune": a store that only ever had the live versions.
"$bindir/ubiquity-bench-fill" --small "$work/reference-store" "$files" 1
reference_bytes=$(disk "$work/reference-store")
chunks_checked=$(sed -n 's/.*checked \([0-9]*\) chunks.*/\1/p' <<<"$gc_out")
versions_read=$(sed -n 's/.*read \([0-9]*\) versions.*/\1/p' <<<"$gc_out")
# The budget: 60 s per million versions the container had before the prune (gc marks what
# is left, sweeps the chunks, gives back the pages the prune freed and rewrites the
# journal). Until store format 14 every version had a chunk of its own and the budget was
# counted in chunks, the same number; tiny contents are no chunks since.
gc_items=$((files * versions))

printf '\n| measure (%s files x %s versions of 20 B) | value | target | ratio to target |\n|---|---|---|---|\n' "$files" "$versions"
printf '| content of all versions | %s | | |\n' "$(mib "$content")"
printf '| store on disk | %s | %s | %s |\n' "$(mib "$store_bytes")" "$(mib "$target")" "$(ratio "$store_bytes" "$target")"
printf '| - metadata (meta.sqlite) | %s (%d B/version) | | |\n' "$(mib "$meta_bytes")" $((meta_bytes / (files * versions)))
printf '| - small chunks (small.sqlite) | %s (%d B/chunk) | | |\n' "$(mib "$small_bytes")" $((small_bytes / (files * versions)))
printf '| - chunk files and directories | %s | | |\n' "$(mib "$file_bytes")"
printf '| backing directory | %s in %s files | %s | %s |\n' "$(mib "$backing_bytes")" "$backing_files" "$(mib "$target")" "$(ratio "$backing_bytes" "$target")"
printf '| upload of everything (s) | %s | | |\n' "$upload_time"
printf '| store after prune to 1 version + gc | %s | %s (1.2 x live content) | %s |\n' "$(mib "$pruned_bytes")" "$(mib $((live * 6 / 5)))" "$(ratio "$pruned_bytes" $((live * 6 / 5)))"
printf '| - against a store that only ever had the live versions (%s) | %s | %s (1.2 x it) | %s |\n' "$(mib "$reference_bytes")" "$(mib "$pruned_bytes")" "$(mib $((reference_bytes * 6 / 5)))" "$(ratio "$pruned_bytes" $((reference_bytes * 6 / 5)))"
printf '| backing directory after prune + gc (journal rewritten) | %s | %s (1.5 x (live content + 200 B/file)) | %s |\n' "$(mib "$pruned_backing")" "$(mib $(( (live + 200 * files) * 3 / 2 )))" "$(ratio "$pruned_backing" $(( (live + 200 * files) * 3 / 2 )))"
printf '| live gc after the prune (read %s versions, checked %s chunks) (s) | %s | %s (60 s per million versions before the prune) | %s |\n' "$versions_read" "$chunks_checked" "$gc_time" \
  "$(awk -v c="$gc_items" 'BEGIN { printf "%.1f", c * 60 / 1000000 }')" "$(ratio "$gc_time" "$(awk -v c="$gc_items" 'BEGIN { print c * 60 / 1000000 }')")"
printf '| reads during gc: p50 / p99 / max (ms) | %s / %s / %s (%s reads) | p99 10 | %s |\n' "$read_p50" "$read_p99" "$read_max" "$reads" "$(ratio "$read_p99" 10)"
printf '| writes during gc: p50 / p99 / max (ms) | %s / %s / %s (%s writes) | p99 10 | %s |\n' "$write_p50" "$write_p99" "$write_max" "$writes" "$(ratio "$write_p99" 10)"
printf '| the same without gc: reads p50 / p99 / max (ms) | %s / %s / %s (%s reads) | | |\n' "$ref_read_p50" "$ref_read_p99" "$ref_read_max" "$ref_reads"
printf '| the same without gc: writes p50 / p99 / max (ms) | %s / %s / %s (%s writes) | | |\n' "$ref_write_p50" "$ref_write_p99" "$ref_write_max" "$ref_writes"
echo "$gc_out" | sed 's/^/    /'
