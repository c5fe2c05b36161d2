#!/usr/bin/env bash
# POSIX basics through the mount, with exact errno values where POSIX fixes them:
# mkdir/rmdir, rename rules, mv -n, symlinks, hard links, fifos, chmod/chown,
# utimens, truncate, unlink while open, xattrs, statfs, the hidden control dirs and
# the read-only .versions/ view.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
require_cmd getfattr "apt-get install attr"
require_cmd setfattr "apt-get install attr"

mount_fresh posix
cd "$MNT"

step "mkdir / rmdir"
mkdir -p d1/d2/d3
[[ -d d1/d2/d3 ]] || fail "mkdir -p d1/d2/d3 made no directory"
echo x >d1/d2/file
assert_errno ENOTEMPTY 'os.rmdir("d1/d2")' "rmdir of a non-empty directory"
assert_errno EEXIST 'os.mkdir("d1")' "mkdir of an existing name"
assert_errno ENOTDIR 'os.rmdir("d1/d2/file")' "rmdir of a file"
assert_errno EISDIR 'os.unlink("d1/d2/d3")' "unlink of a directory"
assert_errno ENOENT 'os.mkdir("nope/sub")' "mkdir under a missing parent"
rmdir d1/d2/d3
rm d1/d2/file
rmdir d1/d2
assert_missing d1/d2 "d1/d2 after rmdir"
assert_eq 2 "$(stat -c %h d1)" "link count of an empty directory"
mkdir d1/a d1/b
assert_eq 4 "$(stat -c %h d1)" "link count of a directory with two subdirectories"

step "rename rules"
echo one >r1
echo two >r2
mv r1 r2
assert_file_content r2 one "target after rename over an existing file"
assert_missing r1 "source after rename"
mkdir emptydir fulldir
echo q >fulldir/q
assert_errno EISDIR 'os.rename("r2", "emptydir")' "rename of a file over a directory"
assert_errno ENOTDIR 'os.rename("emptydir", "r2")' "rename of a directory over a file"
assert_errno 'ENOTEMPTY|EEXIST' 'os.rename("emptydir", "fulldir")' "rename of a directory over a non-empty directory"
assert_errno EINVAL 'os.rename("fulldir", "fulldir/inside")' "rename of a directory into itself"
assert_errno ENOENT 'os.rename("missing", "x")' "rename of a missing name"
mkdir emptydir2
python3 -c 'import os; os.rename("emptydir2", "emptydir")'
assert_missing emptydir2 "source dir after rename over an empty directory"
[[ -d emptydir ]] || fail "emptydir should still be a directory after rename over it"
mv fulldir d1/moved
assert_file_content d1/moved/q q "file inside a renamed directory"
# rename onto itself and a hard link of itself is a no-op.
python3 -c 'import os; os.rename("r2", "r2")'
assert_file_content r2 one "file renamed onto itself"
# Renaming a file that is open keeps the open fd working.
python3 - <<'EOF'
import os
fd = os.open("openmv", os.O_CREAT | os.O_RDWR, 0o644)
os.write(fd, b"abc")
os.rename("openmv", "d1/openmv2")
os.write(fd, b"def")
os.close(fd)
assert open("d1/openmv2").read() == "abcdef", open("d1/openmv2").read()
EOF
assert_missing openmv "old name of a file renamed while open"

step "mv -n does not overwrite"
echo keep >n1
echo other >n2
mv -n n2 n1 || true
assert_file_content n1 keep "target of mv -n"
assert_file_content n2 other "source of mv -n"
# RENAME_NOREPLACE is what mv -n may use; it must fail with EEXIST, not overwrite.
python3 - <<'EOF'
import ctypes, errno, os
libc = ctypes.CDLL(None, use_errno=True)
AT_FDCWD, RENAME_NOREPLACE = -100, 1
r = libc.renameat2(AT_FDCWD, b"n2", AT_FDCWD, b"n1", RENAME_NOREPLACE)
e = ctypes.get_errno()
if r == 0:
    raise SystemExit("renameat2(RENAME_NOREPLACE) over an existing file succeeded")
