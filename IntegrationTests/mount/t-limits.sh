#!/usr/bin/env bash
# What used to take the daemon down (issue: "One system call must never take the
# filesystem down"), each through a real mount with the daemon checked alive after it:
# a 1 PiB sparse file (`truncate -s 1P`: memory grew without bound), ftruncate to 2^63-1
# (a Swift overflow trap), the documented 2^62-byte limit at every entry point,
# SEEK_DATA/SEEK_HOLE and `cp --sparse`, block and character device nodes, names of 255
# and 256 bytes, names that are not UTF-8, reserved names in subdirectories, times out
# of range; then a remount serves the same, and fsck is clean.
# ubq-timeout: 120
set -euo pipefail
source "$(dirname "$0")/lib.sh"

mount_fresh limits
cd "$MNT"
alive() {
  kill -0 "$DAEMON_PID" 2>/dev/null || fail "the daemon (pid $DAEMON_PID) is gone"
  is_mounted "$MNT" || fail "$MNT is not mounted any more"
}
P=1125899906842624 # 1 PiB

step "truncate -s 1P; echo x >> f; head -c1: works, costs bytes"
truncate -s 1P sparse
echo x >>sparse
assert_eq $((P + 2)) "$(stat -c %s sparse)" "size of the sparse file"
assert_eq 0 "$(head -c 1 sparse | od -An -tu1 | tr -d ' ')" "its first byte"
assert_eq x "$(tail -c 2 sparse | head -c 1)" "its last byte"
assert_eq 1 "$(stat -c %b sparse)" "512-byte blocks it reports (only what was written)"
rss=$(awk '/VmRSS/ { print $2 }' "/proc/$DAEMON_PID/status")
((rss < 512 * 1024)) || fail "daemon RSS $rss KiB after a 1 PiB file"
alive
stored=$(du -sk "$STORE/chunks" | cut -f1)
((stored < 8192)) || fail "the store grew by $stored KiB for a 1 PiB sparse file"

step "SEEK_DATA / SEEK_HOLE report the hole; cp --sparse=always copies it as one"
assert_eq "$P $((P + 2)) 0" "$(python3 -c "
import os
fd = os.open('sparse', os.O_RDONLY)
print(os.lseek(fd, 0, os.SEEK_DATA), os.lseek(fd, $P, os.SEEK_HOLE), os.lseek(fd, 0, os.SEEK_HOLE))")" "SEEK_DATA from 0, SEEK_HOLE from the data, SEEK_HOLE from 0"
assert_errno ENXIO "fd = os.open('sparse', os.O_RDONLY); os.lseek(fd, $P + 2, os.SEEK_DATA)" "SEEK_DATA at the end"
truncate -s 64M mid
printf 'data' | dd of=mid bs=1 seek=$((32 << 20)) conv=notrunc status=none
cp --sparse=always mid mid-copy
assert_same_file mid mid-copy "cp --sparse=always of a 64 MiB sparse file"
(($(stat -c %b mid-copy) < 64)) || fail "the copy is not sparse: $(stat -c %b mid-copy) blocks"

step "the maximum file size, 2^62 bytes: EFBIG beyond it, never a crash"
assert_errno EFBIG "fd = os.open('big', os.O_RDWR | os.O_CREAT); os.ftruncate(fd, 2**63 - 1)" "ftruncate(2^63-1)"
alive
assert_errno EFBIG "fd = os.open('big', os.O_RDWR | os.O_CREAT); os.ftruncate(fd, 2**62 + 1)" "ftruncate(2^62+1)"
assert_errno ok "fd = os.open('big', os.O_RDWR | os.O_CREAT); os.ftruncate(fd, 2**62)" "ftruncate(2^62)"
# A write across the limit is short, as on ext4 at its own limit: the bytes before it land.
assert_eq 1 "$(python3 -c "import os; fd = os.open('big', os.O_RDWR); print(os.pwrite(fd, b'ab', 2**62 - 1))")" "pwrite of 2 bytes across 2^62"
assert_errno EFBIG "fd = os.open('big', os.O_RDWR); os.pwrite(fd, b'ab', 2**62)" "pwrite at 2^62"
assert_errno EFBIG "fd = os.open('big', os.O_RDWR); os.posix_fallocate(fd, 2**62 - 10, 100)" "fallocate across 2^62"
assert_errno "EFBIG|EINVAL" "fd = os.open('big', os.O_RDWR); os.pwrite(fd, b'ab', 2**63 - 2)" "pwrite at 2^63-2"
assert_eq "" "$(python3 -c "import os; fd = os.open('big', os.O_RDONLY); print(os.pread(fd, 1 << 20, 2**63 - 100).decode())")" "pread near 2^63"
assert_errno ok "fd = os.open('big', os.O_RDWR); os.pwrite(fd, b'end', 2**62 - 3)" "pwrite ending exactly at 2^62"
assert_eq end "$(tail -c 3 big)" "the last bytes of a 4 EiB file"
assert_errno ok "os.utime('big', (1e18, -1e18))" "utime far outside 64-bit nanoseconds (clamped)"
alive

step "block and character device nodes, as on ext4"
mknod blk b 1 2
mknod chr c 1 3
assert_eq "block special file 1,2" "$(stat -c '%F %t,%T' blk)" "mknod b"
assert_eq "character special file 1,3" "$(stat -c '%F %t,%T' chr)" "mknod c"

step "names: 255 bytes work, 256 give ENAMETOOLONG; any byte but / and NUL"
n255=$(printf 'n%.0s' {1..255})
n256=$(printf 'n%.0s' {1..256})
echo ok >"$n255"
assert_file_content "$n255" ok "a 255-byte name"
for call in "open('$n256')" "os.stat('$n256')" "os.mkdir('$n256')" "os.symlink('x', '$n256')" \
  "os.link('$n255', '$n256')" "os.rename('$n255', '$n256')" "os.mknod('$n256')"; do
  assert_errno ENAMETOOLONG "$call" "$call"
done
odd=$(printf 'odd-\xff\xfe-\x01-\nline')
echo bytes >"$odd"
assert_file_content "$odd" bytes "a name with invalid UTF-8, a control character and a newline"
python3 -c "import os; assert b'odd-\xff\xfe-\x01-\nline' in os.listdir(b'.')" || fail "readdir does not return the name's bytes"
ln -s "$(printf 'target-\xff')" oddlink
assert_eq "$(printf 'target-\xff')" "$(readlink oddlink)" "a symlink target that is not UTF-8"
mkdir sub
echo a >sub/.versions
echo b >sub/.conflicts
assert_file_content sub/.versions a "sub/.versions is an ordinary file"
assert_errno EEXIST "os.mkdir('.versions')" "mkdir .versions at the root"

step "after a remount: the same sizes, holes, nodes and names; fsck clean"
remount
cd "$MNT"
assert_eq $((P + 2)) "$(stat -c %s sparse)" "size of the sparse file after remount"
assert_eq 1 "$(stat -c %b sparse)" "blocks of the sparse file after remount"
assert_eq x "$(tail -c 2 sparse | head -c 1)" "its last byte after remount"
assert_eq "block special file 1,2" "$(stat -c '%F %t,%T' blk)" "mknod b after remount"
assert_file_content "$odd" bytes "the not-UTF-8 name after remount"
assert_file_content sub/.versions a "sub/.versions after remount"
cd /
out=$("$UBIQUITY" fsck --store "$STORE" 2>&1) || fail "fsck after the limits: $out"
pass
