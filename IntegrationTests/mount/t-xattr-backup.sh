#!/usr/bin/env bash
# Backups with xattrs round-trip (issue 22): status attributes (user.ubiquity.*) are
# readable by name but not listed, so rsync -aX, cp -a and tar --xattrs copy a tree out of
# the mount without them and back in (into the same and into a second mount) without an
# error, keeping the user's own attributes. removexattr changes ctime, as setxattr does.
# ubq-timeout: 120
set -euo pipefail
source "$(dirname "$0")/lib.sh"
require_cmd rsync "apt-get install -y rsync"
require_cmd setfattr "apt-get install -y attr"

mount_fresh xb
mkdir -p "$MNT/tree/sub"
echo one >"$MNT/tree/a.txt"
echo two >"$MNT/tree/sub/b.txt"
printf '\x01\x02\x04\x08\x10\x20\x40\x80' >"$MNT/tree/p.tinypix"
setfattr -n user.color -v blue "$MNT/tree/a.txt"
setfattr -n user.tag -v "x y" "$MNT/tree/sub/b.txt"
setfattr -n user.dir -v d "$MNT/tree/sub"

step "status attributes are readable by name, not listed"
[[ $(xattr "$MNT/tree/a.txt" user.ubiquity.version) =~ ^[0-9a-f]{32}$ ]] || fail "user.ubiquity.version by name: [$(xattr "$MNT/tree/a.txt" user.ubiquity.version)]"
assert_eq 0 "$(xattr "$MNT/tree/a.txt" user.ubiquity.conflicts)" "user.ubiquity.conflicts by name"
listed=$(getfattr --absolute-names -d -m - "$MNT/tree/a.txt" "$MNT/tree/p.tinypix" "$MNT" 2>&1)
assert_not_contains "$listed" "user.ubiquity" "listxattr of a file, a tinypix and the root"
assert_contains "$listed" 'user.color="blue"' "the user's own attribute is listed"
status=$("$UBIQUITY" status "$MNT/tree/a.txt")
assert_contains "$status" "version: " "ubiquity status FILE (asks by name)"
assert_contains "$status" "uploaded: " "ubiquity status FILE"
assert_contains "$("$UBIQUITY" status "$MNT/tree/p.tinypix")" "raw: 0102040810204080" "ubiquity status of a tinypix"

# check_copy DIR WHAT: DIR holds the user's attributes and no user.ubiquity.* attribute.
check_copy() {
  local dump
  dump=$(cd "$1" && getfattr -R -d -m - . 2>/dev/null)
  assert_not_contains "$dump" "user.ubiquity" "$2: status attributes copied"
  assert_eq blue "$(xattr "$1/a.txt" user.color)" "$2: user.color"
  assert_eq "x y" "$(xattr "$1/sub/b.txt" user.tag)" "$2: user.tag"
  assert_eq d "$(xattr "$1/sub" user.dir)" "$2: user.dir on a directory"
  assert_eq one "$(cat "$1/a.txt")" "$2: content"
}

step "rsync -aX out of the mount and back into it, and into a second mount"
rsync -aX "$MNT/tree/" "$DATA/rsync/" || fail "rsync -aX out of the mount exited $?"
check_copy "$DATA/rsync" "rsync -aX backup"
echo changed >"$MNT/tree/a.txt"
rsync -aX "$DATA/rsync/" "$MNT/tree/" || fail "rsync -aX back into the mount exited $? (status attributes in the backup?)"
check_copy "$MNT/tree" "restored by rsync -aX"
mount_device second
rsync -aX "$DATA/rsync/" "$MNT_second/restored/" || fail "rsync -aX into a second mount exited $?"
check_copy "$MNT_second/restored" "rsync -aX into a second mount"

step "cp -a out and back in"
cp -a "$MNT/tree" "$DATA/cp" || fail "cp -a out of the mount failed"
check_copy "$DATA/cp" "cp -a backup"
err=$(cp -a "$DATA/cp" "$MNT/cp-restored" 2>&1) || fail "cp -a into the mount failed: $err"
assert_eq "" "$err" "cp -a into the mount: no warnings"
check_copy "$MNT/cp-restored" "restored by cp -a"

step "tar --xattrs out and back in"
tar --xattrs --xattrs-include='*' -C "$MNT/tree" -cf "$DATA/t.tar" . || fail "tar --xattrs -c failed"
err=$(tar --xattrs --xattrs-include='*' -tvf "$DATA/t.tar" 2>&1)
mkdir "$MNT/tar-restored"
err=$(tar --xattrs --xattrs-include='*' -C "$MNT/tar-restored" -xf "$DATA/t.tar" 2>&1) || fail "tar --xattrs -x into the mount failed: $err"
assert_eq "" "$err" "tar -x into the mount: no warnings"
check_copy "$MNT/tar-restored" "restored by tar --xattrs"
mkdir "$DATA/tar-out"
tar --xattrs --xattrs-include='*' -C "$DATA/tar-out" -xf "$DATA/t.tar"
check_copy "$DATA/tar-out" "tar --xattrs backup"

step "setting a status attribute is still refused (EPERM); other namespaces unsupported"
assert_errno EPERM "os.setxattr('$MNT/tree/a.txt', 'user.ubiquity.version', b'x')" "setxattr of a status attribute"
assert_errno EPERM "os.removexattr('$MNT/tree/a.txt', 'user.ubiquity.version')" "removexattr of a status attribute"

step "removexattr changes ctime (as setxattr does)"
f="$MNT/tree/sub/b.txt"
c0=$(stat -c %Z.%z "$f")
sleep 1.1
setfattr -n user.k -v v "$f"
c1=$(stat -c %Z.%z "$f")
assert_ne "$c0" "$c1" "ctime after setxattr"
sleep 1.1
setfattr -x user.k "$f"
c2=$(stat -c %Z.%z "$f")
assert_ne "$c1" "$c2" "ctime after removexattr"
remount
assert_eq "$c2" "$(stat -c %Z.%z "$f")" "ctime after removexattr, after a remount"
pass
