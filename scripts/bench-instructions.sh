#!/usr/bin/env bash
# Instructions the daemon runs per file, counted by callgrind: exact and the same on a busy
# machine, where timings are not (a profile of the request path, not a benchmark). The
# daemon runs under valgrind while BENCH_FILES files of 1 KiB are created
# (scripts/bench/smallfiles.c), synced, then stat'ed, read and deleted one phase at a
# time; it prints, per file, the inclusive instructions of each request handler that
# phase calls, the background's (fold, sync) and the whole daemon's. With UBQ_REF, that
# build gets a column too. Release build; root not needed. About a minute per build.
#   scripts/bench-instructions.sh       BENCH_FILES=1000 UBQ_REF=/path/to/older/ubiquity scripts/bench-instructions.sh
set -euo pipefail
export LC_ALL=C
cd "$(dirname "$0")/.."
FILES=${BENCH_FILES:-1000}
[[ $FILES =~ ^[1-9][0-9]*$ ]] || { echo "BENCH_FILES must be a positive number" >&2; exit 2; }
. scripts/bench/common.sh
release_build gcc valgrind python3

W=$(mktemp -d /var/tmp/ubiquity-bench-instructions.XXXXXX)
pid=
cleanup() {
  set +e
  mountpoint -q "$W/mnt" && fusermount3 -u "$W/mnt"
  [[ -n $pid ]] && wait "$pid"
  rm -rf "$W"
}
trap cleanup EXIT
mkdir "$W/bin"
gcc -O2 -Wall scripts/bench/smallfiles.c -o "$W/bin/smallfiles"

# One build: its counts per handler, as "name count" lines in $W/$2.counts.
count() {
  local binary=$1 label=$2
  rm -rf "$W/mnt" "$W/store" "$W/backing" "$W/xdg"
  mkdir "$W/mnt"
  # valgrind 3.19 cannot read the DWARF 5 of a Swift build: symbols are enough.
  objcopy --strip-debug "$binary" "$W/bin/$label"
  XDG_DATA_HOME="$W/xdg" valgrind --tool=callgrind --callgrind-out-file="$W/$label.out" \
    --separate-callers3='*withLock*' --separate-callers3='*withNamespaceLock*' \
    "$W/bin/$label" mount "$W/mnt" --store "$W/store" --backing "$W/backing" --foreground >"$W/$label.log" 2>&1 &
  pid=$!
  for _ in $(seq 600); do mountpoint -q "$W/mnt" && break; sleep 0.2; done
  mountpoint -q "$W/mnt" || { cat "$W/$label.log" >&2; echo "the mount under valgrind did not come up" >&2; exit 1; }
  mkdir "$W/mnt/s"
  "$W/bin/smallfiles" "$W/mnt/s" "$FILES" create >/dev/null
  settle_mount "$W/mnt"
  ( cd "$W/mnt/s" && for f in f*; do stat "$f"; done >/dev/null && cat f* >/dev/null && rm -f f* )
  settle_mount "$W/mnt"
  fusermount3 -u "$W/mnt"
  wait "$pid"; pid=
  callgrind_annotate --inclusive=yes --threshold=100 "$W/$label.out" | python3 -c '
import re, sys
files = int(sys.argv[1])
# Each row: a pattern the whole function name must match (the handler, not its closures).
rows = [("create", r".*10FileSystemC6create6parent4name4mode5flags6caller.*ErrnoVYKF"),
        ("write", r".*10FileSystemC5write_6offset4data.*ErrnoVYKF"),
        ("flush (the save)", r".*10FileSystemC5flushyyAA8HandleIDVAA5ErrnoVYKF"),
        ("open", r".*10FileSystemC4open_5flags.*ErrnoVYKF"),
        ("release", r".*10FileSystemC7releaseyyAA8HandleIDVAA5ErrnoVYKF"),
        ("unlink", r".*10FileSystemC6unlink6parent4namey.*ErrnoVYKF"),
        ("forget", r".*10FileSystemC6forget_5county.*VtF"),
        ("fold (background)", r".*10FileSystemC11groupCommitSbyF"),
        ("sync (background)", r".*EngineC8runCycle\w*8pushPullySb_tFyytz_tXEfU_")]
found = {}
for line in sys.stdin:
    m = re.match(r"\s*([\d,]+) \([^)]*\)\s+(\S+:)?(\S+)", line)
    if not m: continue
    n, name = int(m.group(1).replace(",", "")), m.group(3)
    if "PROGRAM TOTALS" in line: found["the whole daemon"] = n; continue
    for row, pattern in rows:
        if row not in found and re.fullmatch(pattern, name): found[row] = n
for row in [r for r, _ in rows] + ["the whole daemon"]:
    print(row.replace(" ", "_"), found.get(row, 0) // files)
' "$FILES" >"$W/$label.counts"
}

count "$UBQ" ubq
labels=(ubq)
[[ -n $REF ]] && { count "$REF" ref; labels+=(ref); }
echo "Instructions per file (callgrind, inclusive), $FILES files of 1 KiB; commit $(git rev-parse --short HEAD)$([[ -n $(git status --porcelain) ]] && echo ' + uncommitted changes')"
printf '| %s |' "handler"; for l in "${labels[@]}"; do printf ' %s |' "$l"; done; echo
printf '|---|'; for _ in "${labels[@]}"; do printf -- '---|'; done; echo
while read -r name _; do
  printf '| %s |' "${name//_/ }"
  for l in "${labels[@]}"; do printf ' %s |' "$(awk -v n="$name" '$1 == n { print $2 }' "$W/$l.counts")"; done
  echo
done <"$W/ubq.counts"
