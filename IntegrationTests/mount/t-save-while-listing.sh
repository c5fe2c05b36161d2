#!/usr/bin/env bash
# Saving a large file while other programs list and stat its directory must not
# hang either side (a save holds the file's content while it commits; a listing
# asks every open file for its size: taking those two in opposite orders deadlocks
# the daemon). Writers save 48 MiB files; listers run `ls -l`, stat and getfattr in
# the same directory meanwhile. Everything must finish, and the data be right.
# ubq-timeout: 120
set -euo pipefail
source "$(dirname "$0")/lib.sh"

mount_fresh listing
mkdir "$MNT/dir"
head -c $((48 << 20)) /dev/urandom >"$WORK/ref"
echo small >"$MNT/dir/small.txt"

step "writer: three saves of 48 MiB each (each close commits); listers meanwhile"
(
  for i in 1 2 3; do
    cp "$WORK/ref" "$MNT/dir/big$i.bin"
  done
  echo finished >"$WORK/writer.done"
) >"$WORK/writer.log" 2>&1 &
writer=$!

lister() {
  local n=0
  while [[ ! -e $WORK/writer.done ]] && ((n < 5000)); do
    ls -l "$MNT/dir" >/dev/null
    stat "$MNT/dir"/* >/dev/null 2>&1 || true
    getfattr -d -m user.ubiquity "$MNT/dir"/big*.bin >/dev/null 2>&1 || true
    n=$((n + 1))
  done
  echo "$n" >"$WORK/lister.$1.count"
}
lister 1 >"$WORK/lister1.log" 2>&1 &
l1=$!
lister 2 >"$WORK/lister2.log" 2>&1 &
l2=$!

# Poll instead of `wait`: a process stuck in a request to a hung daemon cannot be
# waited for (nor killed by TERM); cleanup kills the daemon, which unsticks it.
deadline=$((SECONDS + 30))
while ((SECONDS < deadline)); do
  if ! kill -0 "$writer" 2>/dev/null && ! kill -0 "$l1" 2>/dev/null && ! kill -0 "$l2" 2>/dev/null; then
    break
  fi
  sleep 0.2
done
stuck=""
for p in "$writer" "$l1" "$l2"; do
  if kill -0 "$p" 2>/dev/null; then
    stuck+="$(ps -o pid=,stat=,wchan:25=,args= -p "$p" --ppid "$p" 2>/dev/null || true)"$'\n'
  fi
done
if [[ -n ${stuck//$'\n'/} ]]; then
  fail "writer/listers still running after 30 s (daemon deadlock?); stuck processes:
$stuck"
fi
wait "$writer" || fail "writer failed: $(cat "$WORK/writer.log")"
wait "$l1" || fail "lister 1 failed: $(cat "$WORK/lister1.log")"
wait "$l2" || fail "lister 2 failed: $(cat "$WORK/lister2.log")"
log "listing rounds during the saves: $(cat "$WORK"/lister.*.count | tr '\n' ' ')"

step "the saved files are right and each has one version"
for i in 1 2 3; do
  assert_same_file "$WORK/ref" "$MNT/dir/big$i.bin" "big$i.bin"
  assert_eq 1 "$(version_count "dir/big$i.bin")" "versions of big$i.bin"
done
assert_file_content "$MNT/dir/small.txt" small "small.txt"

pass
