#!/usr/bin/env bash
# The kernel remembers that a name is not there (issue 44): a build, `git status` or a
# shell's PATH search asks for missing names again and again, and only the first of
# them reaches the daemon. Counted, not timed: the read(2) calls of the daemon (one per
# FUSE request) over 300 stats of a missing name. A name that appears is seen at once:
# made here (the kernel makes it itself), or made on another device (sync tells the
# kernel to drop the absence it remembered, in the root and in a directory), including a
# name looked up while beta's change was on its way. The virtual views and the
# key-value door are not remembered absent (their names come and go with versions).
# ubq-timeout: 120
set -euo pipefail
source "$(dirname "$0")/lib.sh"

DEVICE=alpha
mount_fresh negative --poll 0.2
A=$MNT
mount_device beta --poll 0.2
B=$(mnt_of beta)
on_failure dump_sync_state

# reads PID: read(2) calls of the process so far (its FUSE loop reads one per request).
reads() { awk '/^syscr/ { print $2 }' /proc/"$1"/io; }

# at_most LIMIT COUNT WHAT
at_most() {
  log "    $3: $2"
  (($2 <= $1)) || fail "$3: $2, more than $1"
}

# stat_missing PATH N: N failing stats of PATH (in one process: a shell's own cost is
# not counted, only the daemon's).
stat_missing() {
  python3 - "$1" "$2" <<'EOF'
import os, sys
for _ in range(int(sys.argv[2])):
    try:
        os.stat(sys.argv[1])
        sys.exit(f"{sys.argv[1]} exists")
    except FileNotFoundError:
        pass
EOF
}

step "300 stats of a missing name: the daemon hears of it once"
mkdir "$A/dir"
stat_missing "$A/dir/nothing.h" 1
before=$(reads "$DAEMON_PID")
stat_missing "$A/dir/nothing.h" 300
after=$(reads "$DAEMON_PID")
# The sync poll (every 0.2 s) reads files of its own: a few dozen calls at most.
at_most 60 $((after - before)) "read(2) calls of the daemon over 300 stats of a missing name"

step "a control: 300 stats of a name that is there cost about as little"
echo there >"$A/dir/there.h"
stat "$A/dir/there.h" >/dev/null
before=$(reads "$DAEMON_PID")
python3 -c 'import os, sys
for _ in range(300): os.stat(sys.argv[1])' "$A/dir/there.h"
after=$(reads "$DAEMON_PID")
at_most 60 $((after - before)) "read(2) calls of the daemon over 300 stats of a file"

step "a name made here after its absence was remembered is there at once"
stat_missing "$A/dir/made.txt" 3
echo made >"$A/dir/made.txt"
assert_file_content "$A/dir/made.txt" made "dir/made.txt, made after three failed stats"

step "names beta makes show on alpha, where their absence was remembered"
stat_missing "$A/from-beta.txt" 3
stat_missing "$A/dir/from-beta.txt" 3
stat_missing "$A/newdir" 3
wait_exists "$B/dir" "dir on beta"
echo root-level >"$B/from-beta.txt"
echo in-dir >"$B/dir/from-beta.txt"
mkdir "$B/newdir"
echo nested >"$B/newdir/inner.txt"
wait_content "$A/from-beta.txt" root-level "from-beta.txt on alpha"
wait_content "$A/dir/from-beta.txt" in-dir "dir/from-beta.txt on alpha"
wait_content "$A/newdir/inner.txt" nested "newdir/inner.txt on alpha"

step "a name looked up over and over while beta makes it shows within the poll"
(
  end=$((SECONDS + 20))
  while ((SECONDS < end)) && [[ ! -e $A/racing.txt ]]; do :; done
) &
looker=$!
sleep 0.3
echo racing >"$B/racing.txt"
wait_content -t 10 "$A/racing.txt" racing "racing.txt on alpha, looked up while it came"
wait "$looker"

step "the virtual views are not remembered absent"
assert_missing "$A/.versions/late.txt" ".versions/late.txt before late.txt"
echo late >"$A/late.txt"
wait_exists "$A/.versions/late.txt" ".versions/late.txt after late.txt was saved"

pass
