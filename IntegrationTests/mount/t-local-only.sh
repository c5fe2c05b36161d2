#!/usr/bin/env bash
# Local-only paths (editor scratch names and anything under a *.nosync directory) are
# ordinary readable/writable files but never get a history under .versions/, and
# report user.ubiquity.local = 1. A normal file next to them is versioned (control).
set -euo pipefail
source "$(dirname "$0")/lib.sh"

mount_fresh local
cd "$MNT"
mkdir sub x.nosync x.nosync/deeper

local_files=(
  a.swp sub/b.swp c.swx 'notes.txt~' sub/4913 4913 .#x sub/.#lock.txt
  .goutputstream-x .goutputstream-ABC123
  x.nosync/file.txt x.nosync/deeper/more.bin
)

step "write, append, rewrite and read every local-only file"
for f in "${local_files[@]}"; do
  echo "first $f" >"$f"
  echo "second" >>"$f"
  assert_file_content "$f" "first $f"$'\n'second "content of local-only $f"
  # A rewrite through a second open (several saves) must not create history either.
  printf 'third %s\n' "$f" >"$f"
  assert_file_content "$f" "third $f" "content of local-only $f after rewrite"
  assert_eq 1 "$(xattr "$f" user.ubiquity.local)" "user.ubiquity.local of $f"
done
echo control >control.txt
echo control2 >sub/control.txt
assert_eq 0 "$(xattr control.txt user.ubiquity.local)" "user.ubiquity.local of a normal file"

step "rename a local-only file within x.nosync and truncate one"
mv x.nosync/file.txt x.nosync/renamed.txt
truncate -s 3 x.nosync/renamed.txt
assert_eq 3 "$(stat -c %s x.nosync/renamed.txt)" "size of a truncated local-only file"

check_no_history() {
  local f hist
  for f in "$@"; do
    assert_missing "$MNT/.versions/$f" ".versions entry for local-only $f"
  done
  # And no history dir anywhere under .versions/ has a scratch name or lives under a
  # .nosync dir (catches histories kept under another spelling of the path). Only
  # directories are looked at: version names themselves may contain "~".
  hist=$(cd "$MNT/.versions" && find . -mindepth 1 -type d \( -name '*.swp' -o -name '*.swx' \
    -o -name '*~' -o -name 4913 -o -name '.#*' -o -name '.goutputstream-*' -o -name '*.nosync' \) -print)
  assert_eq "" "$hist" "history dirs for local-only paths under .versions/"
}

step "no history for any of them; the control files have one"
check_no_history "${local_files[@]}" x.nosync/renamed.txt x.nosync
assert_eq 1 "$(version_count control.txt)" "versions of control.txt"
assert_eq 1 "$(version_count sub/control.txt)" "versions of sub/control.txt"

step "moving a versioned file into x.nosync makes it local"
echo moved >tomove.txt
mv tomove.txt x.nosync/tomove.txt
assert_eq 1 "$(xattr x.nosync/tomove.txt user.ubiquity.local)" "user.ubiquity.local after moving into x.nosync"
echo changed >x.nosync/tomove.txt
assert_missing "$MNT/.versions/x.nosync" ".versions/x.nosync after writing inside it"

step "local-only files stay on this device across a remount, still without history"
remount
cd "$MNT"
assert_file_content a.swp "third a.swp" "a.swp after remount"
assert_file_content x.nosync/deeper/more.bin "third x.nosync/deeper/more.bin" "x.nosync/deeper/more.bin after remount"
assert_file_content x.nosync/renamed.txt "thi" "x.nosync/renamed.txt after remount"
check_no_history "${local_files[@]}"

pass
