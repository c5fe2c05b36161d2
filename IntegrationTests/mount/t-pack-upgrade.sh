#!/usr/bin/env bash
# A store of format 17 (chunk files under chunks/xx/) upgrades to local packs: the mount
# serves it at once while the chunk files move into packs in the background. kill -9 at
# random moments of that move loses nothing: every file and every version reads back
# after each crash, and the move goes on at the next mount until no chunk file and no
# chunk directory is left; fsck finds nothing wrong.
# ubq-timeout: 300
set -euo pipefail
source "$(dirname "$0")/lib.sh"

PACKS="$(dirname "$0")/local-packs.py"
mount_fresh upgrade
FILES=${UBQ_UPGRADE_FILES:-10000}

step "$FILES files of 3-20 KiB, and three versions of one of them"
python3 - "$MNT" "$FILES" <<'PY'
import os, random, sys
root, n = sys.argv[1], int(sys.argv[2])
rng = random.Random(45)
for i in range(n):
    d = os.path.join(root, "d%03d" % (i % 200))
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "f%05d" % i), "wb") as f:
        f.write(rng.randbytes(rng.randint(3 << 10, 20 << 10)))
PY
for v in 1 2 3; do head -c 300000 /dev/urandom >"$MNT/versioned.bin"; cp "$MNT/versioned.bin" "$WORK/versioned.$v" 2>/dev/null || { mkdir -p "$WORK"; cp "$MNT/versioned.bin" "$WORK/versioned.$v"; }; done
(cd "$MNT" && find . -path ./.versions -prune -o -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum) >"$WORK/sums"
assert_eq 3 "$(version_count versioned.bin)" "versions of versioned.bin"
unmount_it

step "the store set back to format 17: its chunks as files, no packs"
files=$(python3 "$PACKS" to-files "$STORE")
python3 -c 'import sqlite3, sys; c = sqlite3.connect(sys.argv[1]); c.execute("UPDATE settings SET value = ? WHERE key = ?", ("17", "format")); c.commit()' "$STORE/meta.sqlite"
log "$files chunk files"
((files >= FILES)) || fail "expected at least $FILES chunk files, got $files"

check_all() {
  (cd "$MNT" && find . -path ./.versions -prune -o -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum) >"$WORK/sums.now"
  cmp -s "$WORK/sums" "$WORK/sums.now" || fail "$1: files differ: $(diff "$WORK/sums" "$WORK/sums.now" | head -5)"
  local names v=0
  mapfile -t names < <(version_names versioned.bin)
  assert_eq 3 "${#names[@]}" "$1: versions of versioned.bin"
  for name in "${names[@]}"; do
    v=$((v + 1))
    cmp -s "$WORK/versioned.$v" "$MNT/.versions/versioned.bin/$name" || fail "$1: version $v of versioned.bin"
  done
}

for round in 1 2 3; do
  step "mount, kill -9 during the move (round $round), everything reads back"
  _ubq_mount
  sleep "0.$((RANDOM % 9 + 1))"
  left=$( (find "$STORE/chunks" -mindepth 2 -maxdepth 2 -type f -name '[0-9a-f]*' 2>/dev/null || true) | wc -l)
  log "round $round: $left chunk files left when killed"
  crash_daemon
  _ubq_mount
  check_all "after the kill in round $round"
  crash_daemon
done

step "the last mount moves every file; nothing of the old layout is left"
_ubq_mount
wait_for -t 240 "the move of the chunk files ends" grep -q "chunk files .* into local packs in" "$STORE/daemon.log"
check_all "after the move"
left=$(find "$STORE/chunks" -mindepth 1 -maxdepth 1 -type d -name '[0-9a-f][0-9a-f]' | wc -l)
assert_eq 0 "$left" "chunk directories left"
unmount_it
python3 "$PACKS" sealed "$STORE" || fail "a pack without its index after the unmount"
"$UBIQUITY" fsck --store "$STORE" >/dev/null || fail "fsck after the upgrade"
_ubq_mount
check_all "after a remount"
unmount_it
pass