if e not in (errno.EEXIST, errno.EINVAL, errno.ENOSYS):
    raise SystemExit("renameat2(RENAME_NOREPLACE): %s" % errno.errorcode[e])
EOF
assert_file_content n1 keep "target after renameat2(RENAME_NOREPLACE)"

step "symlink / readlink"
ln -s n1 sl
ln -s ../n1 d1/upl
ln -s /nonexistent/target dangling
assert_eq n1 "$(readlink sl)" "readlink sl"
assert_file_content sl keep "read through a symlink"
assert_file_content d1/upl keep "read through a relative ../ symlink"
assert_eq /nonexistent/target "$(readlink dangling)" "readlink of a dangling link"
assert_eq "symbolic link" "$(stat -c %F sl)" "file type of sl"
assert_eq 2 "$(stat -c %s sl)" "size of a symlink (length of its target)"
rm sl
assert_missing sl "symlink after rm"
assert_file_content n1 keep "target after removing the link"

step "hard links"
echo hard >h1
ln h1 h2
assert_eq "$(stat -c %i h1)" "$(stat -c %i h2)" "inode numbers of two hard links"
assert_eq 2 "$(stat -c %h h1)" "link count (stat -c %h) of h1"
echo more >>h2
assert_file_content h1 $'hard\nmore' "h1 after appending through h2"
ln h1 d1/h3
assert_eq 3 "$(stat -c %h h2)" "link count after a third link"
rm h1
assert_eq 2 "$(stat -c %h h2)" "link count after removing one name"
assert_file_content d1/h3 $'hard\nmore' "content through the remaining link"
assert_errno EPERM 'os.link("d1", "dlink")' "hard link to a directory"

step "mkfifo"
mkfifo ff
assert_eq fifo "$(stat -c %F ff)" "file type of a fifo"
(echo through-fifo >ff) &
writer=$!
got=$(timeout 10 cat ff) || fail "reading the fifo failed or hung"
wait "$writer"
assert_eq through-fifo "$got" "data through the fifo"

step "chmod / chown"
echo p >perm
chmod 640 perm
assert_eq 640 "$(stat -c %a perm)" "mode after chmod 640"
chmod u+x,g-r perm
assert_eq 700 "$(stat -c %a perm)" "mode after chmod u+x,g-r"
chmod 4755 perm
assert_eq 4755 "$(stat -c %a perm)" "mode after chmod 4755 (setuid)"
chown 1000:1000 perm
assert_eq 1000:1000 "$(stat -c %u:%g perm)" "owner after chown 1000:1000"
chown 0:0 perm
assert_eq 0:0 "$(stat -c %u:%g perm)" "owner after chown back to 0:0"
chmod 750 d1
assert_eq 750 "$(stat -c %a d1)" "directory mode after chmod"

