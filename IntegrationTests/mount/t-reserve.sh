#!/usr/bin/env bash
# fallocate sets disk space aside for real (issue 45), on a store on a 128 MiB tmpfs: the
# space is taken from the store's filesystem at the call (df shows it used, through the
# mount and on the store's disk), a second fallocate past what is left fails at once,
# writes into the reserved range succeed after another program filled the disk, and the
# reservation survives unmount and kill -9 and goes with truncate, punch and unlink.
# ubq-timeout: 150
set -euo pipefail
source "$(dirname "$0")/lib.sh"
require_cmd fallocate "apt-get install -y util-linux"

if [[ $EUID -ne 0 ]]; then
  [[ ${CI:-} != true ]] || fail "mounting a tmpfs needs root, and under CI=true that is a failure"
  skip "mounting a tmpfs needs root"
fi
mount_fresh reserve
unmount_it
mount_tmpfs 128m "$STORE"
_ubq_mount
cd "$MNT"
M=$((1 << 20))
mkdir -p "$WORK"
avail() { df -B1 --output=avail "$1" | tail -n 1 | tr -d ' '; }
# held: the bytes the store's reservation file holds on its disk.
held() { if [[ -e $STORE/reservation ]]; then echo $(($(stat -c %b "$STORE/reservation") * 512)); else echo 0; fi; }
# need BYTES: what the store sets aside for a file with BYTES of reserved holes (their
# pack headers and its save's metadata: 1/256 more and 64 KiB; SpaceReservation.need).
need() { if (($1 > 0)); then echo $(($1 + $1 / 256 + 65536)); else echo 0; fi; }
# assert_near EXPECTED GOT SLACK WHAT: |EXPECTED - GOT| <= SLACK.
assert_near() {
  local d=$(($1 - $2))
  ((d < 0)) && d=$((-d))
  ((d <= $3)) || fail "$4: expected about $1 (within $3), got $2"
}

step "fallocate takes the space from the store's disk at once; df shows it used"
before=$(avail "$MNT")
store_before=$(avail "$STORE")
fallocate -l 24M db
assert_near "$(need $((24 * M)))" "$(held)" 0 "the reservation file after fallocate -l 24M"
assert_near $((before - 24 * M)) "$(avail "$MNT")" $((2 * M)) "df of the mount after the reservation"
assert_near $((store_before - 24 * M)) "$(avail "$STORE")" $((2 * M)) "df of the store's disk after the reservation"

step "two fallocates of 60 % of the free space: the first succeeds, the second fails at once"
free=$(avail "$MNT")
part=$((free * 6 / 10 / 4096 * 4096))
assert_errno ok "fd = os.open('$MNT/a60', os.O_RDWR | os.O_CREAT); os.posix_fallocate(fd, 0, $part)" "the first fallocate of 60 %"
assert_errno ENOSPC "fd = os.open('$MNT/b60', os.O_RDWR | os.O_CREAT); os.posix_fallocate(fd, 0, $part)" "the second fallocate of 60 %"
assert_eq 0 "$(stat -c %s b60)" "a refused fallocate changes nothing"
rm a60 b60
wait_for "a60's reservation given back" bash -c "(( \$(df -B1 --output=avail '$MNT' | tail -n 1) > $free - $((2 * M)) ))"

step "another program fills the store's disk; writes into the reserved range still succeed"
head -c $((24 * M)) /dev/urandom >"$WORK/db"
# Written beside the store on its filesystem, as any program on that disk may.
err=$(head -c 1G /dev/zero 2>&1 >"$STORE/outside.fill") || true
assert_contains "$err" "No space left on device" "the outside filler"
log "free on the store's disk: $(avail "$STORE") bytes; reserved: $(held)"
dd if="$WORK/db" of=db bs=64K conv=notrunc,fsync status=none || { tail -n 20 "$STORE/daemon.log"; fail "a write into the reserved range failed on a full disk"; }
cmp "$WORK/db" db || fail "db differs from what was written into its reserve"
assert_eq 0 "$(held)" "the reservation after its range was written"
rm "$STORE/outside.fill"

step "a reservation survives unmount and kill -9, and goes with truncate, punch and unlink"
fallocate -l 16M keep
touch db2
fallocate -n -l 8M db2
cd /
remount
both=$(($(need $((16 * M))) + $(need $((8 * M)))))
assert_near "$both" "$(held)" 0 "the reservation after a remount"
crash_daemon
_ubq_mount
assert_near "$both" "$(held)" 0 "the reservation after kill -9"
cd "$MNT"
fallocate -p -o 0 -l 4M keep
assert_near $(($(need $((12 * M))) + $(need $((8 * M))))) "$(held)" 0 "after punching 4M of keep"
truncate -s 8M keep
assert_near $(($(need $((4 * M))) + $(need $((8 * M))))) "$(held)" 0 "after truncating keep to 8M (4M-8M still reserved)"
rm keep db2
wait_for "the reservation given back after the unlinks" bash -c "(( \$(stat -c %b '$STORE/reservation') == 0 ))"
cmp "$WORK/db" db || fail "db after the remounts"

step "unmount and fsck are clean"
cd /
unmount_it
"$UBIQUITY" fsck --store "$STORE" >/dev/null || fail "fsck after the reservations"
pass
