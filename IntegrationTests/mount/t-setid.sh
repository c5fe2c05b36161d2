#!/usr/bin/env bash
# Writes cost one request each, and set-id bits still go as the kernel's rules say.
#
# The daemon negotiates FUSE_HANDLE_KILLPRIV_V2 (KernelChannel.swift): the kernel stops
# asking for security.capability before every write (a second round trip per write),
# and leaves clearing set-user-ID and set-group-ID to the filesystem, flagged per request
# when the caller lacks CAP_FSETID. Checks both: strace counts the requests the daemon
# reads during 200 writes, and writes, O_TRUNC opens and truncations by an unprivileged
# user clear the bits (set-group-ID only when group-executable) while root's keep them.
# ubq-timeout: 120
set -euo pipefail
source "$(dirname "$0")/lib.sh"
require_cmd strace "apt-get install strace"
require_cmd setpriv "apt-get install util-linux"
[[ $(id -u) == 0 ]] || fail "needs root (writes as another user through allow_other)"

mount_fresh setid -o allow_other
chmod 755 "$ROOT"
cd "$MNT"
chmod 777 .
nobody() { setpriv --reuid=65534 --regid=65534 --clear-groups "$@"; }

step "200 writes are 200 requests, with no GETXATTR of security.capability between them"
head -c 1M /dev/zero >rw
count_requests python3 - <<'EOF'
import os
fd = os.open("rw", os.O_WRONLY)
for i in range(200):
    os.pwrite(fd, b"w" * 4096, (i * 7919 % 256) * 4096)
os.close(fd)
EOF
writes=$(request_count 16)
getxattrs=$(request_count 22)
(( writes >= 200 )) || fail "strace saw $writes WRITE requests for 200 writes (opcode:count $REQUESTS)"
(( getxattrs <= 1 )) || fail "strace saw $getxattrs GETXATTR requests during 200 writes, at most the first write's expected (opcode:count $REQUESTS)"
rm rw

step "a write by root keeps set-id bits; an unprivileged one clears them"
echo a >f
chmod 6777 f
echo b >>f
assert_eq 6777 "$(stat -c %a f)" "mode after root's write"
nobody sh -c 'echo c >>f'
assert_eq 777 "$(stat -c %a f)" "mode after an unprivileged write (the kernel's cached mode)"
assert_file_content f "$(printf 'a\nb\nc')" "content after the writes"
echo g >g
chmod 2767 g
nobody sh -c 'echo c >>g'
assert_eq 2767 "$(stat -c %a g)" "set-group-ID without group execute stays (FUSE_HANDLE_KILLPRIV_V2's rule)"
chmod 2777 g
nobody sh -c 'echo c >>g'
assert_eq 777 "$(stat -c %a g)" "set-group-ID with group execute goes"

step "O_TRUNC opens and truncations"
echo t >t
chmod 6777 t
: >t
assert_eq 6777 "$(stat -c %a t)" "mode after root's O_TRUNC open"
truncate -s 0 t
assert_eq 6777 "$(stat -c %a t)" "mode after root's truncate"
nobody sh -c ': >t'
assert_eq 777 "$(stat -c %a t)" "mode after an unprivileged O_TRUNC open"
chmod 6777 t
nobody truncate -s 5 t
assert_eq 777 "$(stat -c %a t)" "mode after an unprivileged truncate"
assert_eq 5 "$(stat -c %s t)" "size after the truncate"

step "chown clears set-id bits, chown(f, -1, -1) too (the kernel sends a SETATTR that sets nothing)"
echo o >o
chmod 6755 o
python3 -c 'import os; os.chown("o", -1, -1)'
assert_eq 755 "$(stat -c %a o)" "mode after chown(o, -1, -1)"
chmod 6745 o
chown 0:0 o
assert_eq 2745 "$(stat -c %a o)" "mode after chown 0:0 (set-group-ID without group execute stays, as on ext4)"

step "the cleared modes are the store's: they survive a remount"
cd /
remount
assert_eq 777 "$(stat -c %a "$MNT/f")" "f's mode after remount"
assert_eq 777 "$(stat -c %a "$MNT/g")" "g's mode after remount"
assert_eq 777 "$(stat -c %a "$MNT/t")" "t's mode after remount"
assert_eq 2745 "$(stat -c %a "$MNT/o")" "o's mode after remount"
pass
