#!/usr/bin/env bash
# Prune and gc through a real mount: `ubiquity prune --dry-run` lists and changes nothing;
# prune drops the versions the policy does not keep (they vanish from .versions/), a
# deleted file's history goes after its window, only under a path when one is given;
# gc frees their chunks and nothing current; both work on an unmounted store (--store);
# `--retention keep=everything` keeps all; and SIGKILL of the daemon in the middle of
# prune or gc, 20 times each, never loses a current version (fsck clean after each).
# ubq-timeout: 240
set -euo pipefail
source "$(dirname "$0")/lib.sh"

mount_fresh prunegc
cd "$MNT"
# The chunks' disk use: blocks, not lengths (gc punches holes in packs; a pack keeps its length).
chunk_bytes() { du -s --block-size=1 "$STORE/chunks" | cut -f1; }

step "20 saves of a.bin, 5 of docs/b.bin, one deleted file"
mkdir docs
for i in $(seq 20); do head -c 100000 /dev/urandom >a.bin; done
for i in $(seq 5); do head -c 100000 /dev/urandom >docs/b.bin; done
echo "soon gone" >gone.txt
rm gone.txt
sum_a=$(sha256sum <a.bin) sum_b=$(sha256sum <docs/b.bin)
"$UBIQUITY" sync "$MNT" >/dev/null # uploaded: versions still waiting for upload are never pruned
assert_eq 20 "$(version_count a.bin)" "versions of a.bin"
sleep 2 # older than --keep-within 1s

step "a dry run lists and changes nothing"
out=$("$UBIQUITY" prune --dry-run --keep-within 1s --keep-deleted-within 1s "$MNT")
assert_contains "$out" "would prune 24 version(s)" "dry-run summary"
assert_contains "$out" "gone.txt" "dry-run list"
assert_eq 20 "$(version_count a.bin)" "versions of a.bin after a dry run"

step "ubiquity status: the store's size, the content only history uses, what prune + gc would reclaim"
out=$("$UBIQUITY" status)
assert_contains "$out" "chunk files not measured yet" "status before any gc"
"$UBIQUITY" gc "$MNT" >/dev/null
out=$("$UBIQUITY" status)
# 19 old versions of a.bin and 4 of docs/b.bin, 100,000 bytes each (gone.txt adds 10).
assert_contains "$out" "195.3 KiB in current versions, 2.1 MiB only in older versions" "status content line"
assert_contains "$out" "reclaimable: 0 bytes by" "status: the default policy keeps every version of the last 24 h"

step "prune only under docs/"
out=$("$UBIQUITY" prune --keep-within 1s --keep-deleted-within 1s "$MNT/docs")
assert_contains "$out" "pruned 4 version(s)" "prune of docs/"
assert_eq 1 "$(version_count docs/b.bin)" "versions of docs/b.bin"
assert_eq 20 "$(version_count a.bin)" "versions of a.bin (outside docs/)"

step "prune everything, then gc frees the space"
out=$("$UBIQUITY" prune --keep-within 1s --keep-deleted-within 1s "$MNT")
assert_contains "$out" "pruned 20 version(s)" "prune of the rest"
assert_eq 1 "$(version_count a.bin)" "versions of a.bin"
[[ ! -e .versions/gone.txt ]] || fail "the deleted file's history is still in .versions/"
before=$(chunk_bytes)
out=$("$UBIQUITY" gc --grace 0s "$MNT")
assert_contains "$out" "MiB freed" "gc report"
after=$(chunk_bytes)
# 23 versions of 100,000 bytes; the small chunks database may grow by a few pages (its WAL).
(( before - after >= 2250000 )) || fail "gc freed $((before - after)) bytes, expected about 2.3 MB"
assert_eq "$sum_a" "$(sha256sum <a.bin)" "a.bin after gc"
assert_eq "$sum_b" "$(sha256sum <docs/b.bin)" "docs/b.bin after gc"
"$UBIQUITY" fsck --store "$STORE" >/dev/null || fail "fsck after prune and gc"

step "prune and gc of an unmounted store"
for i in $(seq 3); do head -c 50000 /dev/urandom >a.bin; done
sum_a=$(sha256sum <a.bin)
"$UBIQUITY" sync "$MNT" >/dev/null
unmount_it
sleep 1.1
out=$("$UBIQUITY" prune --store "$STORE" --keep-within 1s)
assert_contains "$out" "pruned 3 version(s)" "prune --store"
out=$("$UBIQUITY" gc --store "$STORE" --grace 0s)
assert_contains "$out" "KiB freed" "gc --store"
_ubq_mount
assert_eq "$sum_a" "$(sha256sum <"$MNT/a.bin")" "a.bin after an offline prune and gc"
out=$("$UBIQUITY" prune --store "$STORE" 2>&1 || true)
assert_contains "$out" "in use" "prune --store of a mounted store"

step "--retention keep=everything keeps every version"
unmount_it
MOUNT_ARGS=(--retention keep=everything)
_ubq_mount
cd "$MNT"
for i in $(seq 3); do echo "kept $i" >kept.txt; done
"$UBIQUITY" sync "$MNT" >/dev/null
sleep 1.1
out=$("$UBIQUITY" prune --keep-deleted-within 1s "$MNT")
assert_contains "$out" "pruned 0 version(s)" "prune under keep=everything"
assert_eq 3 "$(version_count kept.txt)" "versions under keep=everything"
MOUNT_ARGS=()
assert_fails "a bad --retention setting is refused at mount" \
  "$UBIQUITY" mount "$ROOT/other" --store "$ROOT/other-store" --retention keep=most

step "SIGKILL during prune and during gc, 20 times each"
cd /
unmount_it
_ubq_mount
for round in $(seq 40); do
  for i in $(seq 5); do head -c 20000 /dev/urandom >"$MNT/k.bin"; done
  sum_k=$(sha256sum <"$MNT/k.bin")
  "$UBIQUITY" sync "$MNT" >/dev/null
  if ((round % 2)); then command=(prune --keep-within 1s); else command=(gc --grace 0s); fi
  "$UBIQUITY" "${command[@]}" "$MNT" >/dev/null 2>&1 &
  cli=$!
  sleep "0.0$((RANDOM % 10))"
  crash_daemon
  wait "$cli" 2>/dev/null || true
  _ubq_mount
  assert_eq "$sum_k" "$(sha256sum <"$MNT/k.bin")" "k.bin after SIGKILL during ${command[0]} (round $round)"
  "$UBIQUITY" fsck --store "$STORE" >/dev/null || fail "fsck after SIGKILL during ${command[0]} (round $round)"
done
unmount_it
pass
