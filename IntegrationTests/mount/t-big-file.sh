#!/usr/bin/env bash
# A 64 MiB file of random bytes written into the mount reads back bit-exact, also
# after `ubiquity unmount` and a new mount of the same store (then nothing can come
# from the kernel's page cache: it is a new superblock). A second write of the same
# bytes under another name, and an overwrite in the middle, are checked too.
# ubq-timeout: 120
set -euo pipefail
source "$(dirname "$0")/lib.sh"

step "64 MiB from /dev/urandom (outside the mount, as the reference)"
head -c $((64 << 20)) /dev/urandom >"$WORK/big.ref"
want=$(sha256sum <"$WORK/big.ref" | cut -d' ' -f1)

mount_fresh big

step "write it into the mount with dd (1 MiB writes) and with cp"
dd if="$WORK/big.ref" of="$MNT/big.bin" bs=1M status=none
cp "$WORK/big.ref" "$MNT/copy.bin"
assert_eq $((64 << 20)) "$(stat -c %s "$MNT/big.bin")" "size of big.bin"
assert_eq "$want" "$(sha256sum <"$MNT/big.bin" | cut -d' ' -f1)" "sha256 of big.bin"
assert_eq "$want" "$(sha256sum <"$MNT/copy.bin" | cut -d' ' -f1)" "sha256 of copy.bin"

step "overwrite 3 MiB in the middle of copy.bin (read-modify-write across chunks)"
head -c $((3 << 20)) /dev/urandom >"$WORK/patch"
dd if="$WORK/patch" of="$WORK/big.ref" bs=1M seek=20 conv=notrunc status=none
dd if="$WORK/patch" of="$MNT/copy.bin" bs=1M seek=20 conv=notrunc status=none
want2=$(sha256sum <"$WORK/big.ref" | cut -d' ' -f1)
assert_eq "$want2" "$(sha256sum <"$MNT/copy.bin" | cut -d' ' -f1)" "sha256 of copy.bin after the patch"
assert_eq 2 "$(version_count copy.bin)" "versions of copy.bin"

step "unmount and mount the same store again"
remount
assert_eq $((64 << 20)) "$(stat -c %s "$MNT/big.bin")" "size of big.bin after remount"
assert_eq "$want" "$(sha256sum <"$MNT/big.bin" | cut -d' ' -f1)" "sha256 of big.bin after remount"
assert_eq "$want2" "$(sha256sum <"$MNT/copy.bin" | cut -d' ' -f1)" "sha256 of copy.bin after remount"
# The first version of copy.bin is still the unpatched file.
first=$(version_names copy.bin | head -n1)
assert_eq "$want" "$(sha256sum <"$MNT/.versions/copy.bin/$first" | cut -d' ' -f1)" "sha256 of copy.bin's first version"

step "random-offset reads agree with the reference (no off-by-one at chunk edges)"
python3 - "$WORK/big.ref" "$MNT/copy.bin" <<'EOF'
import os, random, sys
ref, got = open(sys.argv[1], "rb"), open(sys.argv[2], "rb")
size = os.fstat(ref.fileno()).st_size
rng = random.Random(1234)
for _ in range(300):
    off = rng.randrange(size)
    n = rng.choice([1, 7, 4096, 65536, 300000])
    a = os.pread(ref.fileno(), n, off)
    b = os.pread(got.fileno(), n, off)
    if a != b:
        sys.exit("mismatch at offset %d length %d" % (off, n))
EOF

pass
