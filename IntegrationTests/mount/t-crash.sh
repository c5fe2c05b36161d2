#!/usr/bin/env bash
# A daemon killed (SIGKILL) right after a save keeps the saved file: versions are not
# held back by the 100 ms group commit of metadata (a bug the systemd test found).
set -euo pipefail
source "$(dirname "$0")/lib.sh"

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
unmount_it
pass