step "utimens: touch -d, -a, -m"
echo t >tm
touch -d '2001-02-03 04:05:06.789' tm
assert_eq "981173106.789000000 981173106.789000000" "$(stat -c '%.9X %.9Y' tm)" "atime mtime after touch -d"
# Before 1970 (negative times) must round-trip too: tv_nsec stays in 0..<1e9 (a bug the
# differential test found, seed 1018991498).
touch -d '1949-06-08 12:00:00.25' tm
assert_eq "1949-06-08 12:00:00.250000000" "$(stat -c '%y' tm | cut -c1-29)" "mtime before 1970"
touch -d '2001-02-03 04:05:06.789' tm
touch -a -d '2010-01-01 00:00:00' tm
assert_eq "1262304000 981173106" "$(stat -c '%X %Y' tm)" "atime mtime after touch -a"
touch -m -d '2011-01-01 00:00:00' tm
assert_eq "1262304000 1293840000" "$(stat -c '%X %Y' tm)" "atime mtime after touch -m"
touch -a -m -d '2012-01-01 00:00:00' tm
assert_eq "1325376000 1325376000" "$(stat -c '%X %Y' tm)" "atime mtime after touch -a -m"
before=$(date +%s)
touch tm
mt=$(stat -c %Y tm)
((mt >= before - 1 && mt <= before + 5)) || fail "touch without -d: mtime $mt, expected about $before"
touch -h -d '2003-03-03 00:00:00' dangling
assert_eq 1046649600 "$(stat -c %Y dangling)" "mtime of a symlink after touch -h"
touch -d '2004-04-04 00:00:00' d1
assert_eq 1081036800 "$(stat -c %Y d1)" "mtime of a directory after touch -d"
# Times survive a save: a chmod or a write must not reset atime to something odd.
touch -d '2005-05-05 00:00:00' tm
remount
cd "$MNT"
assert_eq 1115251200 "$(stat -c %Y tm)" "mtime after remount"

step "truncate grow / shrink"
printf 'hello world' >./tr
truncate -s 100 tr
assert_eq 100 "$(stat -c %s tr)" "size after growing"
python3 -c '
d = open("tr", "rb").read()
assert d == b"hello world" + b"\0" * 89, d
'
truncate -s 5 tr
assert_eq 5 "$(stat -c %s tr)" "size after shrinking"
assert_file_content tr hello "content after shrinking"
truncate -s 0 tr
assert_eq 0 "$(stat -c %s tr)" "size after truncate -s 0"
# Shrink then grow: the cut bytes must come back as zeros, not as old data.
printf 'ABCDEFGHIJ' >tr2
truncate -s 3 tr2
truncate -s 8 tr2
python3 -c '
d = open("tr2", "rb").read()
assert d == b"ABC" + b"\0" * 5, d
'

step "unlink while open"
python3 - <<'EOF'
import os
fd = os.open("uo", os.O_CREAT | os.O_RDWR, 0o644)
os.write(fd, b"before\n")
os.fsync(fd)
os.unlink("uo")
assert not os.path.exists("uo"), "name still there after unlink"
assert "uo" not in os.listdir("."), "name still listed after unlink"
os.write(fd, b"after\n")
os.lseek(fd, 0, os.SEEK_SET)
data = os.read(fd, 100)
assert data == b"before\nafter\n", data
st = os.fstat(fd)
assert st.st_nlink == 0, st.st_nlink
assert st.st_size == 13, st.st_size
os.ftruncate(fd, 3)
os.lseek(fd, 0, os.SEEK_SET)
assert os.read(fd, 100) == b"bef"
os.close(fd)
assert not os.path.exists("uo"), "name came back after close"
# And a new file with the same name is a new, empty file.
open("uo", "w").close()
assert os.path.getsize("uo") == 0
EOF

