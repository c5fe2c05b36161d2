#!/usr/bin/env bash
# fio with data verification through the mount: a 4k random read/write job and a
# sequential write job, both with crc32c verify (verify_fatal): no verify errors, no
# I/O errors. The files written by fio are then re-verified after a remount by a
# verify-only pass, so what the store kept is checked, not just the page cache.
# ubq-timeout: 150
set -euo pipefail
source "$(dirname "$0")/lib.sh"
require_cmd fio "apt-get install -y fio"

mount_fresh fio
mkdir "$MNT/fio"

# run_fio NAME ARGS...: fio must exit 0 and report err=0 and no verify failure.
run_fio() {
  local name=$1 out rc=0
  shift
  out=$(cd "$WORK" && timeout 120 fio --name="$name" --directory="$MNT/fio" \
    --output-format=normal --verify=crc32c --verify_fatal=1 "$@" 2>&1) || rc=$?
  printf '%s\n' "$out" >"$WORK/fio-$name.out"
  if ((rc != 0)); then
    fail "fio $name exited $rc: $(tail -n 30 "$WORK/fio-$name.out")"
  fi
  if grep -qiE 'verify(:| failed)|bad magic|bad header|crc32c.*(wanted|got)' <<<"$out"; then
    fail "fio $name reported verify errors: $(grep -iE 'verify|bad|crc' <<<"$out" | head -n 10)"
  fi
  grep -q 'err= 0' <<<"$out" || fail "fio $name: no 'err= 0' in its report: $(tail -n 30 <<<"$out")"
  log "    $(grep -E '^ +(READ|WRITE):' <<<"$out" | sed 's/^ *//' | tr '\n' ' ')"
}

step "random read/write 4k, 32 MiB, verify crc32c"
run_fio v --rw=randrw --bs=4k --size=32M --do_verify=1 --ioengine=psync --randrepeat=1 --randseed=42

step "sequential write 1 MiB blocks, 64 MiB, verify crc32c"
run_fio seq --rw=write --bs=1M --size=64M --do_verify=1 --ioengine=psync

step "mixed block sizes with fsync every 32 writes, verify"
run_fio mixed --rw=randwrite --bsrange=512-64k --size=16M --fsync=32 --do_verify=1 --ioengine=psync --randseed=7

step "remount, then verify the sequential job's file again (read-only verify pass)"
remount
run_fio seq --rw=write --bs=1M --size=64M --verify_only=1 --ioengine=psync

pass
