#!/usr/bin/env bash
# A mount that is its owner's alone (no allow_other, as a login mount is) checks
# permissions in the daemon, not in the kernel: without default_permissions the kernel
# does not fetch a directory's attributes again after every change in it, one request
# less per create, unlink and rename (Permissions.swift says when and why). Checks:
# - the mount options: default_permissions only where the kernel checks;
# - `rm -rf` of 200 files costs 200 UNLINK requests and no GETATTR between them;
# - as an unprivileged user on their own mount, a script of permission cases answers as
#   on ext4, the names the kernel cached under a directory that loses search permission
#   (present and absent) included;
# - a sticky directory's rule, which the kernel leaves to the daemon then;
# - the random differential test as that user (t-differential.py --user).
# ubq-timeout: 240
set -euo pipefail
source "$(dirname "$0")/lib.sh"
require_cmd strace "apt-get install strace"
require_cmd setpriv "apt-get install util-linux"
[[ $(id -u) == 0 ]] || fail "needs root (mounts as another user)"

# Linux 6.16 brought the notice that expires every cached name (FUSE_NOTIFY_INC_EPOCH):
# before it the kernel keeps checking.
IFS=. read -r major minor _ < <(uname -r)
if (( major > 6 || (major == 6 && minor >= 16) )); then daemon_checks=1; else daemon_checks=0; fi

step "mount options: the daemon checks on its owner's mount (Linux $(uname -r)), the kernel on a shared one"
mount_fresh own
options=$(findmnt -no OPTIONS "$MNT")
if ((daemon_checks)); then
  assert_not_contains "$options" default_permissions "options of a mount without allow_other"
else
  assert_contains "$options" default_permissions "options before Linux 6.16"
fi
mount_device shared -o allow_other
assert_contains "$(findmnt -no OPTIONS "$MNT_shared")" default_permissions "options of a mount with allow_other"
unmount_device shared

step "rm -rf of 200 files: 200 UNLINK requests, no GETATTR of the directory between them"
mkdir "$MNT/tree"
for i in $(seq 200); do : >"$MNT/tree/f$i"; done
count_requests rm -rf "$MNT/tree"
unlinks=$(request_count 10)
getattrs=$(request_count 3)
(( unlinks == 200 )) || fail "strace saw $unlinks UNLINK requests for 200 files (opcode:count $REQUESTS)"
if ((daemon_checks)); then
  (( getattrs <= 2 )) || fail "strace saw $getattrs GETATTR requests during rm -rf of 200 files, at most 2 expected (opcode:count $REQUESTS)"
fi
unmount_it

step "as uid 65534 on their own mount: the same answers as ext4"
UBQ_USER=65534
mount_fresh user --poll 0.2
as_user() { setpriv --reuid=65534 --regid=65534 --clear-groups env HOME=/nonexistent "$@"; }
mkdir -p "$WORK/ext4"
chown 65534:65534 "$WORK/ext4"
# One line per case: what it tried and what came of it (errno names, not messages).
cat >"$WORK/cases.py" <<'PY'
import errno, os, subprocess, sys
os.chdir(sys.argv[1])
def case(what, fn):
    try:
        r = fn()
        print(what, "ok" if r is None else r)
    except OSError as e:
        print(what, errno.errorcode[e.errno])
def write(path, data="x"):
    with open(path, "a") as f:
        f.write(data)
def read(path):
    with open(path) as f:
        return f.read().strip()
