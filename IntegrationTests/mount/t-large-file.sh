#!/usr/bin/env bash
# Files past 4 GiB (64-bit offsets everywhere): a sparse 5 GiB file with 1 MiB of
# random data written at 4.5 GiB and a few bytes straddling the 4 GiB boundary reads
# back exactly, holes read as zeros, the size is exact; the same after a remount.
# Only ~1 MiB of data is written, so this must stay fast.
# ubq-timeout: 150
set -euo pipefail
source "$(dirname "$0")/lib.sh"

readonly GiB=$((1 << 30)) MiB=$((1 << 20))
size=$((5 * GiB))
at=$((4 * GiB + GiB / 2))   # 4.5 GiB
edge=$((4 * GiB - 2048))      # 4 KiB straddling 2^32

head -c "$MiB" /dev/urandom >"$WORK/payload"
head -c 4096 /dev/urandom >"$WORK/edge"
mount_fresh large
f="$MNT/sparse.bin"

# Writing ~1 MiB must not cost a pass over 5 GiB of holes: a save that hashes every
# hole byte blocks the writer's close() for a minute or more.
SAVE_LIMIT=30

step "truncate -s 5G"
bounded "$SAVE_LIMIT" "truncate -s 5G" truncate -s 5G "$f"
assert_eq "$size" "$(stat -c %s "$f")" "size after truncate -s 5G"

step "1 MiB of random data at 4.5 GiB (dd seek, conv=notrunc)"
bounded "$SAVE_LIMIT" "dd of 1 MiB at 4.5 GiB (incl. the save at close)" \
  dd if="$WORK/payload" of="$f" bs="$MiB" seek=$((at / MiB)) conv=notrunc status=none
assert_eq "$size" "$(stat -c %s "$f")" "size after the write at 4.5 GiB"

step "4 KiB straddling the 4 GiB boundary"
bounded "$SAVE_LIMIT" "dd of 4 KiB at 4 GiB - 2 KiB" \
  dd if="$WORK/edge" of="$f" bs=2048 seek=$((edge / 2048)) conv=notrunc status=none

# check WHEN: the data reads back at the right places, holes are zeros, size exact.
check() {
  local when=$1
  assert_eq "$size" "$(stat -c %s "$f")" "size $when"
  dd if="$f" of="$WORK/back" bs="$MiB" skip=$((at / MiB)) count=1 status=none
  assert_same_file "$WORK/payload" "$WORK/back" "1 MiB at 4.5 GiB $when"
  python3 - "$f" "$WORK/edge" "$edge" "$at" "$size" <<'EOF' || fail "offset checks $when failed"
import os, sys
f, edge_ref, edge, at, size = sys.argv[1], open(sys.argv[2], "rb").read(), *map(int, sys.argv[3:])
fd = os.open(f, os.O_RDONLY)
def at_(off, n): return os.pread(fd, n, off)
if at_(edge, 4096) != edge_ref:
    sys.exit("the 4 KiB across 2^32 read wrong")
# Holes: start, just below the edge data, between edge and payload, after payload.
for off in (0, 1 << 30, edge - 4096, edge + 4096, at - 4096, at + (1 << 20), size - 4096):
    if at_(off, 4096) != b"\0" * 4096:
        sys.exit("hole at offset %d is not zeros" % off)
# A 32-bit wrap would put the payload at 0.5 GiB: that place must be zeros.
if at_(at - (1 << 32), 4096) != b"\0" * 4096:
    sys.exit("data showed up at offset %d (4.5 GiB mod 2^32)" % (at - (1 << 32)))
# Reads at and past EOF return nothing.
if at_(size, 10) != b"" or at_(size + (1 << 20), 10) != b"":
    sys.exit("read at/after EOF returned bytes")
if len(at_(size - 10, 100)) != 10:
    sys.exit("short read across EOF has the wrong length")
EOF
}

step "read back"
check "before remount"

step "unmount, mount again, read back"
remount
check "after remount"

pass
