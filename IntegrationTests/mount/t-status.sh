#!/usr/bin/env bash
# What `ubiquity status` and `ubiquity gc` tell a user is true at the moment they print:
# the counts right after two saves include both (the daemon commits its group-commit
# batch before the CLI reads the store), and a gc that frees nothing because of its grace
# period says how much the grace holds back and when a gc frees it. Then `df` and
# fallocate agree on the space a write can use: fallocate of exactly df's available bytes
# succeeds and one byte more fails with ENOSPC (min-free and the reserve are left out of
# both, as ext4 leaves out its reserved blocks). The last part needs a tmpfs (root).
# ubq-timeout: 120
set -euo pipefail
source "$(dirname "$0")/lib.sh"

mount_fresh status
cd "$MNT"

step "status right after two saves counts both"
echo hello >notes.txt
echo again >notes.txt
out=$(ubq status)
log "$out"
assert_contains "$out" "versions: 2" "ubiquity status right after two saves"
assert_contains "$out" "contents: 6 bytes here of 6 bytes; 1 files, all here" "ubiquity status right after two saves"
assert_contains "$out" "as of: " "ubiquity status names the moment its counts are from"

step "gc names what its grace period holds back; --grace 1s frees it"
head -c $((8 << 20)) /dev/urandom >gone.bin
rm gone.bin
# Uploaded first: versions not in the backing store yet are never pruned.
ubq sync "$MNT" >/dev/null
sleep 1.1 # older than --keep-within
ubq prune --keep-within 1s --keep-deleted-within 1s "$MNT" >/dev/null
out=$(ubq gc "$MNT")
log "$out"
assert_contains "$out" "deleted 0 (0 bytes freed)" "gc within the grace"
[[ $out =~ gc:\ ([0-9]+)\ chunks\ \(([0-9.]+)\ MiB\)\ unreferenced\ but\ written\ or\ used\ in\ the\ last\ 1h:\ a\ gc\ after\ [-0-9T:.]+Z\ frees\ them,\ or\ now\ with\ \`--grace\ 1s\` ]] ||
  fail "gc's report does not say what the grace holds back: [$out]"
held_mib=${BASH_REMATCH[2]}
awk -v m="$held_mib" 'BEGIN { exit !(m >= 8 && m < 9) }' || fail "the grace holds $held_mib MiB, not the 8 MiB of gone.bin"
sleep 1.1
out=$(ubq gc --grace 1s "$MNT")
log "$out"
[[ $out =~ deleted\ [1-9][0-9]*\ \(8\.[0-9]\ MiB\ freed\) ]] || fail "gc --grace 1s did not free gone.bin's 8 MiB: [$out]"
assert_not_contains "$out" "unreferenced but written" "gc --grace 1s: nothing held back"
unmount_it

step "df and fallocate agree: exactly the available bytes fit, one byte more is ENOSPC"
if [[ $EUID -ne 0 ]]; then
  [[ ${CI:-} != true ]] || fail "mounting a tmpfs needs root, and under CI=true that is a failure"
  skip "mounting a tmpfs needs root"
fi
mount_tmpfs 96m "$STORE"
MOUNT_ARGS=(--retention min-free=8M)
_ubq_mount
cd "$MNT"
touch big
sync
sleep 1
python3 - "$MNT" <<'PY'
import errno, os, sys
mnt = sys.argv[1]
st = os.statvfs(mnt)
available = st.f_bavail * st.f_bsize
raw = os.statvfs(os.path.join(mnt, "..", "store"))
raw_available = raw.f_bavail * raw.f_frsize
print(f"df: {available} bytes available on the mount; the store's tmpfs has {raw_available} free")
assert 0 < available < raw_available - 8 * 2**20 + st.f_bsize, "min-free is not left out of f_bavail"
fd = os.open(os.path.join(mnt, "big"), os.O_RDWR)
try:
    os.posix_fallocate(fd, 0, available + 1)
    sys.exit(f"fallocate of {available + 1} bytes (one more than df's available) succeeded")
except OSError as e:
    if e.errno != errno.ENOSPC:
        raise
os.posix_fallocate(fd, 0, available)
os.close(fd)
assert os.stat(os.path.join(mnt, "big")).st_size == available
print(f"fallocate: {available} bytes fit, {available + 1} are ENOSPC")
PY
rm big
pass