case("mkdir d", lambda: os.mkdir("d", 0o755))
case("write d/f", lambda: write("d/f", "hi\n"))
case("read d/f", lambda: read("d/f"))
case("stat d/missing", lambda: os.stat("d/missing") and None)
# d loses search: what the kernel cached under it, present and absent, must close too.
case("chmod d 600", lambda: os.chmod("d", 0o600))
case("read d/f", lambda: read("d/f"))
case("stat d/f", lambda: os.stat("d/f") and None)
case("stat d/missing", lambda: os.stat("d/missing") and None)
case("list d", lambda: sorted(os.listdir("d")))
case("chdir d", lambda: os.chdir("d"))
case("access d X_OK", lambda: os.access("d", os.X_OK))
case("chmod d 700", lambda: os.chmod("d", 0o700))
case("read d/f", lambda: read("d/f"))
case("access d X_OK", lambda: os.access("d", os.X_OK))
# A directory without read: searchable, not listable; without write: nothing created,
# removed or renamed in it.
case("chmod d 300", lambda: os.chmod("d", 0o300))
case("list d", lambda: sorted(os.listdir("d")))
case("read d/f", lambda: read("d/f"))
case("chmod d 500", lambda: os.chmod("d", 0o500))
case("create d/g", lambda: write("d/g"))
case("mkdir d/e", lambda: os.mkdir("d/e"))
case("symlink d/s", lambda: os.symlink("f", "d/s"))
case("link d/h", lambda: os.link("d/f", "d/h"))
case("unlink d/f", lambda: os.unlink("d/f"))
case("rename d/f d/g", lambda: os.rename("d/f", "d/g"))
case("rename d/f top", lambda: os.rename("d/f", "top"))
case("chmod d 700", lambda: os.chmod("d", 0o700))
# A directory without write moves within its parent but not to another one (its ".."
# would change).
case("mkdir d/sub", lambda: os.mkdir("d/sub"))
case("mkdir other", lambda: os.mkdir("other"))
case("chmod d/sub 500", lambda: os.chmod("d/sub", 0o500))
case("rename d/sub d/sub2", lambda: os.rename("d/sub", "d/sub2"))
case("rename d/sub2 other/sub", lambda: os.rename("d/sub2", "other/sub"))
case("chmod d/sub2 700", lambda: os.chmod("d/sub2", 0o700))
case("rename d/sub2 other/sub", lambda: os.rename("d/sub2", "other/sub"))
# Files: each access mode against the owner's bits, whatever group and others have.
case("chmod d/f 077", lambda: os.chmod("d/f", 0o077))
case("read d/f", lambda: read("d/f"))
case("access d/f R_OK", lambda: os.access("d/f", os.R_OK))
case("chmod d/f 400", lambda: os.chmod("d/f", 0o400))
case("read d/f", lambda: read("d/f"))
case("append d/f", lambda: write("d/f"))
case("truncate d/f", lambda: os.truncate("d/f", 0))
case("open d/f O_RDONLY|O_TRUNC", lambda: os.close(os.open("d/f", os.O_RDONLY | os.O_TRUNC)))
case("touch d/f", lambda: os.utime("d/f"))
case("utime d/f 2001", lambda: os.utime("d/f", (978307200, 978307200)))
case("chmod d/f 200", lambda: os.chmod("d/f", 0o200))
case("read d/f", lambda: read("d/f"))
case("append d/f", lambda: write("d/f", "more\n"))
case("setxattr d/f user.a", lambda: os.setxattr("d/f", "user.a", b"1"))
case("getxattr d/f user.a", lambda: os.getxattr("d/f", "user.a"))
case("chmod d/f 600", lambda: os.chmod("d/f", 0o600))
case("getxattr d/f user.a", lambda: os.getxattr("d/f", "user.a"))
case("chmod d/f 400", lambda: os.chmod("d/f", 0o400))
case("setxattr d/f user.b", lambda: os.setxattr("d/f", "user.b", b"2"))
# Owners and groups: only root gives a file away.
case("chown d/f 0", lambda: os.chown("d/f", 0, -1))
case("chown d/f 65534", lambda: os.chown("d/f", 65534, -1))
case("chgrp d/f 0", lambda: os.chown("d/f", -1, 0))
case("chgrp d/f 65534", lambda: os.chown("d/f", -1, 65534))
# Programs run only with the owner's execute bit.
case("write d/run", lambda: write("d/run", "#!/bin/sh\necho ran\n"))
case("chmod d/run 644", lambda: os.chmod("d/run", 0o644))
case("exec d/run", lambda: subprocess.run(["./d/run"], capture_output=True, text=True).stdout.strip())
case("chmod d/run 011", lambda: os.chmod("d/run", 0o011))
case("exec d/run", lambda: subprocess.run(["./d/run"], capture_output=True, text=True).stdout.strip())
case("chmod d/run 755", lambda: os.chmod("d/run", 0o755))
case("exec d/run", lambda: subprocess.run(["./d/run"], capture_output=True, text=True).stdout.strip())
PY
ext4=$(as_user /usr/bin/python3 "$WORK/cases.py" "$WORK/ext4" 2>&1)
ours=$(as_user /usr/bin/python3 "$WORK/cases.py" "$MNT" 2>&1)
if [[ $ours != "$ext4" ]]; then
  fail "as uid 65534, the mount and ext4 answer differently (- ext4, + mount):
$(diff <(echo "$ext4") <(echo "$ours"))"
fi
log "  $(grep -c . <<<"$ours") cases agree; $(grep -c -E 'EACCES|EPERM' <<<"$ours") of them refused"

step "a directory another device takes search permission from closes here too, cached names included"
mount_device peer --poll 0.2
as_user mkdir "$MNT/shared"
as_user sh -c "echo hi >'$MNT/shared/f'"
wait_eq hi "shared/f on the peer" as_user cat "$MNT_peer/shared/f"
as_user cat "$MNT/shared/f" >/dev/null # the kernel here now caches the name
as_user chmod 600 "$MNT_peer/shared"
wait_eq 600 "shared's mode here" as_user stat -c %a "$MNT/shared"
if out=$(as_user cat "$MNT/shared/f" 2>&1); then
  fail "shared/f still reads ($out) after another device took search permission from shared/"
fi
assert_contains "$out" "Permission denied" "reading shared/f"
unmount_device peer
unmount_it

step "a sticky directory keeps others' entries from the mount's owner (the kernel leaves that rule to the daemon)"
UBQ_USER=
mount_fresh sticky
mkdir "$MNT/t"
chmod 1777 "$MNT/t"
echo x >"$MNT/t/roots"
unmount_it
chown -R 65534:65534 "$ROOT" # the store is uid 65534's now; its nodes still say root
UBQ_USER=65534
_ubq_mount
if out=$(as_user rm -f "$MNT/t/roots" 2>&1); then fail "uid 65534 removed root's file from root's sticky directory"; fi
assert_contains "$out" "Operation not permitted" "removing root's file from a sticky directory"
if out=$(as_user mv "$MNT/t/roots" "$MNT/t/moved" 2>&1); then fail "uid 65534 renamed root's file in root's sticky directory"; fi
as_user sh -c "echo y >'$MNT/t/mine' && mv '$MNT/t/mine' '$MNT/t/mine2' && rm '$MNT/t/mine2'"
unmount_it

step "random operations as uid 65534 against ext4 (t-differential.py --user)"
python3 "$(dirname "$0")/t-differential.py" --user 65534 --ops 3000
pass