step "xattrs"
echo x >xa
setfattr -n user.x -v y xa
assert_eq y "$(getfattr --only-values -n user.x xa)" "user.x after setfattr"
setfattr -n user.bin -v 0x00ff10 xa
assert_eq 0x00ff10 "$(getfattr -e hex -n user.bin xa | sed -n 's/^user.bin=//p')" "binary xattr value (hex)"
assert_contains "$(getfattr -d xa)" 'user.x="y"' "getfattr -d"
setfattr -n user.x -v changed xa
assert_eq changed "$(getfattr --only-values -n user.x xa)" "user.x after replacing it"
setfattr -x user.x xa
assert_not_contains "$(getfattr -d xa)" "user.x=" "getfattr -d after removing user.x"
assert_errno ENODATA 'os.getxattr("xa", "user.x")' "getxattr of a removed attribute"
assert_errno ENODATA 'os.removexattr("xa", "user.never")' "removexattr of a missing attribute"
assert_errno EEXIST 'os.setxattr("xa", "user.bin", b"1", os.XATTR_CREATE)' "setxattr XATTR_CREATE of an existing one"
assert_errno ENODATA 'os.setxattr("xa", "user.new", b"1", os.XATTR_REPLACE)' "setxattr XATTR_REPLACE of a missing one"
assert_errno 'EPERM|EACCES|EROFS|ENOTSUP' 'os.setxattr("xa", "user.ubiquity.version", b"x")' "setting user.ubiquity.version"
assert_errno 'EPERM|EACCES|EROFS|ENOTSUP' 'os.setxattr("xa", "user.ubiquity.made-up", b"x")' "setting user.ubiquity.made-up"
assert_errno 'EPERM|EACCES|EROFS|ENOTSUP' 'os.removexattr("xa", "user.ubiquity.version")' "removing user.ubiquity.version"
assert_ne "" "$(xattr xa user.ubiquity.version)" "user.ubiquity.version is still there"
setfattr -n user.onlink -v v d1
assert_eq v "$(getfattr --only-values -n user.onlink d1)" "xattr on a directory"
setfattr -n user.keep -v kept xa
remount
cd "$MNT"
assert_eq kept "$(getfattr --only-values -n user.keep xa)" "user xattr after remount"

step "statfs"
df "$MNT" >/dev/null || fail "df $MNT failed"
df -i "$MNT" >/dev/null || fail "df -i $MNT failed"
python3 - "$MNT" <<'EOF'
import os, sys
s = os.statvfs(sys.argv[1])
assert s.f_bsize > 0 and s.f_blocks > 0, s
assert 0 < s.f_namemax <= 4096, s
EOF

step "the root listing hides .versions (and .conflicts while empty); both work by name; .versions is read-only"
listing=$(ls -la "$MNT")
assert_not_contains "$listing" " .versions" "ls -la of the mount root"
assert_not_contains "$listing" " .conflicts" "ls -la of the mount root without conflicts"
assert_eq "" "$(find "$MNT" -name '*.versions*' -o -path '*/.versions/*' | head -n 3)" "find of the mount (the live tree only)"
[[ -d .versions && -d .conflicts ]] || fail ".versions and .conflicts must be directories when named"
v=$(version_names n1 | head -n1)
[[ -n $v ]] || fail "n1 has no versions"
ro='EROFS|EACCES|EPERM'
assert_errno "$ro" "open('.versions/n1/$v', 'w')" "open for writing of a version"
assert_errno "$ro" "open('.versions/n1/$v', 'a')" "open for appending of a version"
assert_errno "$ro" "os.truncate('.versions/n1/$v', 0)" "truncate of a version"
assert_errno "$ro" "os.unlink('.versions/n1/$v')" "unlink of a version"
assert_errno "$ro" "os.rename('.versions/n1/$v', '.versions/n1/x')" "rename inside .versions"
assert_errno "$ro|EXDEV" "os.rename('.versions/n1/$v', 'stolen')" "rename out of .versions"
assert_errno "$ro" "os.chmod('.versions/n1/$v', 0o666)" "chmod of a version"
assert_errno "$ro" "os.setxattr('.versions/n1/$v', 'user.a', b'b')" "setxattr on a version"
assert_errno "$ro|EEXIST" "os.mkdir('.versions/newdir')" "mkdir in .versions"
assert_errno "$ro" "open('.versions/n1/new', 'w')" "create in .versions/n1"
assert_errno "$ro|EXDEV" "os.rename('n2', '.versions/brand-new-name')" "rename into .versions"
assert_errno "$ro|EBUSY|EISDIR" "os.rmdir('.versions/n1')" "rmdir of a history dir"
assert_errno "$ro|EBUSY|ENOTEMPTY|EPERM" "os.rmdir('.versions')" "rmdir of .versions"
assert_file_content ".versions/n1/$v" keep "the version after all those attempts"
assert_file_content n1 keep "the file after all those attempts"

pass
