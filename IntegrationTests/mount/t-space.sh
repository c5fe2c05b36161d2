#!/usr/bin/env bash
# A store on a small filesystem (a 48 MiB tmpfs) filled to ENOSPC: the writer gets a
# clear ENOSPC, files saved before stay intact and the mount keeps serving; space
# pressure then prunes history oldest-first (the log names what it dropped), so saving
# works again without the user deleting anything; unmount and fsck are clean. gc's grace
# under pressure is 5 s here instead of a minute (UBQ_TEST_PRESSURE_GRACE).
# ubq-timeout: 300
set -euo pipefail
source "$(dirname "$0")/lib.sh"

if [[ $EUID -ne 0 ]]; then
  [[ ${CI:-} != true ]] || fail "mounting a tmpfs needs root, and under CI=true that is a failure"
  skip "mounting a tmpfs needs root"
fi
export UBQ_TEST_PRESSURE_GRACE=5
mount_fresh space
unmount_it
mount_tmpfs 48m "$STORE"
_ubq_mount
cd "$MNT"

step "files saved before the disk fills"
echo "small and kept" >keep.txt
head -c $((1 << 20)) /dev/urandom >keep.bin
sum_keep=$(sha256sum <keep.bin)

step "4 MiB saves of big.bin until the store's filesystem is full: ENOSPC, not damage"
err=""
for i in $(seq 30); do
  if ! err=$(head -c $((4 << 20)) /dev/urandom 2>&1 >big.bin); then break; fi
  err=""
done
log "save $i: ${err:-no error}"
assert_contains "$err" "No space left on device" "the error of the save that did not fit"
assert_file_content keep.txt "small and kept" "keep.txt on a full disk"
assert_eq "$sum_keep" "$(sha256sum <keep.bin)" "keep.bin on a full disk"
ls -la . >/dev/null
# Regression: every append the full disk refused started a new pack (a pack per retry).
packs=$(find "$STORE/chunks/packs" -name '*.pack' | wc -l)
log "$packs packs"
((packs <= 8)) || fail "$packs packs after the disk filled: failed appends left a pack each"

step "space pressure prunes big.bin's history oldest-first; saving works again"
wait_for -t 60 "the daemon to relieve the space pressure" grep -q "space pressure: dropped [0-9]* version" "$STORE/daemon.log"
grep "space pressure" "$STORE/daemon.log" | head -5
mkdir -p "$WORK"
head -c $((4 << 20)) /dev/urandom >"$WORK/big"
# gc under pressure keeps chunks used within its grace (a long commit may be reusing
# them): the space comes back a grace after the saves.
saved=0
for _ in $(seq 30); do
  if cp "$WORK/big" big.bin 2>/dev/null; then saved=1; break; fi
  sleep 5
done
((saved)) || fail "big.bin could not be saved 150 s after the disk filled"
assert_same_file "$WORK/big" big.bin "big.bin saved after the relief"
assert_eq "$sum_keep" "$(sha256sum <keep.bin)" "keep.bin after the relief"
assert_contains "$(cat "$STORE/daemon.log")" "space pressure: dropped big.bin version of" "the log names each dropped version"

step "once gc's grace has passed, the dropped versions' space comes back"
wait_for -t 120 "gc after the grace" grep -q "space pressure: gc after the grace freed [1-9]" "$STORE/daemon.log"
grep "gc after the grace" "$STORE/daemon.log"

step "unmount and fsck are clean"
cd /
unmount_it
"$UBIQUITY" fsck --store "$STORE" >/dev/null || fail "fsck after filling the disk"
pass
