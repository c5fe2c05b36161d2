#!/usr/bin/env bash
# An idle mount wakes only for its sync poll (issue 26): its background loops (group
# commit, autosave, WAL checkpoints) sleep until they have work instead of polling every
# 0.1 s. Counts the context switches of every thread of the daemon (voluntary ones are
# its wake-ups) over 10 idle seconds, with sync on (a backing directory, polled every
# second), after a burst of work (a file saved, one held open and written, a directory
# made) has settled; then checks that the loops still do their work when woken: a file
# held open is autosaved after the idle interval, metadata commits, and the daemon stops
# at once on unmount.
# ubq-timeout: 120
# ubq-alone: counts the daemon's context switches, which a scenario beside it would add to
set -euo pipefail
source "$(dirname "$0")/lib.sh"

DEVICE=alpha
mount_fresh idle --poll 1
on_failure dump_sync_state

# pushed PATH SIZE: a record of PATH with SIZE bytes went out to the backing directory
# (seen there, not through the mount: a look at .versions/ would save the file first).
pushed() { cat "$BACKING"/log/* 2>/dev/null | grep -q " path=$1 size=$2 "; }

# switches PID: context switches of all the process's threads so far.
switches() {
  cat /proc/"$1"/task/*/status 2>/dev/null | awk '/^(voluntary|nonvoluntary)_ctxt_switches/ { n += $2 } END { print n }'
}

# A process that holds held.txt open for writing (a shell's `echo >&7` would close a
# dup of the descriptor after each write, which saves the file): writes a line, and
# another once $DATA/more exists, and closes once $DATA/done exists.
hold_open() {
  python3 - "$MNT/held.txt" "$DATA" <<'PY' &
import os, sys, time
path, data = sys.argv[1], sys.argv[2]
fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
os.write(fd, b"written, held open\n")
while not os.path.exists(data + "/more"): time.sleep(0.05)
os.write(fd, b"more\n")
while not os.path.exists(data + "/done"): time.sleep(0.05)
os.close(fd)
PY
  HOLDER=$!
}

step "a little work: a file saved, a directory made, a file written and held open"
echo saved >"$MNT/saved.txt"
mkdir "$MNT/dir"
hold_open
# The write rang the autosave loop; it saves the file after 10 s without writes.
wait_for -t 30 "held.txt autosaved while open, and pushed" pushed held.txt 19
sync_dev "$MNT"
sleep 3 # the last checkpoint and autosave runs

step "10 idle seconds (held.txt still open, nothing unsaved)"
before=$(switches "$DAEMON_PID")
sleep 10
after=$(switches "$DAEMON_PID")
woken=$((after - before))
log "context switches of the daemon in 10 idle seconds: $woken"
# The sync poll (every 0.5 s while active: about 20 cycles, each a few thread
# hand-offs) and maintenance (every 10 s) only. Before (loops polling every 0.1 s) it
# was over 400.
((woken <= 150)) || fail "an idle mount switched context $woken times in 10 s (bound 150)"

step "woken loops still work"
echo "after the quiet" >"$MNT/later.txt"
assert_file_content "$MNT/later.txt" "after the quiet" "later.txt right after the quiet"
touch "$DATA/more"
wait_for -t 30 "held.txt autosaved again while open, and pushed" pushed held.txt 24
touch "$DATA/done"
wait "$HOLDER"
rmdir "$MNT/dir"
start=$(now_ms)
unmount_it
elapsed=$(($(now_ms) - start))
log "unmount took $elapsed ms"
((elapsed < 5000)) || fail "unmount took $elapsed ms: a loop did not stop when told"
pass
