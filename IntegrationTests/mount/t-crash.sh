#!/usr/bin/env bash
# A daemon killed (SIGKILL) right after a save keeps the saved file: the intent log holds
# the saves the 100 ms group commit of metadata has not committed yet (a bug the systemd
# test found, before the log: the batch was committed at every save). A
# power loss that drops a saved version's bytes (they were never fsynced) rolls the file
# back to its previous version at the next mount, instead of EIO forever.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
require_cmd setfattr "apt-get install attr"

mount_fresh crash
step "save, then SIGKILL the daemon at once"
mkdir "$MNT/dir"
echo "saved before the crash" > "$MNT/dir/kept.txt"
# auto_unmount (fusermount3) removes the dead mount; ubiquity mount clears it otherwise.
crash_daemon
_ubq_mount
assert_file_content "$MNT/dir/kept.txt" "saved before the crash" "file saved just before the crash"
assert_eq 1 "$(version_count dir/kept.txt)" "its version"
"$UBIQUITY" fsck --store "$STORE" >/dev/null || fail "fsck after the crash"

step "a burst of saves in new directories, then SIGKILL: every save is there (intent log)"
for i in $(seq 1 40); do mkdir -p "$MNT/burst/d$((i % 7))"; echo "burst $i" >"$MNT/burst/d$((i % 7))/f$i"; done
# xattrs are frames of the operation log too (format 17): set, replaced and removed.
setfattr -n user.tag -v first "$MNT/burst/d1/f1"
setfattr -n user.tag -v second "$MNT/burst/d1/f1"
setfattr -n user.gone -v x "$MNT/burst/d2/f2"
setfattr -x user.gone "$MNT/burst/d2/f2"
setfattr -n user.dir -v d "$MNT/burst/d3"
crash_daemon
_ubq_mount
for i in $(seq 1 40); do assert_file_content "$MNT/burst/d$((i % 7))/f$i" "burst $i" "burst file $i after the crash"; done
assert_eq second "$(xattr "$MNT/burst/d1/f1" user.tag)" "an xattr replaced just before the crash"
assert_eq "" "$(getfattr --absolute-names -d "$MNT/burst/d2/f2" 2>/dev/null)" "an xattr removed just before the crash"
assert_eq d "$(xattr "$MNT/burst/d3" user.dir)" "a directory's xattr set just before the crash"
"$UBIQUITY" fsck --store "$STORE" >/dev/null || fail "fsck after the burst"

step "power loss: a version whose chunk never reached the disk is rolled back at mount"
mkdir -p "$WORK"
head -c 5000 /dev/urandom >"$WORK/v1"
dd if="$WORK/v1" of="$MNT/p.bin" conv=fsync status=none # durable: fsync
records() { python3 "$(dirname "$0")/local-packs.py" records "$STORE" | cut -d' ' -f1 | sort; }
before=$(records)
head -c 5000 /dev/urandom >"$MNT/p.bin" # saved at close, not yet durable
crash_daemon
lost=$(comm -13 <(echo "$before") <(records))
[[ -n $lost ]] || fail "no new pack record for the second version of p.bin"
# What a power loss does to writes that were never flushed: the record is not whole.
for sha in $lost; do python3 "$(dirname "$0")/local-packs.py" damage "$STORE" lose "$sha"; done
simulate_reboot "$STORE"
_ubq_mount
assert_eq "$(sha256sum <"$WORK/v1")" "$(sha256sum <"$MNT/p.bin")" "p.bin is its durable version again"
assert_eq 1 "$(version_count p.bin)" "the lost version is gone from .versions/"
assert_contains "$(cat "$STORE/daemon.log")" "p.bin: version" "the log names the rolled-back version"
assert_contains "$(cat "$STORE/daemon.log")" "rolled back" "the log says it was rolled back"
"$UBIQUITY" fsck --store "$STORE" >/dev/null || fail "fsck after the rollback"
# (The crash may come before the group commit wrote the version at all; then the
# intent log held it, and there was nothing for the recovery to check: count 0.)
checks=$(grep -c 'written since the last durability barrier' "$STORE/daemon.log" || true)
echo "saved, not fsynced" >"$MNT/q.txt"
unmount_it
_ubq_mount
assert_eq "$checks" "$(grep -c 'written since the last durability barrier' "$STORE/daemon.log")" \
  "a clean unmount leaves nothing for the next mount to check"
assert_file_content "$MNT/q.txt" "saved, not fsynced" "q.txt after a clean unmount"
unmount_it
pass
