#!/usr/bin/env bash
# The backing directory's gc through real mounts (backing format 4, docs/FORMAT.md
# "Collecting the backing directory"): after alpha prunes, `ubiquity gc` rewrites its
# journal without the pruned records (journal.1, smaller); objects no journal names
# become fossils once older than a day (aged here with touch) and are deleted a week
# later (2 s here: UBQ_TEST_FOSSIL_AGE, as a fossil's age counts from its rename); beta, which kept the old
# history, shows no conflict and reads on; a device that joins afterwards gets the
# current tree; a version beta made offline meanwhile, whose content is that of an
# object that was deleted, reaches everyone (beta uploads the object again). SIGKILL of
# alpha's daemon during the backing gc, 5 times: the mounts stay whole.
# ubq-timeout: 240
set -euo pipefail
source "$(dirname "$0")/lib.sh"

DEVICE=alpha
# A fossil's age counts from its rename (ctime), which cannot be set back: alpha's daemon
# deletes fossils after 2 s instead of 7 days (a test setting), the rest is as shipped.
export UBQ_TEST_FOSSIL_AGE=2
mount_fresh backinggc --poll 0.2
unset UBQ_TEST_FOSSIL_AGE
A=$MNT
mount_device beta --poll 0.2
B=$(mnt_of beta)
on_failure dump_sync_state
id_alpha() { backing_device_id alpha; }
objects() { find "$BACKING/objects" -type f -name '[0-9a-f]*' ! -name '*.fossil-*' | wc -l; }
fossils() { find "$BACKING/objects" -type f -name '*.fossil-*' | wc -l; }

step "alpha saves big.bin 5 times (one object each), beta receives every version"
for i in $(seq 5); do
  head -c 16000 /dev/urandom >"$DATA/v$i" # one chunk (under the chunker's 16 KiB minimum)
  cp "$DATA/v$i" "$A/big.bin"
  "$UBIQUITY" sync "$A" >/dev/null
done
"$UBIQUITY" sync "$B" >/dev/null
assert_same_file "$DATA/v5" "$B/big.bin" "big.bin on beta"
assert_eq 5 "$(version_count_at "$B" big.bin)" "versions of big.bin on beta"
dev=$(id_alpha)
[[ -n $dev ]] || fail "no journal of alpha"
journal0=$(stat -c %s "$BACKING/devices/$dev/journal")
objects_before=$(objects)

step "alpha prunes; gc rewrites its journal without the pruned records"
sleep 1.1
out=$("$UBIQUITY" prune --keep-within 1s "$A")
assert_contains "$out" "pruned 4 version(s)" "prune on alpha"
out=$("$UBIQUITY" gc --grace 0s "$A")
assert_contains "$out" "backing directory: rewrote this device's journal (1 records" "gc report: the checkpoint"
assert_contains "$out" "0 became fossils" "gc report: objects younger than a day stay"
assert_eq "journal.1" "$(ls "$BACKING/devices/$dev")" "alpha's journal generations"
journal1=$(stat -c %s "$BACKING/devices/$dev/journal.1")
((journal1 < journal0)) || fail "journal.1 ($journal1 bytes) is not smaller than journal ($journal0 bytes)"

step "objects no journal names become fossils once a day old"
find "$BACKING/objects" -type f -exec touch -d '2 days ago' {} +
out=$("$UBIQUITY" gc --grace 0s "$A")
# The object of big.bin's current version stays.
assert_contains "$out" "(1 objects named)" "gc report: references"
named=1 gone=$((objects_before - 1))
assert_contains "$out" "$gone became fossils" "gc report: fossils"
assert_eq "$gone" "$(fossils)" "fossils in the backing directory"
assert_eq "$named" "$(objects)" "objects left"

step "beta, which kept the whole history, reads on with no conflict; a new device gets the tree"
echo "from beta" >"$B/note.txt"
"$UBIQUITY" sync "$B" >/dev/null
"$UBIQUITY" sync "$A" >/dev/null
assert_file_content "$A/note.txt" "from beta" "note.txt on alpha"
assert_eq 0 "$(xattr "$B/big.bin" user.ubiquity.conflicts)" "conflicts of big.bin on beta"
mount_device gamma --poll 0.2
G=$(mnt_of gamma)
"$UBIQUITY" sync "$G" >/dev/null
assert_same_file "$DATA/v5" "$G/big.bin" "big.bin on gamma"
assert_file_content "$G/note.txt" "from beta" "note.txt on gamma"
assert_eq 1 "$(version_count_at "$G" big.bin)" "versions of big.bin on gamma (alpha pruned the rest)"
assert_eq 0 "$(xattr "$G/big.bin" user.ubiquity.conflicts)" "conflicts of big.bin on gamma"

step "beta, offline, saves the content of a pruned version"
"$UBIQUITY" pause "$B" >/dev/null
cp "$DATA/v2" "$B/offline.bin"

step "a fossil's wait later (7 days; 2 s here) the fossils go"
sleep 2.1
out=$("$UBIQUITY" gc --grace 0s "$A")
assert_contains "$out" "$gone fossils deleted" "gc report: deleted"
assert_eq 0 "$(fossils)" "fossils left"
sha2=$(sha256sum <"$DATA/v2" | cut -d' ' -f1)
assert_missing "$BACKING/objects/${sha2:0:2}/$sha2" "the object of a pruned version, a week after it became a fossil"

step "beta comes back: its version (and the object again) reaches alpha and gamma"
"$UBIQUITY" resume "$B" >/dev/null
"$UBIQUITY" sync "$B" >/dev/null
assert_exists "$BACKING/objects/${sha2:0:2}/$sha2" "the object beta uploaded again"
"$UBIQUITY" sync "$A" >/dev/null
"$UBIQUITY" sync "$G" >/dev/null
assert_same_file "$DATA/v2" "$A/offline.bin" "offline.bin on alpha"
assert_same_file "$DATA/v2" "$G/offline.bin" "offline.bin on gamma"

step "SIGKILL of alpha's daemon during the backing gc, 5 times"
for round in $(seq 5); do
  for i in $(seq 3); do head -c 30000 /dev/urandom >"$A/k.bin"; done
  sum_k=$(sha256sum <"$A/k.bin")
  "$UBIQUITY" sync "$A" >/dev/null
  sleep 1.1
  "$UBIQUITY" prune --keep-within 1s "$A" >/dev/null
  find "$BACKING/objects" -type f -exec touch -d '2 days ago' {} +
  "$UBIQUITY" gc --grace 0s "$A" >/dev/null 2>&1 &
  cli=$!
  sleep "0.$((RANDOM % 4))"
  crash_daemon
  wait "$cli" 2>/dev/null || true
  _ubq_mount
  A=$MNT
  assert_eq "$sum_k" "$(sha256sum <"$A/k.bin")" "k.bin on alpha after SIGKILL (round $round)"
  "$UBIQUITY" gc --grace 0s "$A" >/dev/null
  "$UBIQUITY" sync "$B" >/dev/null
  assert_eq "$sum_k" "$(sha256sum <"$B/k.bin")" "k.bin on beta after SIGKILL (round $round)"
  assert_eq 0 "$(xattr "$B/k.bin" user.ubiquity.conflicts)" "conflicts of k.bin on beta (round $round)"
done
unmount_device gamma
unmount_device beta
unmount_it
"$UBIQUITY" fsck --store "$STORE" >/dev/null || fail "fsck of alpha's store"
"$UBIQUITY" fsck --store "$STORE_beta" >/dev/null || fail "fsck of beta's store"
pass
