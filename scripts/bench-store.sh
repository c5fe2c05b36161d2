#!/usr/bin/env bash
# What versions of small files cost on disk (issue 13). Builds a container of N files of
# 20 bytes with 5 versions each (every version distinct content) through the store API
# (`ubiquity-bench-fill --small`), then measures:
#   - the store's size on disk (du), against the target 1.5 x (content + 200 B/version),
#     and its parts (metadata database, small-chunk database, chunk files);
#   - the backing directory's size after a real mount uploaded everything, against the
#     same target, and how many files it holds;
#   - after pruning to one version per file (`prune --keep-within 1s`) and gc: the store
#     again, against 1.2 x the live content;
#   - the time of that gc (offline, `gc --store`), with the number of chunks it checked.
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
"$bin" unmount "$mnt" >/dev/null
backing_bytes=$(disk "$backing")
backing_files=$(find "$backing" -type f | wc -l)

live=$((files * 20))
"$bin" prune --store "$store" --keep-within 1s --keep-deleted-within 1s >/dev/null
start=$(now)
gc_out=$("$bin" gc --store "$store" --grace 0s)
gc_time=$(elapsed "$start")
pruned_bytes=$(disk "$store")

printf '\n| measure (%s files x %s versions of 20 B) | value | target | ratio to target |\n|---|---|---|---|\n' "$files" "$versions"
printf '| content of all versions | %s | | |\n' "$(mib "$content")"
printf '| store on disk | %s | %s | %s |\n' "$(mib "$store_bytes")" "$(mib "$target")" "$(ratio "$store_bytes" "$target")"
printf '| - metadata (meta.sqlite) | %s (%d B/version) | | |\n' "$(mib "$meta_bytes")" $((meta_bytes / (files * versions)))
printf '| - small chunks (small.sqlite) | %s (%d B/chunk) | | |\n' "$(mib "$small_bytes")" $((small_bytes / (files * versions)))
printf '| - chunk files and directories | %s | | |\n' "$(mib "$file_bytes")"
printf '| backing directory | %s in %s files | %s | %s |\n' "$(mib "$backing_bytes")" "$backing_files" "$(mib "$target")" "$(ratio "$backing_bytes" "$target")"
printf '| upload of everything (s) | %s | | |\n' "$upload_time"
printf '| store after prune to 1 version + gc | %s | %s (1.2 x live content) | %s |\n' "$(mib "$pruned_bytes")" "$(mib $((live * 6 / 5)))" "$(ratio "$pruned_bytes" $((live * 6 / 5)))"
printf '| gc of %s versions'"'"' chunks (s) | %s | 60 per million chunks | |\n' "$((files * versions))" "$gc_time"
echo "$gc_out" | sed 's/^/    /'
