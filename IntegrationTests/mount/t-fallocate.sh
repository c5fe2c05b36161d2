#!/usr/bin/env bash
# fallocate as Linux means it (issue 22), through fallocate(1) and python: the space an
# allocating call needs is checked (ENOSPC past the store's free space or its size-limit),
# allocated ranges count in st_blocks (past the end too, with KEEP_SIZE) and survive a
# remount, PUNCH_HOLE makes zeros and frees, ZERO_RANGE makes zeros that stay allocated,
# COLLAPSE/INSERT/UNSHARE get EOPNOTSUPP, and every change is a version at the next save.
# ubq-timeout: 90
set -euo pipefail
source "$(dirname "$0")/lib.sh"
require_cmd fallocate "apt-get install -y util-linux"

mount_fresh falloc --retention size-limit=200M
cd "$MNT"
M=$((1 << 20))
blocks() { stat -c %b "$1"; }
# assert_blocks FILE MIB WHAT: st_blocks is MIB MiB (in 512-byte units).
assert_blocks() { assert_eq $(($2 * 2048)) "$(blocks "$1")" "$3: st_blocks of $1"; }

step "mode 0 reserves and extends; KEEP_SIZE reserves past the end"
fallocate -l 10M f
assert_eq $((10 * M)) "$(stat -c %s f)" "size after fallocate -l 10M"
assert_blocks f 10 "fallocate -l 10M"
fallocate -n -l 20M f
assert_eq $((10 * M)) "$(stat -c %s f)" "size after fallocate -n -l 20M"
assert_blocks f 20 "KEEP_SIZE to 20M"
assert_eq "$(head -c 10M /dev/zero | sha256sum)" "$(sha256sum <f)" "a reserved range reads as zeros"
touch g
fallocate -n -o 30M -l 1M g
assert_eq 0 "$(stat -c %s g)" "size of g (KEEP_SIZE past the end)"
assert_blocks g 1 "KEEP_SIZE past the end of an empty file"

step "writing into the reserve does not count twice"
head -c 10M /dev/urandom >"$DATA/r"
dd if="$DATA/r" of=f bs=1M conv=notrunc status=none
assert_blocks f 20 "10M written into a 20M reserve"

step "PUNCH_HOLE: zeros, fewer blocks, a new version; ZERO_RANGE: zeros, still allocated"
v0=$(version_count f)
fallocate -p -o 1M -l 2M f
assert_blocks f 18 "2M punched"
assert_eq "$(head -c 2M /dev/zero | sha256sum)" "$(dd if=f bs=1M skip=1 count=2 status=none | sha256sum)" "the punched range"
assert_eq "$(dd if="$DATA/r" bs=1M skip=3 count=7 status=none | sha256sum)" "$(dd if=f bs=1M skip=3 count=7 status=none | sha256sum)" "bytes after the hole"
assert_eq $((v0 + 1)) "$(version_count f)" "versions after the punch"
fallocate -z -o 4M -l 1M f
assert_blocks f 18 "1M zeroed (stays allocated)"
assert_eq "$(head -c 1M /dev/zero | sha256sum)" "$(dd if=f bs=1M skip=4 count=1 status=none | sha256sum)" "the zeroed range"
fallocate -z -o 12M -l 1M f
assert_eq $((13 * M)) "$(stat -c %s f)" "ZERO_RANGE without KEEP_SIZE extends"
assert_eq $((1 * M)) "$(python3 -c "import os; print(os.lseek(os.open('f', os.O_RDONLY), 0, os.SEEK_HOLE))")" "SEEK_HOLE finds the punched range"
expected=$(sha256sum <f)

step "allocation and contents survive a remount"
remount
cd "$MNT"
assert_eq "$expected" "$(sha256sum <f)" "content after a remount"
assert_blocks f 18 "after a remount"
assert_blocks g 1 "g after a remount"
truncate -s 5M f
assert_blocks f 3 "truncated to 5M (data 0-1M and 3-4M, zeroed 4-5M allocated)"

step "a preallocated file written from its start (fio's default, dd conv=notrunc): its bytes, then a hole"
head -c $((3 << 20)) /dev/urandom >"$DATA/pre.src"
fallocate -l 8M pre
dd if="$DATA/pre.src" of=pre bs=1M conv=notrunc,fsync status=none
assert_eq $((8 << 20)) "$(stat -c %s pre)" "size of pre after dd conv=notrunc"
cmp -n $((3 << 20)) "$DATA/pre.src" pre || fail "pre: the written 3 MiB differ"
cmp -i $((3 << 20)):0 -n $((5 << 20)) pre /dev/zero || fail "pre: the unwritten 5 MiB are not zeros"
assert_eq "$((3 << 20))" "$(python3 -c "import os; fd = os.open('pre', os.O_RDONLY); print(os.lseek(fd, 0, os.SEEK_HOLE))")" "SEEK_HOLE of pre"
truncate -s 6M sparse
dd if="$DATA/pre.src" of=sparse bs=256K conv=notrunc status=none
cmp -n $((3 << 20)) "$DATA/pre.src" sparse || fail "sparse: the written 3 MiB differ"
assert_eq $((6 << 20)) "$(stat -c %s sparse)" "size of sparse after dd conv=notrunc"
rm -f pre sparse

step "ENOSPC: past the size-limit, and past the disk's free space"
assert_errno ENOSPC "fd = os.open('$MNT/big', os.O_RDWR | os.O_CREAT); os.posix_fallocate(fd, 0, 300 << 20)" "fallocate of 300M with size-limit 200M"
free=$(df -B1 --output=avail "$STORE" | tail -n 1)
assert_errno ENOSPC "fd = os.open('$MNT/huge', os.O_RDWR | os.O_CREAT); os.posix_fallocate(fd, 0, $free + (1 << 30))" "fallocate of the free space + 1 GiB"
assert_eq 0 "$(stat -c %s huge)" "a refused fallocate changes nothing"
fallocate -l 100M ok || fail "fallocate of 100M within the size-limit failed"

step "unsupported modes: EOPNOTSUPP; hostile arguments: an errno, never a trap"
for flags in -c -i; do
  out=$(fallocate "$flags" -o 0 -l 1M ok 2>&1) && fail "fallocate $flags succeeded"
  assert_contains "$out" "Operation not supported" "fallocate $flags"
done
assert_errno "EOPNOTSUPP|ENOTSUP" "fd = os.open('$MNT/ok', os.O_RDWR); import ctypes; libc = ctypes.CDLL(None, use_errno=True); libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]; r = libc.fallocate(fd, 0x40, 0, 4096); e = ctypes.get_errno(); os.close(fd); (r == 0) or (_ for _ in ()).throw(OSError(e, os.strerror(e)))" "UNSHARE_RANGE"
for args in "0x3 -1 4096" "0x3 0 0" "0x10 4611686018427387900 4096" "0x3 4611686018427387900 4096" "0x1 0 -5"; do
  read -r mode off len <<<"$args"
  got=$(py_errno "import ctypes; libc = ctypes.CDLL(None, use_errno=True); libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]; fd = os.open('$MNT/ok', os.O_RDWR); r = libc.fallocate(fd, $mode, $off, $len); e = ctypes.get_errno(); os.close(fd); (r == 0) or (_ for _ in ()).throw(OSError(e, os.strerror(e)))")
  [[ $got =~ ^(EINVAL|EFBIG|ENOSPC|ok)$ ]] || fail "fallocate mode $mode offset $off length $len: $got"
done
assert_daemon_alive "$DEVICE"
cd /
pass
