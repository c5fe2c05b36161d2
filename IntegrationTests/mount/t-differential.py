#!/usr/bin/env python3
# ubq-timeout: 150
"""Differential random test: a Ubiquity mount against a plain directory on the local disk.

The same seeded random sequence of filesystem operations is applied to a fresh Ubiquity
mount and to a reference directory (ext4/xfs). After every operation the results (return
value or errno) must agree, and so must whether it changed the ctime of each object it
names; at checkpoints, across unmount/mount and at the end the full trees must agree.
Details, options and the triage workflow: IntegrationTests/mount/differential-README.md.

    UBIQUITY=/path/to/ubiquity IntegrationTests/mount/t-differential.py [--seed N] [--ops K] [-v]

Exit 0: success. Exit 77 (IntegrationTests/mount/run.sh's SKIP): /dev/fuse cannot be opened and CI
is not "true". Exit 1: a difference, a hang or a cleanup failure (also /dev/fuse missing
under CI=true); the seed and the replay command are printed.
Standard library only.
"""

import argparse
import atexit
import collections
import ctypes
import errno
import hashlib
import json
import os
import random
import re
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time

# ---------------------------------------------------------------------------------------
# Constants

# Small alphabet so that names collide often: spaces, UTF-8 (precomposed é, CJK) and one
# local-only component (`.nosync`: never versioned, but it must behave like any other name
# through POSIX). No `.tinypix` (deliberately shown differently), never `.versions`, `.kv` or
# `.conflicts`. Only valid UTF-8: Ubiquity may refuse other names with EILSEQ by design.
NAMES = ["a", "b", "c d", "\u00e9", "\u65e5\u672c", "f.txt", "q.nosync"]
MAX_DEPTH = 3
XATTR_NAMES = ["user.a", "user.b", "user.long.attribute_name", "user.\u00e9"]
STATUS_XATTR_PREFIX = "user.ubiquity."   # Ubiquity's read-only status attributes (by design)
HIDDEN_ROOT = {".versions", ".conflicts", ".kv"}  # Ubiquity's control directories at the mount root
MODES = [0o644, 0o600, 0o755, 0o700, 0o444, 0o000, 0o666, 0o777, 0o640, 0o4755, 0o2755, 0o1777]
DIR_MODES = [0o755, 0o700, 0o777, 0o555, 0o1777, 0o2755]

# Explicit timestamps lie outside the run's time window (before 2005, before 1970, after
# 2100), so an mtime tells whether it was set by utime (it must match to the nanosecond)
# or stamped "now" by the filesystem (the two sides differ by microseconds: both must then
# lie within the run's window).
EXPLICIT_SECONDS = [(946684800, 1104537600), (-2000000000, -1), (4102444800, 4133980800)]

AT_FDCWD = -100
RENAME_NOREPLACE = 1
RENAME_EXCHANGE = 2
RENAME_FLAG_NAMES = {None: "os.rename", 0: "0", RENAME_NOREPLACE: "RENAME_NOREPLACE", RENAME_EXCHANGE: "RENAME_EXCHANGE"}

TYPE_NAMES = {stat.S_IFREG: "file", stat.S_IFDIR: "dir", stat.S_IFLNK: "symlink",
              stat.S_IFIFO: "fifo", stat.S_IFSOCK: "socket", stat.S_IFCHR: "chr", stat.S_IFBLK: "blk"}
NODE_KINDS = {"S_IFIFO": stat.S_IFIFO, "S_IFSOCK": stat.S_IFSOCK, "S_IFREG": stat.S_IFREG}
WHENCE = {"SEEK_SET": os.SEEK_SET, "SEEK_CUR": os.SEEK_CUR, "SEEK_END": os.SEEK_END}

OPEN_FLAG_NAMES = [(os.O_CREAT, "O_CREAT"), (os.O_EXCL, "O_EXCL"), (os.O_TRUNC, "O_TRUNC"),
                   (os.O_APPEND, "O_APPEND"), (os.O_NOFOLLOW, "O_NOFOLLOW"),
                   (os.O_DIRECTORY, "O_DIRECTORY"), (os.O_NONBLOCK, "O_NONBLOCK")]

DEFAULT_OPS = 5000  # about 15 s on an idle 2-core machine, well under 60 s loaded
DEFAULTS = {"checkpoint": 100, "remount_every": 2000, "max_fds": 8}

_libc = ctypes.CDLL(None, use_errno=True)
_renameat2 = _libc.renameat2
_renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
_renameat2.restype = ctypes.c_int


def renameat2(old, new, flags):
    if _renameat2(AT_FDCWD, os.fsencode(old), AT_FDCWD, os.fsencode(new), flags) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e), old, None, new)


def flags_str(flags):
    acc = flags & os.O_ACCMODE
    parts = [{os.O_RDONLY: "O_RDONLY", os.O_WRONLY: "O_WRONLY", os.O_RDWR: "O_RDWR"}[acc]]
    parts += [n for f, n in OPEN_FLAG_NAMES if flags & f]
    return "|".join("os." + p for p in parts)


def errname(e):
    return errno.errorcode.get(e, str(e))


def make_data(spec):
    """Write payloads are stored in actions as small specs, regenerated on replay."""
    n, kind, seed = spec["n"], spec["kind"], spec["seed"]
    rng = random.Random(seed)
    if kind == "random":
        return rng.randbytes(n)
    if kind == "zeros":
        return bytes(n)
    pat = rng.randbytes(rng.randint(1, 64))
    return (pat * (n // len(pat) + 1))[:n]


class TestFailure(Exception):
    pass


class Outcome:
    """Result of one call on one side: a value or an errno name."""
    __slots__ = ("ok", "value")

    def __init__(self, ok, value):
        self.ok, self.value = ok, value

    def __eq__(self, other):
        return self.ok == other.ok and self.value == other.value

    def __repr__(self):
        if not self.ok:
            return self.value
        v = self.value
        if isinstance(v, (bytes, bytearray)):
            return "<%d bytes sha1 %s>" % (len(v), hashlib.sha1(v).hexdigest()[:12])
        return repr(v)


def call(fn, outcome=Outcome):
    try:
        return outcome(True, fn())
    except OSError as e:
        return outcome(False, errname(e.errno))


def read_all_fd(fd):
    out = bytearray()
    off = 0
    while True:
        b = os.pread(fd, 1 << 20, off)
        if not b:
            return bytes(out)
        out += b
        off += len(b)


def first_byte_difference(a, b):
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return "first difference at byte %d (mount %02x, reference %02x); lengths mount %d, reference %d" % (
                i, a[i], b[i], len(a), len(b))
    return "common prefix of %d bytes identical; lengths mount %d, reference %d" % (n, len(a), len(b))


# ---------------------------------------------------------------------------------------
# Mount management


def is_mounted(path):
    path = os.path.realpath(path)
    try:
        with open("/proc/self/mountinfo", "rb") as f:
            for line in f:
                mp = line.split(b" ")[4]
                mp = re.sub(rb"\\([0-7]{3})", lambda m: bytes([int(m.group(1), 8)]), mp)
                if os.fsdecode(mp) == path:
                    return True
    except OSError:
        pass
    return False


class Mount:
    def __init__(self, binary, base):
        self.binary = binary
        self.base = base
        self.mnt = os.path.join(base, "m", "1", "2", "mnt")
        self.store = os.path.join(base, "store")
        self.backing = os.path.join(base, "backing")
        self.xdg = os.path.join(base, "xdg")
        self.log = os.path.join(self.store, "daemon.log")
        self.daemon_pid = None
        # The daemon checks each incremental sync step against a whole-tree walk and logs
        # "sync-scan check:" for anything the change set missed; a checkpoint fails on it.
        self.env = dict(os.environ, XDG_DATA_HOME=self.xdg, UBQ_VERIFY_SYNC_SCAN="1")

    def mount(self):
        r = subprocess.run([self.binary, "mount", self.mnt, "--store", self.store, "--backing", self.backing],
                           env=self.env, capture_output=True, text=True, timeout=60)
        if r.returncode != 0:
            raise TestFailure("mount failed (exit %d): %s%s" % (r.returncode, r.stdout, r.stderr))
        m = re.search(r"daemon pid (\d+)", r.stdout + r.stderr)
        self.daemon_pid = int(m.group(1)) if m else None
        # IntegrationTests/mount/run.sh sweeps what a killed scenario left behind from this file.
        if os.environ.get("UBQ_STATE_FILE"):
            try:
                with open(os.environ["UBQ_STATE_FILE"], "a") as f:
                    f.write("mount %s %d\n" % (self.mnt, self.daemon_pid or 0))
            except OSError:
                pass
        if not is_mounted(self.mnt):
            raise TestFailure("mount returned 0 but %s is not mounted: %s%s" % (self.mnt, r.stdout, r.stderr))

    def unmount(self):
        """The regular unmount (commits pending saves, waits for the daemon); raises on failure."""
        r = subprocess.run([self.binary, "unmount", self.mnt], env=self.env, capture_output=True,
                           text=True, timeout=120)
        if r.returncode != 0 or is_mounted(self.mnt):
            raise TestFailure("unmount failed (exit %d, still mounted: %s): %s%s"
                              % (r.returncode, is_mounted(self.mnt), r.stdout, r.stderr))
        if not self.wait_daemon_gone(30):
            raise TestFailure("daemon %s still running 30 s after unmount" % self.daemon_pid)

    def daemon_alive(self):
        if self.daemon_pid is None:
            return False
        try:
            with open("/proc/%d/stat" % self.daemon_pid) as f:
                return f.read().rsplit(") ", 1)[-1].split()[0] != "Z"
        except OSError:
            return False

    def wait_daemon_gone(self, seconds):
        deadline = time.monotonic() + seconds
        while self.daemon_alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        return not self.daemon_alive()

    def kill_daemon(self):
        """Only the daemon this test started, by its pid."""
        if self.daemon_alive():
            try:
                os.kill(self.daemon_pid, signal.SIGKILL)
            except OSError:
                pass

    def force_cleanup(self):
        """Best effort, never raises; returns a list of problems."""
        problems = []
        try:
            if is_mounted(self.mnt):
                try:
                    subprocess.run([self.binary, "unmount", self.mnt], env=self.env, capture_output=True, timeout=60)
                except (OSError, subprocess.SubprocessError) as e:
                    problems.append("ubiquity unmount: %s" % e)
            if is_mounted(self.mnt):
                subprocess.run(["fusermount3", "-u", "-z", self.mnt], capture_output=True, timeout=30)
            if not self.wait_daemon_gone(10):
                self.kill_daemon()
                self.wait_daemon_gone(5)
            if is_mounted(self.mnt):
                subprocess.run(["fusermount3", "-u", "-z", self.mnt], capture_output=True, timeout=30)
        except (OSError, subprocess.SubprocessError) as e:
            problems.append("cleanup: %s" % e)
        if is_mounted(self.mnt):
            problems.append("%s is still mounted after cleanup" % self.mnt)
        return problems

    def log_tail(self, n=30):
        try:
            with open(self.log, errors="replace") as f:
                return "".join(f.readlines()[-n:])
        except OSError as e:
            return "(no daemon log: %s)\n" % e


# ---------------------------------------------------------------------------------------
# Tree snapshots


class Snapshotter:
    def __init__(self, start_ns, xattrs, relax):
        self.start_ns = start_ns
        self.xattrs = xattrs
        self.relax = relax
        self.exact = False  # True: every mtime to the ns (persistence across a remount)

    def mtime_class(self, ns):
        if self.exact:
            return ns
        if "mtime" in self.relax:
            return "(not compared: --relax mtime)"
        if self.start_ns - 5 * 10**9 <= ns <= time.time_ns() + 5 * 10**9:
            return "now"
        return ("set", ns)

    def norm_stat(self, st, root=False):
        fmt = stat.S_IFMT(st.st_mode)
        d = {"type": TYPE_NAMES.get(fmt, oct(fmt)), "mode": oct(stat.S_IMODE(st.st_mode)),
             "uid": st.st_uid, "gid": st.st_gid, "mtime": self.mtime_class(st.st_mtime_ns)}
        # Not compared, by design: st_size of directories (Ubiquity reports its own value,
        # ext4 block multiples), st_blocks, st_ino values (hard links are compared as groups
        # of names instead), st_dev, atime and ctime.
        if fmt != stat.S_IFDIR:
            d["size"] = st.st_size
        # The mount root's link count counts the hidden control directories or not: not
        # comparable. Every other link count (files and directories) is compared.
        if not root:
            d["nlink"] = st.st_nlink
        return d

    def user_xattrs(self, path):
        if not self.xattrs:
            return None
        out = {}
        try:
            names = os.listxattr(path, follow_symlinks=False)
        except OSError as e:
            return "listxattr:" + errname(e.errno)
        for n in sorted(names):
            # Only user.*, without Ubiquity's computed user.ubiquity.* status (by design).
            if not n.startswith("user.") or n.startswith(STATUS_XATTR_PREFIX):
                continue
            try:
                out[n] = os.getxattr(path, n, follow_symlinks=False)
            except OSError as e:
                out[n] = "getxattr:" + errname(e.errno)
        return out

    def snapshot(self, root, exact=False):
        """({relpath: attrs}, hard-link groups, readdir anomalies)."""
        self.exact = exact
        try:
            return self._snapshot(root)
        finally:
            self.exact = False

    def _snapshot(self, root):
        entries = {}
        inodes = collections.defaultdict(list)
        anomalies = []
        entries[""] = self.norm_stat(os.lstat(root), root=True)
        entries[""]["xattrs"] = self.user_xattrs(root)
        stack = [""]
        while stack:
            rel_dir = stack.pop()
            try:
                with os.scandir(os.path.join(root, rel_dir) if rel_dir else root) as it:
                    listed = list(it)
            except PermissionError as ex:   # --user: a directory its mode keeps the user out of
                entries[rel_dir]["listing"] = errname(ex.errno)
                continue
            names = [e.name for e in listed]
            if len(names) != len(set(names)):
                anomalies.append("readdir of %r lists duplicates: %r" % (rel_dir or ".", sorted(names)))
            for e in listed:
                if rel_dir == "" and e.name in HIDDEN_ROOT:
                    continue
                rel = os.path.join(rel_dir, e.name) if rel_dir else e.name
                p = os.path.join(root, rel)
                try:
                    st = os.lstat(p)
                except OSError as ex:
                    entries[rel] = {"lstat": errname(ex.errno)}
                    if ex.errno == errno.EACCES:   # --user: listed, but not searchable
                        continue
                    anomalies.append("readdir of %r lists %r but lstat fails: %s" % (rel_dir or ".", e.name, errname(ex.errno)))
                    continue
                a = self.norm_stat(st)
                fmt = stat.S_IFMT(st.st_mode)
                # The d_type readdir reports must agree with lstat.
                dtype = "symlink" if e.is_symlink() else "dir" if e.is_dir(follow_symlinks=False) else \
                    "file" if e.is_file(follow_symlinks=False) else "other"
                ltype = {stat.S_IFLNK: "symlink", stat.S_IFDIR: "dir", stat.S_IFREG: "file"}.get(fmt, "other")
                if dtype != ltype:
                    anomalies.append("%r: readdir type %s but lstat type %s" % (rel, dtype, ltype))
                if fmt == stat.S_IFREG:
                    try:
                        with open(p, "rb") as f:
                            data = f.read()
                        a["content"] = hashlib.sha256(data).hexdigest()[:16]
                        if len(data) != st.st_size:
                            a["bytes read"] = len(data)
                    except OSError as ex:
                        a["content"] = "read:" + errname(ex.errno)
                elif fmt == stat.S_IFLNK:
                    try:
                        a["target"] = os.readlink(p)
                    except OSError as ex:
                        a["target"] = "readlink:" + errname(ex.errno)
                if fmt in (stat.S_IFREG, stat.S_IFDIR):
                    a["xattrs"] = self.user_xattrs(p)
                entries[rel] = a
                inodes[(st.st_dev, st.st_ino)].append(rel)
                if fmt == stat.S_IFDIR:
                    stack.append(rel)
        groups = sorted(sorted(v) for v in inodes.values() if len(v) > 1)
        return entries, groups, anomalies


def diff_snapshots(a, b, label_a="mount", label_b="reference", limit=40):
    ea, ga, _ = a
    eb, gb, _ = b
    lines = []
    for rel in sorted(set(ea) | set(eb)):
        x, y = ea.get(rel), eb.get(rel)
        name = rel or "(root)"
        if x is None:
            lines.append("  %s: only in %s: %r" % (name, label_b, y))
        elif y is None:
            lines.append("  %s: only in %s: %r" % (name, label_a, x))
        elif x != y:
            keys = sorted(set(x) | set(y))
            d = ", ".join("%s: %s %r, %s %r" % (k, label_a, x.get(k), label_b, y.get(k)) for k in keys if x.get(k) != y.get(k))
            lines.append("  %s: %s" % (name, d))
    if ga != gb:
        lines.append("  hard-link groups differ: %s %r, %s %r" % (label_a, ga, label_b, gb))
    for an in a[2]:
        lines.append("  %s anomaly: %s" % (label_a, an))
    for an in b[2]:
        lines.append("  %s anomaly: %s" % (label_b, an))
    if len(lines) > limit:
        lines = lines[:limit] + ["  ... %d more" % (len(lines) - limit)]
    return lines


# ---------------------------------------------------------------------------------------
# Executing actions on both sides


class Handle:
    def __init__(self, hid, fds, flags, path):
        self.hid, self.fds, self.flags, self.path = hid, fds, flags, path

    @property
    def name(self):
        return "fd%d" % self.hid


class Executor:
    """Runs actions (JSON-able dicts) on the mount and on the reference and compares.

    Random generation (Generator below) and replay of a saved or minimized action list
    both go through here, so a failing sequence can be replayed without the seed."""

    def __init__(self, mount, ref, xattrs, relax, history, verbose, max_fds):
        self.mount = mount
        self.roots = {"m": mount.mnt, "r": ref}
        self.xattrs = xattrs
        self.snap = Snapshotter(time.time_ns(), xattrs, relax)
        self.handles = {}          # hid -> Handle, in opening order
        self.history = collections.deque(maxlen=history)
        self.verbose = verbose
        self.max_fds = max_fds
        self.step = 0
        self.current = None
        self.last_progress = time.monotonic()
        self.executed = []         # actions run so far (for --save-actions and minimizing)
        self.relax = relax
        self.first_call = None     # (description, reference outcome) of the running action's first call
        self.ctime_diffs = {}      # --relax ctime: class -> [count, first example]
        self.eacces_later = collections.Counter()   # --user: differences by design, by kind
        self.compare_ctime = True  # False when the reference's ctime is coarse-grained

    def p(self, side, rel):
        return os.path.join(self.roots[side], rel) if rel else self.roots[side]

    def log(self, text):
        line = "[%d] %s" % (self.step, text)
        self.history.append(line)
        if self.verbose:
            print(line, flush=True)

    def fail(self, what, details=()):
        raise TestFailure("%s\n%s" % (what, "\n".join(details)))

    def both(self, desc, fn, compare=None):
        """Runs fn(side) on both sides; fails unless the outcomes agree."""
        self.current = desc
        self.last_progress = time.monotonic()
        om = call(lambda: fn("m"))
        orf = call(lambda: fn("r"))
        self.last_progress = time.monotonic()
        if self.first_call is None:
            self.first_call = (desc, orf)
        same = (compare or (lambda a, b: a == b))(om, orf)
        self.log("%s -> %r%s" % (desc, orf, "" if same else "   MOUNT: %r" % (om,)))
        if not same:
            details = ["  mount:     %r" % (om,), "  reference: %r" % (orf,)]
            if om.ok and orf.ok and isinstance(om.value, bytes) and isinstance(orf.value, bytes):
                details.append("  " + first_byte_difference(om.value, orf.value))
            self.fail("operation result differs: %s" % desc, details)
        return om, orf

    def faults(self, m, r):
        """The comparison of a call that changes names. With --user (not root), one order
        of errors differs by design: where ext4 finds two faults and says EACCES first, the
        mount may say the other. The daemon checks permissions there (no
        default_permissions) and is asked only once the kernel has ruled out the faults it
        sees itself: a source it knows to be absent (ENOENT), a directory to link (EPERM),
        a trailing slash on a file (ENOTDIR). Both must still fail; the cases are counted."""
        if m == r:
            return True
        if os.geteuid() != 0 and not m.ok and not r.ok and r.value == "EACCES":
            self.eacces_later[m.value] += 1
            return True
        return False

    def stat_of(self, side, rel, follow, root=False):
        st = os.stat(self.p(side, rel)) if follow else os.lstat(self.p(side, rel))
        return self.snap.norm_stat(st, root=root)

    def post_check(self, *rels):
        """After a path operation: lstat of the paths touched and of their parents."""
        seen = set()
        for rel in rels:
            rel = rel.rstrip("/")
            for x in (rel, os.path.dirname(rel)):
                if x not in seen:
                    seen.add(x)
                    self.both("lstat(%r)" % (x or "."), lambda s, x=x: self.stat_of(s, x, False, root=(x == "")))

    def post_check_fd(self, h):
        self.both("fstat(%s)" % h.name, lambda s: self.snap.norm_stat(os.fstat(h.fds[s])))

    # ---- ctime: did the operation change it? -------------------------------------------
    #
    # ctime values cannot be compared (the two sides' clocks differ by microseconds), but
    # whether an operation changed an object's ctime can: POSIX and Linux say which calls
    # mark it for update (a change of the inode's data, metadata, xattrs or link count). So
    # around every action each object it names is stat'ed before and after, on both sides,
    # and "changed" must agree. The reference is reliable: ext4 has multigrain timestamps
    # (Linux >= 6.13), so after the "before" stat the next change gets a fine-grained ctime
    # even within the same jiffy (checked at the start: reference_has_fine_ctime). On the
    # mount the kernel caches attributes but invalidates them after the requests it sends:
    # what stat shows there is what users see.
    #
    # A probe is (role, label, how, what): how is "l" (lstat of a path), "s" (stat of a
    # path: its final symlink followed, e.g. the directory an entry lives in) or "f"
    # (fstat of a handle). Objects are matched by inode number, per side, so an object is
    # followed when the operation moves it (a renamed entry: "before" at the source, "after"
    # at the destination) and skipped when a name now holds another object (created,
    # replaced) or when it is no longer reachable.

    NAME_REMOVING = {"unlink", "rmdir", "rename", "close"}

    def ctime_probes(self, a, h):
        op = a["op"]
        probes = []

        def path(role, rel, follow):
            rel = rel.rstrip("/")
            probes.append((role, repr(rel or "."), "l", rel))
            if follow:  # the object an operation that follows symlinks reaches
                probes.append((role + " (symlink followed)", repr(rel or "."), "s", rel))

        def parent(rel):
            rel = rel.rstrip("/")
            if rel:
                probes.append(("parent directory", "%r (of %r)" % (os.path.dirname(rel) or ".", rel), "s", os.path.dirname(rel)))

        def fd(hid, role="file of the descriptor"):
            probes.append((role, "fd%d" % hid, "f", hid))

        if op in ("checkpoint", "remount"):
            return []
        if op == "open":
            path("target", a["path"], True)
            if a["flags"] & os.O_CREAT:
                parent(a["path"])
            fd(a["new"])
        elif op == "close":
            fd(h.hid)
            path("target (its path at open)", h.path, True)
        elif op == "dup":
            fd(h.hid)
            fd(a["new"])
        elif h is not None:    # every other descriptor operation
            fd(h.hid)
        elif op in ("unlink", "rmdir", "mkdir", "mknod", "symlink"):
            path("target", a["path"], False)
            parent(a["path"])
        elif op == "rename":
            path("source (renamed)", a["src"], False)
            path("destination (replaced or exchanged)", a["dst"], False)
            parent(a["src"])
            parent(a["dst"])
        elif op == "link":
            path("source (linked)", a["src"], a["follow"])
            path("destination", a["dst"], False)
            parent(a["dst"])
        elif op == "readlink":
            path("target", a["path"], False)
        else:    # truncate, stat, listdir, chmod, chown, utime, xattr: the path, either way
            path("target", a["path"], True)
        return probes

    def probe(self, side, how, what):
        try:
            if how == "f":
                hh = self.handles.get(what)
                return os.fstat(hh.fds[side]) if hh is not None else None
            return os.stat(self.p(side, what)) if how == "s" else os.lstat(self.p(side, what))
        except OSError:
            return None

    def witnesses(self, probes, results):
        """Where to find, after the operation, an object that may lose the name it was
        probed by (unlink, rmdir, rename over it, close of its last descriptor): the open
        descriptors on it, and another hard link (from the reference tree; the mount must
        have the same names)."""
        out = []
        probed_fds = {p[3] for p in probes if p[2] == "f"}
        for (role, label, how, what), st in zip(probes, results):
            if st is None or how == "f":
                continue
            for hh in self.handles.values():
                if hh.hid not in probed_fds:
                    fs = self.probe("r", "f", hh.hid)
                    if fs is not None and (fs.st_dev, fs.st_ino) == (st.st_dev, st.st_ino):
                        out.append(("open descriptor on " + role, "fd%d" % hh.hid, "f", hh.hid))
                        probed_fds.add(hh.hid)
            if st.st_nlink > 1 and not stat.S_ISDIR(st.st_mode):
                for rel in self.ref_names(st):
                    if rel != what:
                        out.append(("another hard link of " + role, repr(rel), "l", rel))
                        break
        return out

    def ref_names(self, st):
        """The reference tree's names of the inode of `st` (symlinks not followed)."""
        names, stack = [], [""]
        while stack:
            d = stack.pop()
            try:
                with os.scandir(self.p("r", d)) as it:
                    listed = list(it)
            except OSError:
                continue
            for e in listed:
                rel = os.path.join(d, e.name) if d else e.name
                try:
                    est = e.stat(follow_symlinks=False)
                except OSError:
                    continue
                if (est.st_dev, est.st_ino) == (st.st_dev, st.st_ino):
                    names.append(rel)
                if stat.S_ISDIR(est.st_mode):
                    stack.append(rel)
        return sorted(names)

    def ctime_before(self, a, h):
        probes = self.ctime_probes(a, h) if self.compare_ctime else []
        before = {"r": [self.probe("r", how, what) for _, _, how, what in probes]}
        if a["op"] in self.NAME_REMOVING:
            extra = self.witnesses(probes, before["r"])
            probes += extra
            before["r"] += [self.probe("r", how, what) for _, _, how, what in extra]
        before["m"] = [self.probe("m", how, what) for _, _, how, what in probes]
        before["same xattr value"] = bool(probes) and self.sets_same_xattr_value(a, h)
        return probes, before

    def sets_same_xattr_value(self, a, h):
        """True for a setxattr that stores the value the attribute already has (on the
        reference). ext4 then changes nothing, ctime included (commit 3fd164629d25, Linux
        4.6: "ext4: shortcut setting of xattr to the same value"); xfs and tmpfs update
        ctime all the same. Either is Linux behaviour, so a ctime that changed on the mount
        only is not a difference there."""
        if a["op"] not in ("xattr", "fxattr") or a["sub"] != "set":
            return False
        try:
            if h is not None:
                old = os.getxattr(h.fds["r"], a["name"])
            else:
                old = os.getxattr(self.p("r", a["path"]), a["name"], follow_symlinks=a["follow"])
        except OSError:
            return False
        return old == bytes.fromhex(a["value"])

    def ctime_after(self, a, h, probes, before):
        if not probes:
            return
        after = {s: [self.probe(s, how, what) for _, _, how, what in probes] for s in ("r", "m")}

        def find(side, st):
            """The object's "after" stat and the label it was found by."""
            for x, p in zip(after[side], probes):
                if x is not None and (x.st_dev, x.st_ino) == (st.st_dev, st.st_ino):
                    return x, p[1]
            return None, None
        seen = set()
        lines, classes = [], []
        for i, (role, label, _, _) in enumerate(probes):
            rb, mb = before["r"][i], before["m"][i]
            if rb is None or mb is None or (rb.st_dev, rb.st_ino) in seen:
                continue
            seen.add((rb.st_dev, rb.st_ino))
            (ra, seen_as), (ma, _) = find("r", rb), find("m", mb)
            if ra is None or ma is None:
                continue
            r_changed, m_changed = ra.st_ctime_ns != rb.st_ctime_ns, ma.st_ctime_ns != mb.st_ctime_ns
            if r_changed == m_changed or (m_changed and before["same xattr value"]):
                continue
            kind = TYPE_NAMES.get(stat.S_IFMT(rb.st_mode), "other")
            how = "changed on the reference (ext4) but not on the mount" if r_changed else \
                "changed on the mount but not on the reference (ext4)"
            shown = label if seen_as == label else "%s (afterwards %s)" % (label, seen_as)
            lines.append("  %s, %s %s: ctime %s" % (shown, role, kind, how))
            classes.append((self.ctime_op_class(a, h, probes, before), "%s %s" % (role, kind), how))
        if not lines:
            return
        desc = self.first_call[0] if self.first_call else a["op"]
        self.log("ctime differs after %s: %s" % (desc, "; ".join(l.strip() for l in lines)))
        if "ctime" not in self.relax:
            self.fail("ctime differs after %s" % desc, lines)
        for c in classes:
            entry = self.ctime_diffs.setdefault(c, [0, "step %d: %s" % (self.step, desc)])
            entry[0] += 1

    def ctime_op_class(self, a, h, probes, before):
        """A short class of the action for --relax ctime's summary: the operation, what
        distinguishes the cases the ctime rules treat differently, and its result."""
        op, q = a["op"], []
        rb = before["r"][0] if probes else None   # the first probe: the target, source or descriptor
        if op in ("truncate", "chmod", "chown") and before["r"][1] is not None:
            rb = before["r"][1]                   # these follow a final symlink
        if op == "open":
            q += [n for f, n in OPEN_FLAG_NAMES[:3] if a["flags"] & f]
            q.append("existing" if rb is not None else "new")
        elif op in ("truncate", "ftruncate"):
            q.append("same size" if rb is not None and not stat.S_ISDIR(rb.st_mode) and rb.st_size == a["size"] else "new size")
        elif op in ("chmod", "fchmod"):
            q.append("same mode" if rb is not None and stat.S_IMODE(rb.st_mode) == a["mode"] else "new mode")
        elif op == "chown":
            q.append("same owner" if rb is not None and a["uid"] in (-1, rb.st_uid) and a["gid"] in (-1, rb.st_gid) else "new owner")
        elif op in ("utime", "futimens"):
            q.append("now" if a.get("times") is None else "explicit times")
        elif op in ("xattr", "fxattr"):
            q.append(a["sub"])
            if a.get("flags"):
                q.append({os.XATTR_CREATE: "XATTR_CREATE", os.XATTR_REPLACE: "XATTR_REPLACE"}[a["flags"]])
        elif op == "rename":
            q.append(RENAME_FLAG_NAMES[a["flags"]])
            q.append(TYPE_NAMES.get(stat.S_IFMT(rb.st_mode), "other") if rb is not None else "missing source")
            q.append("over an existing name" if before["r"][1] is not None else "to a new name")
        elif op in ("unlink", "rmdir"):
            q.append("one of %d links" % rb.st_nlink if rb is not None and rb.st_nlink > 1 and op == "unlink" else "")
        elif op == "link":
            q.append("follow" if a["follow"] else "nofollow")
        result = self.first_call[1] if self.first_call else None
        q.append("-> " + ("ok" if result is None or result.ok else result.value))
        return " ".join([op] + [x for x in q if x])

    # ---- the actions -------------------------------------------------------------------

    def run(self, a):
        """Runs one action. Returns False when it refers to a descriptor that is not open
        (only in replays of edited action lists, e.g. while minimizing)."""
        op = a["op"]
        h = None
        if "h" in a:
            h = self.handles.get(a["h"])
            if h is None:
                return False
        self.executed.append(a)
        probes, before = self.ctime_before(a, h)
        self.first_call = None
        getattr(self, "do_" + op)(a, h)
        self.ctime_after(a, h, probes, before)
        return True

    def do_open(self, a, _):
        rel, flags, mode, hid = a["path"], a["flags"], a["mode"], a["new"]
        if hid in self.handles:
            return
        special = False
        try:
            fmt = stat.S_IFMT(os.stat(self.p("r", rel)).st_mode)
            special = fmt in (stat.S_IFIFO, stat.S_IFSOCK)
            if fmt == stat.S_IFIFO:
                flags |= os.O_NONBLOCK  # never block on a fifo (also in edited replays)
        except OSError:
            pass

        def compare(x, y):
            if x.ok == y.ok and (x.ok or x.value == y.value):
                return True
            # With --user, by design: the kernel opens a fifo itself, without a request,
            # so where the daemon checks permissions a fifo's mode does not stop its owner
            # (the open succeeds, or meets the fifo's own ENXIO: a writer without readers).
            if os.geteuid() != 0 and special and (y.ok, y.value) == (False, "EACCES") and (x.ok or x.value == "ENXIO"):
                self.eacces_later["fifo opened"] += 1
                return True
            return False
        desc = "fd%d = os.open(%r, %s, 0o%o)" % (hid, rel, flags_str(flags), mode)
        om, orf = self.both(desc, lambda s: os.open(self.p(s, rel), flags, mode), compare=compare)
        if om.ok and not orf.ok:
            os.close(om.value)
        elif om.ok:
            h = Handle(hid, {"m": om.value, "r": orf.value}, flags, rel)
            self.handles[hid] = h
            self.post_check_fd(h)
            self.post_check(rel)

    def do_close(self, a, h):
        del self.handles[h.hid]
        self.both("os.close(%s)" % h.name, lambda s: os.close(h.fds[s]))
        if a.get("check", True):
            self.post_check(h.path)

    def do_dup(self, a, h):
        hid = a["new"]
        if hid in self.handles:
            return
        om, orf = self.both("fd%d = os.dup(%s)" % (hid, h.name), lambda s: os.dup(h.fds[s]),
                            compare=lambda x, y: x.ok == y.ok and (x.ok or x.value == y.value))
        if om.ok:
            self.handles[hid] = Handle(hid, {"m": om.value, "r": orf.value}, h.flags, h.path)

    def do_write(self, a, h):
        data = make_data(a["data"])
        self.both("os.write(%s, <%d %s bytes>)" % (h.name, len(data), a["data"]["kind"]), lambda s: os.write(h.fds[s], data))
        self.both("os.lseek(%s, 0, os.SEEK_CUR)" % h.name, lambda s: os.lseek(h.fds[s], 0, os.SEEK_CUR))
        self.post_check_fd(h)

    def do_pwrite(self, a, h):
        data, off = make_data(a["data"]), a["off"]
        self.both("os.pwrite(%s, <%d %s bytes>, %d)" % (h.name, len(data), a["data"]["kind"], off),
                  lambda s: os.pwrite(h.fds[s], data, off))
        self.post_check_fd(h)

    def do_lseek(self, a, h):
        off, wname = a["off"], a["whence"]
        self.both("os.lseek(%s, %d, os.%s)" % (h.name, off, wname), lambda s: os.lseek(h.fds[s], off, WHENCE[wname]))

    def do_read(self, a, h):
        n = a["n"]
        self.both("os.read(%s, %d)" % (h.name, n), lambda s: os.read(h.fds[s], n))
        self.both("os.lseek(%s, 0, os.SEEK_CUR)" % h.name, lambda s: os.lseek(h.fds[s], 0, os.SEEK_CUR))

    def do_pread(self, a, h):
        n, off = a["n"], a["off"]
        self.both("os.pread(%s, %d, %d)" % (h.name, n, off), lambda s: os.pread(h.fds[s], n, off))

    def do_ftruncate(self, a, h):
        n = a["size"]
        self.both("os.ftruncate(%s, %d)" % (h.name, n), lambda s: os.ftruncate(h.fds[s], n))
        self.post_check_fd(h)

    def do_fallocate(self, a, h):
        off, n = a["off"], a["len"]
        self.both("os.posix_fallocate(%s, %d, %d)" % (h.name, off, n), lambda s: os.posix_fallocate(h.fds[s], off, n))
        self.post_check_fd(h)

    def do_fsync(self, a, h):
        if a["data_only"]:
            self.both("os.fdatasync(%s)" % h.name, lambda s: os.fdatasync(h.fds[s]))
        else:
            self.both("os.fsync(%s)" % h.name, lambda s: os.fsync(h.fds[s]))
        self.post_check_fd(h)

    def do_fstat(self, a, h):
        self.post_check_fd(h)

    def do_fchmod(self, a, h):
        mode = a["mode"]
        self.both("os.fchmod(%s, 0o%o)" % (h.name, mode), lambda s: os.fchmod(h.fds[s], mode))
        self.post_check_fd(h)

    def do_futimens(self, a, h):
        t = tuple(a["times"])
        self.both("os.utime(%s, ns=%r)" % (h.name, t), lambda s: os.utime(h.fds[s], ns=t))
        self.post_check_fd(h)

    def do_fxattr(self, a, h):
        sub, name = a["sub"], a["name"]
        if sub == "set":
            value = bytes.fromhex(a["value"])
            self.both("os.setxattr(%s, %r, <%d bytes>)" % (h.name, name, len(value)), lambda s: os.setxattr(h.fds[s], name, value))
        elif sub == "get":
            self.both("os.getxattr(%s, %r)" % (h.name, name), lambda s: os.getxattr(h.fds[s], name))
        else:
            self.both("os.removexattr(%s, %r)" % (h.name, name), lambda s: os.removexattr(h.fds[s], name))

    def do_truncate(self, a, _):
        rel, n = a["path"], a["size"]
        self.both("os.truncate(%r, %d)" % (rel, n), lambda s: os.truncate(self.p(s, rel), n))
        self.post_check(rel)

    def do_stat(self, a, _):
        rel, follow = a["path"], a["follow"]
        self.both("os.%s(%r)" % ("stat" if follow else "lstat", rel or "."), lambda s: self.stat_of(s, rel, follow, root=(rel == "")))

    def do_listdir(self, a, _):
        rel = a["path"]

        def ls(s):
            names = os.listdir(self.p(s, rel))
            if rel == "":
                names = [n for n in names if n not in HIDDEN_ROOT]
            return sorted(names)
        self.both("os.listdir(%r)" % (rel or "."), ls)

    def do_unlink(self, a, _):
        rel = a["path"]
        self.both("os.unlink(%r)" % rel, lambda s: os.unlink(self.p(s, rel)), self.faults)
        self.post_check(rel)

    def do_mkdir(self, a, _):
        rel, mode = a["path"], a["mode"]
        self.both("os.mkdir(%r, 0o%o)" % (rel, mode), lambda s: os.mkdir(self.p(s, rel), mode), self.faults)
        self.post_check(rel)

    def do_rmdir(self, a, _):
        rel = a["path"]
        self.both("os.rmdir(%r)" % rel, lambda s: os.rmdir(self.p(s, rel)), self.faults)
        self.post_check(rel)

    def do_rename(self, a, _):
        src, dst, flags = a["src"], a["dst"], a["flags"]
        if flags is None:
            self.both("os.rename(%r, %r)" % (src, dst), lambda s: os.rename(self.p(s, src), self.p(s, dst)), self.faults)
        else:
            self.both("renameat2(%r, %r, %s)" % (src, dst, RENAME_FLAG_NAMES[flags]),
                      lambda s: renameat2(self.p(s, src), self.p(s, dst), flags), self.faults)
        self.post_check(src, dst)

    def do_symlink(self, a, _):
        target, rel = a["target"], a["path"]
        self.both("os.symlink(%r, %r)" % (target, rel), lambda s: os.symlink(target, self.p(s, rel)), self.faults)
        self.post_check(rel)

    def do_readlink(self, a, _):
        rel = a["path"]
        self.both("os.readlink(%r)" % rel, lambda s: os.readlink(self.p(s, rel)))

    def do_link(self, a, _):
        src, dst, follow = a["src"], a["dst"], a["follow"]
        self.both("os.link(%r, %r, follow_symlinks=%s)" % (src, dst, follow),
                  lambda s: os.link(self.p(s, src), self.p(s, dst), follow_symlinks=follow), self.faults)
        self.post_check(src, dst)

    def do_chmod(self, a, _):
        rel, mode = a["path"], a["mode"]
        self.both("os.chmod(%r, 0o%o)" % (rel or ".", mode), lambda s: os.chmod(self.p(s, rel), mode))
        self.post_check(rel)

    def do_chown(self, a, _):
        rel, uid, gid, follow = a["path"], a["uid"], a["gid"], a["follow"]
        self.both("os.chown(%r, %d, %d, follow_symlinks=%s)" % (rel, uid, gid, follow),
                  lambda s: os.chown(self.p(s, rel), uid, gid, follow_symlinks=follow))
        self.post_check(rel)

    def do_utime(self, a, _):
        rel, follow = a["path"], a["follow"]
        if a["times"] is not None:
            t = tuple(a["times"])
            self.both("os.utime(%r, ns=%r, follow_symlinks=%s)" % (rel or ".", t, follow),
                      lambda s: os.utime(self.p(s, rel), ns=t, follow_symlinks=follow))
        else:
            self.both("os.utime(%r, follow_symlinks=%s)" % (rel or ".", follow),
                      lambda s: os.utime(self.p(s, rel), follow_symlinks=follow))
        self.post_check(rel)

    def do_xattr(self, a, _):
        rel, sub, name, follow = a["path"], a["sub"], a["name"], a["follow"]
        shown = rel or "."
        if sub == "set":
            value, fl = bytes.fromhex(a["value"]), a["flags"]
            self.both("os.setxattr(%r, %r, <%d bytes>, %d, follow_symlinks=%s)" % (shown, name, len(value), fl, follow),
                      lambda s: os.setxattr(self.p(s, rel), name, value, fl, follow_symlinks=follow))
        elif sub == "get":
            self.both("os.getxattr(%r, %r, follow_symlinks=%s)" % (shown, name, follow),
                      lambda s: os.getxattr(self.p(s, rel), name, follow_symlinks=follow))
        elif sub == "list":
            self.both("os.listxattr(%r, follow_symlinks=%s) [user.* only]" % (shown, follow),
                      lambda s: sorted(n for n in os.listxattr(self.p(s, rel), follow_symlinks=follow)
                                       if n.startswith("user.") and not n.startswith(STATUS_XATTR_PREFIX)))
        else:
            self.both("os.removexattr(%r, %r, follow_symlinks=%s)" % (shown, name, follow),
                      lambda s: os.removexattr(self.p(s, rel), name, follow_symlinks=follow))
        if sub in ("set", "remove"):
            self.post_check(rel)

    def do_mknod(self, a, _):
        rel, kind, mode = a["path"], a["kind"], a["mode"]
        self.both("os.mknod(%r, stat.%s|0o%o)" % (rel, kind, mode), lambda s: os.mknod(self.p(s, rel), NODE_KINDS[kind] | mode), self.faults)
        self.post_check(rel)

    def do_checkpoint(self, a, _):
        self.compare_trees(a["why"])

    def do_remount(self, a, _):
        why = a["why"]
        self.close_all()
        self.compare_trees("before unmount (%s)" % why)
        before = self.snap.snapshot(self.roots["m"], exact=True)
        self.current = "unmount + mount (%s)" % why
        self.last_progress = time.monotonic()
        self.mount.unmount()
        self.mount.mount()
        self.last_progress = time.monotonic()
        self.log("unmounted and mounted again (%s)" % why)
        # Persistence, stricter than the reference comparison: every attribute as it was,
        # mtimes to the nanosecond.
        after = self.snap.snapshot(self.roots["m"], exact=True)
        lines = diff_snapshots(after, before, "after remount", "before")
        if lines:
            self.fail("the mount changed across unmount + mount (%s)" % why, lines)
        self.compare_trees("after remount (%s)" % why)

    # ---- checkpoints -------------------------------------------------------------------

    def compare_trees(self, why):
        self.current = "checkpoint (%s)" % why
        self.last_progress = time.monotonic()
        sm = self.snap.snapshot(self.roots["m"])
        sr = self.snap.snapshot(self.roots["r"])
        self.last_progress = time.monotonic()
        lines = diff_snapshots(sm, sr)
        self.log("checkpoint (%s): %d entries%s" % (why, len(sr[0]), ", %d differences" % len(lines) if lines else ""))
        if lines:
            self.fail("trees differ at checkpoint (%s)" % why, lines)
        missed = [l for l in self.mount.log_tail(1 << 20).splitlines() if "sync-scan check:" in l]
        if missed:
            self.fail("the sync step's change set missed changes (checkpoint %s)" % why, missed[:20])
        # Open descriptors: offset, attributes and, where readable, the full content.
        for h in list(self.handles.values()):
            self.both("os.lseek(%s, 0, os.SEEK_CUR)" % h.name, lambda s: os.lseek(h.fds[s], 0, os.SEEK_CUR))
            om, _ = self.both("fstat(%s)" % h.name, lambda s: self.snap.norm_stat(os.fstat(h.fds[s])))
            if om.ok and om.value["type"] == "file" and (h.flags & os.O_ACCMODE) != os.O_WRONLY:
                self.both("os.pread(%s, <all>, 0)" % h.name, lambda s: read_all_fd(h.fds[s]))

    def close_all(self):
        for h in list(self.handles.values()):
            self.run({"op": "close", "h": h.hid, "check": False})


# ---------------------------------------------------------------------------------------
# Random generation of actions (deterministic given the seed and the reference's state)


class Generator:
    OPS = [("open", 12), ("close", 7), ("dup", 1), ("write", 10), ("pwrite", 8), ("lseek", 2),
           ("read", 5), ("pread", 6), ("ftruncate", 4), ("fallocate", 1), ("truncate", 3), ("fsync", 3),
           ("fstat", 2), ("fchmod", 1), ("futimens", 2), ("fxattr", 2), ("stat", 3), ("listdir", 2),
           ("unlink", 5), ("mkdir", 5), ("rmdir", 4), ("rename", 8), ("renameat2", 5), ("symlink", 3),
           ("readlink", 1), ("link", 4), ("chmod", 2), ("chown", 1), ("utime", 4), ("xattr", 6), ("mknod", 1)]

    def __init__(self, seed, ex):
        self.rng = random.Random(seed)
        self.ex = ex
        self.next_hid = 1
        self.names = [n for n, _ in self.OPS]
        self.weights = [w for _, w in self.OPS]
        self.counts = collections.Counter()

    # ---- state of the reference (never of the mount: the sequence must not depend on it)

    def ref_entries(self):
        """Sorted [(rel, type)] of the reference tree, symlinks not followed."""
        out = []
        stack = [""]
        while stack:
            d = stack.pop()
            try:
                with os.scandir(self.ex.p("r", d)) as it:
                    names = sorted(e.name for e in it)
            except PermissionError:   # --user: a directory its mode keeps the user out of
                continue
            for n in names:
                rel = os.path.join(d, n) if d else n
                try:
                    st = os.lstat(self.ex.p("r", rel))
                except OSError:
                    continue
                t = TYPE_NAMES.get(stat.S_IFMT(st.st_mode), "other")
                out.append((rel, t))
                if t == "dir":
                    stack.append(rel)
        out.sort()
        return out

    def ref_stat(self, rel, follow=True):
        try:
            return os.stat(self.ex.p("r", rel), follow_symlinks=follow)
        except OSError:
            return None

    def fd_stat(self, h):
        try:
            return os.fstat(h.fds["r"])
        except OSError:
            return None

    def fd_size(self, h):
        st = self.fd_stat(h)
        return st.st_size if st else 0

    # ---- random pieces

    def rand_name(self):
        return self.rng.choice(NAMES)

    def rand_path(self, max_depth=MAX_DEPTH):
        depth = min(self.rng.choice([1, 1, 2, 2, 3]), max_depth)
        return "/".join(self.rand_name() for _ in range(depth))

    def pick_path(self, kinds=None, existing=0.6):
        """An existing entry (of one of `kinds`) with probability `existing`, else a new name
        in an existing directory, else a random path of up to MAX_DEPTH components."""
        entries = self.ref_entries()
        r = self.rng.random()
        if r < existing:
            cands = [rel for rel, t in entries if kinds is None or t in kinds]
            if cands:
                return self.rng.choice(cands)
        if r < existing + (1 - existing) / 2:
            dirs = [""] + [rel for rel, t in entries if t == "dir" and rel.count("/") < MAX_DEPTH - 1]
            d = self.rng.choice(dirs)
            return (d + "/" if d else "") + self.rand_name()
        return self.rand_path()

    def maybe_slash(self, rel):
        # Now and then a trailing slash ("must be a directory").
        return rel + "/" if self.rng.random() < 0.03 else rel

    def rand_data(self):
        r = self.rng.random()
        n = self.rng.randint(1, 4096) if r < 0.7 else self.rng.randint(1, 65536) if r < 0.9 else self.rng.randint(65536, 300000)
        k = self.rng.random()
        kind = "random" if k < 0.6 else "zeros" if k < 0.8 else "pattern"
        return {"n": n, "kind": kind, "seed": self.rng.randrange(2**32)}

    def rand_time_ns(self):
        lo, hi = self.rng.choice(EXPLICIT_SECONDS)
        return self.rng.randint(lo, hi) * 10**9 + self.rng.randint(0, 999999999)

    def rand_size(self, cur):
        r = self.rng.random()
        if r < 0.2:
            return 0
        if r < 0.6:
            return max(0, cur + self.rng.randint(-5000, 5000))
        if r < 0.7:
            return cur
        return self.rng.randint(0, 1200000)

    def pick_handle(self):
        hs = list(self.ex.handles.values())
        return self.rng.choice(hs) if hs else None

    # ---- one step: a list of actions

    def step(self):
        op = self.rng.choices(self.names, self.weights)[0]
        self.counts[op] += 1
        return getattr(self, "gen_" + op)()

    def gen_open(self):
        acc = self.rng.choice([os.O_RDONLY, os.O_WRONLY, os.O_RDWR, os.O_RDWR])
        flags = acc
        if self.rng.random() < 0.5:
            flags |= os.O_CREAT
            if self.rng.random() < 0.3:
                flags |= os.O_EXCL
        # O_TRUNC with O_RDONLY is unspecified by POSIX: not generated.
        if acc != os.O_RDONLY and self.rng.random() < 0.3:
            flags |= os.O_TRUNC
        if self.rng.random() < 0.25:
            flags |= os.O_APPEND
        if self.rng.random() < 0.04:
            flags |= os.O_NOFOLLOW
        if self.rng.random() < 0.04:
            flags |= os.O_DIRECTORY
        kinds = {"file", "symlink", "dir", "fifo", "socket"} if self.rng.random() < 0.2 else {"file", "symlink"}
        rel = self.pick_path(kinds)
        st = self.ref_stat(rel)
        if st is not None and stat.S_ISFIFO(st.st_mode):
            flags |= os.O_NONBLOCK  # never block on a fifo
        hid = self.next_hid
        self.next_hid += 1
        actions = [{"op": "open", "path": rel, "flags": flags, "mode": self.rng.choice(MODES), "new": hid}]
        if len(self.ex.handles) >= self.ex.max_fds:
            actions.insert(0, {"op": "close", "h": next(iter(self.ex.handles))})
        return actions

    def fd_action(self, op, **params):
        h = self.pick_handle()
        if h is None:
            return self.gen_open()
        return [dict(op=op, h=h.hid, **{k: (v(h) if callable(v) else v) for k, v in params.items()})]

    def gen_close(self):
        return self.fd_action("close")

    def gen_dup(self):
        if len(self.ex.handles) >= self.ex.max_fds:
            return self.gen_close()
        hid = self.next_hid
        self.next_hid += 1
        return self.fd_action("dup", new=hid)

    def on_fifo(self, h):
        # Data through a fifo is the kernel's pipe code on both sides; only the mtime
        # stamp it makes differs: FUSE does not send it to the filesystem (without
        # writeback caching), so it is lost. Fifos are read from, never written to
        # (pwrite gives ESPIPE without writing: kept).
        st = self.fd_stat(h)
        return st is not None and stat.S_ISFIFO(st.st_mode)

    def gen_write(self):
        h = self.pick_handle()
        if h is None:
            return self.gen_open()
        if self.on_fifo(h):
            return self.gen_read()
        return [{"op": "write", "h": h.hid, "data": self.rand_data()}]

    def gen_pwrite(self):
        def off(h):
            size, r = self.fd_size(h), self.rng.random()
            return self.rng.randint(0, size) if r < 0.4 else size + self.rng.randint(0, 70000) if r < 0.8 else self.rng.randint(0, 1200000)
        return self.fd_action("pwrite", off=off, data=lambda h: self.rand_data())

    def gen_lseek(self):
        h = self.pick_handle()
        if h is None:
            return self.gen_open()
        st = self.fd_stat(h)
        if st is None or not stat.S_ISREG(st.st_mode):
            # Directory offsets are opaque, filesystem-specific cookies (ext4 hashes):
            # lseek is compared on regular files only.
            return self.gen_read()
        whence = self.rng.choice(sorted(WHENCE))
        off = self.rng.randint(0, st.st_size + 100000) if whence == "SEEK_SET" else self.rng.randint(-1000, 100000)
        return [{"op": "lseek", "h": h.hid, "off": off, "whence": whence}]

    def gen_read(self):
        return self.fd_action("read", n=lambda h: self.rng.choice([1, 100, 4096, 65536, 300000, self.rng.randint(0, 200000)]))

    def gen_pread(self):
        h = self.pick_handle()
        if h is None:
            return self.gen_open()
        size = self.fd_size(h)
        return [{"op": "pread", "h": h.hid, "off": self.rng.randint(0, size + 1000),
                 "n": self.rng.choice([1, 4096, 65536, size + 10, self.rng.randint(0, 300000)])}]

    def gen_ftruncate(self):
        return self.fd_action("ftruncate", size=lambda h: self.rand_size(self.fd_size(h)))

    def gen_fallocate(self):
        # Mode 0 only (other modes are unsupported by design), and always extending the
        # file: ext4 also stamps mtime on a fallocate inside the file, which POSIX does not
        # ask for and Ubiquity does not do (there is nothing to allocate).
        h = self.pick_handle()
        if h is None:
            return self.gen_open()
        size = self.fd_size(h)
        off = self.rng.randint(0, size + 50000)
        return [{"op": "fallocate", "h": h.hid, "off": off, "len": max(0, size - off) + self.rng.randint(1, 100000)}]

    def gen_truncate(self):
        rel = self.pick_path({"file", "symlink"})
        st = self.ref_stat(rel)
        return [{"op": "truncate", "path": rel, "size": self.rand_size(st.st_size if st else 0)}]

    def gen_fsync(self):
        return self.fd_action("fsync", data_only=lambda h: self.rng.random() < 0.3)

    def gen_fstat(self):
        return self.fd_action("fstat")

    def gen_fchmod(self):
        return self.fd_action("fchmod", mode=lambda h: self.rng.choice(MODES))

    def gen_futimens(self):
        return self.fd_action("futimens", times=lambda h: [self.rand_time_ns(), self.rand_time_ns()])

    def gen_fxattr(self):
        if not self.ex.xattrs:
            return self.gen_fstat()
        sub = self.rng.choice(["set", "set", "get", "remove"])
        return self.fd_action("fxattr", sub=sub, name=self.rng.choice(XATTR_NAMES),
                              value=self.rng.randbytes(self.rng.randint(0, 200)).hex() if sub == "set" else None)

    def gen_stat(self):
        return [{"op": "stat", "path": self.pick_path(existing=0.8), "follow": self.rng.random() < 0.5}]

    def gen_listdir(self):
        rel = self.pick_path({"dir", "symlink"}, existing=0.8) if self.rng.random() < 0.9 else ""
        return [{"op": "listdir", "path": rel}]

    def gen_unlink(self):
        kinds = {"file", "symlink", "fifo", "socket"} if self.rng.random() < 0.9 else None
        return [{"op": "unlink", "path": self.maybe_slash(self.pick_path(kinds, 0.8))}]

    def gen_mkdir(self):
        return [{"op": "mkdir", "path": self.maybe_slash(self.pick_path(existing=0.3)), "mode": self.rng.choice(DIR_MODES)}]

    def gen_rmdir(self):
        return [{"op": "rmdir", "path": self.maybe_slash(self.pick_path({"dir"} if self.rng.random() < 0.9 else None, 0.8))}]

    def rename_pair(self):
        src = self.pick_path(existing=0.85)
        sst = self.ref_stat(src, follow=False)
        is_dir = sst is not None and stat.S_ISDIR(sst.st_mode)
        k = self.rng.random()
        if k < 0.35:
            dst = self.pick_path(existing=0.9)          # most likely over something existing
        elif k < 0.45 and is_dir:
            dst = src + "/" + self.rand_name()           # into its own subtree: EINVAL
        else:
            dst = self.pick_path(existing=0.0)           # a new name, maybe in a subdirectory
        # Keep the tree shallow: a directory that would end up too deep goes to the root.
        if is_dir and not dst.startswith(src + "/"):
            height = max([rel.count("/") - src.count("/") for rel, _ in self.ref_entries() if rel.startswith(src + "/")] + [0])
            if dst.count("/") + 1 + height > MAX_DEPTH + 1:
                dst = self.rand_name()
        return self.maybe_slash(src), self.maybe_slash(dst)

    def gen_rename(self):
        src, dst = self.rename_pair()
        return [{"op": "rename", "src": src, "dst": dst, "flags": None}]

    def gen_renameat2(self):
        src, dst = self.rename_pair()
        return [{"op": "rename", "src": src, "dst": dst,
                 "flags": self.rng.choice([0, RENAME_NOREPLACE, RENAME_EXCHANGE, RENAME_EXCHANGE])}]

    def gen_symlink(self):
        rel = self.pick_path(existing=0.3)
        k = self.rng.random()
        if k < 0.6:   # relative, never escaping the tree
            target = "../" * self.rng.randint(0, rel.count("/")) + self.rand_path(2)
        elif k < 0.7:
            target = os.path.basename(rel)                # a loop
        elif k < 0.8:
            target = "nonexistent/" + self.rand_name()    # dangling
        else:
            target = self.rand_name() + " \u2192 " + self.rand_name()
        return [{"op": "symlink", "target": target, "path": rel}]

    def gen_readlink(self):
        return [{"op": "readlink", "path": self.pick_path({"symlink"} if self.rng.random() < 0.9 else None, 0.9)}]

    def gen_link(self):
        src = self.pick_path({"file", "symlink", "fifo", "socket"} if self.rng.random() < 0.9 else None, 0.9)
        return [{"op": "link", "src": src, "dst": self.pick_path(existing=0.2), "follow": self.rng.random() < 0.3}]

    def gen_chmod(self):
        return [{"op": "chmod", "path": self.pick_path(existing=0.8), "mode": self.rng.choice(MODES)}]

    def gen_chown(self):
        return [{"op": "chown", "path": self.pick_path(existing=0.8), "uid": self.rng.choice([0, 1000, 65534, -1]),
                 "gid": self.rng.choice([0, 1000, 65534, -1]), "follow": self.rng.random() < 0.7}]

    def gen_utime(self):
        rel = self.pick_path(existing=0.85) if self.rng.random() < 0.95 else ""
        times = [self.rand_time_ns(), self.rand_time_ns()] if self.rng.random() < 0.85 else None
        return [{"op": "utime", "path": rel, "times": times, "follow": self.rng.random() < 0.7}]

    def gen_xattr(self):
        if not self.ex.xattrs:
            return self.gen_stat()
        rel = self.pick_path(existing=0.85) if self.rng.random() < 0.95 else ""
        k = self.rng.random()
        sub = "set" if k < 0.4 else "get" if k < 0.6 else "list" if k < 0.8 else "remove"
        a = {"op": "xattr", "path": rel, "sub": sub, "name": self.rng.choice(XATTR_NAMES), "follow": self.rng.random() < 0.8}
        if sub == "set":
            a["value"] = self.rng.randbytes(self.rng.randint(0, 200)).hex()
            a["flags"] = self.rng.choice([0, 0, os.XATTR_CREATE, os.XATTR_REPLACE])
        return [a]

    def gen_mknod(self):
        return [{"op": "mknod", "path": self.pick_path(existing=0.2),
                 "kind": self.rng.choice(["S_IFIFO", "S_IFIFO", "S_IFSOCK", "S_IFREG"]), "mode": self.rng.choice([0o644, 0o600, 0o666])}]


# ---------------------------------------------------------------------------------------
# One run: fresh mount + reference, then actions from the generator or from a list


ACTIVE = {}  # the run the watchdog watches


class Run:
    def __init__(self, binary, args, tag=""):
        self.args = args
        self.base = "/tmp/ubiquity-test-%d-diff%s" % (os.getpid(), tag)
        remove_tree(self.base)
        os.makedirs(self.base)
        # Each side sits three private directory levels deep, so that a relative symlink
        # which a rename carried above its tree's root (`../../x` moved to the root)
        # resolves to a different place for each side, never to one shared file.
        self.ref = os.path.join(self.base, "r", "1", "2", "ref")
        os.makedirs(self.ref)
        os.makedirs(os.path.join(self.base, "m", "1", "2"))
        self.mount = Mount(binary, self.base)
        self.ex = None
        self.cleaned = False
        self.cleanup_lock = threading.Lock()

    def start(self):
        self.mount.mount()
        self.ex = Executor(self.mount, self.ref, reference_supports_xattrs(self.ref), set(self.args.relax),
                           self.args.history, self.args.verbose, self.args.max_fds)
        self.ex.compare_ctime = reference_has_fine_ctime(self.ref)

    def cleanup(self, keep=False):
        # A signal arriving now is delivered once the cleanup is done.
        blocked = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}
        old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, blocked)
        try:
            with self.cleanup_lock:  # the watchdog thread may clean up too
                if self.cleaned:
                    return []
                try:
                    return self._cleanup(keep)
                finally:
                    self.cleaned = True
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)

    def _cleanup(self, keep):
        if self.ex is not None:
            for h in list(self.ex.handles.values()):
                for fd in h.fds.values():
                    try:
                        os.close(fd)
                    except OSError:
                        pass
        problems = self.mount.force_cleanup()
        if not problems and not keep:
            remove_tree(self.base)
        return problems


def remove_tree(path):
    """shutil.rmtree, once every directory is open to its owner again (with --user, a
    mode such as 000 keeps even the owner from listing or emptying a directory)."""
    stack = [path]
    while stack:
        d = stack.pop()
        try:
            os.chmod(d, 0o700)
            with os.scandir(d) as it:
                stack.extend(e.path for e in it if e.is_dir(follow_symlinks=False))
        except OSError:
            pass
    shutil.rmtree(path, ignore_errors=True)


def reference_has_fine_ctime(ref):
    """Whether a ctime change right after a stat is always visible on the reference: with
    multigrain timestamps (ext4 and xfs since Linux 6.13) it is; with coarse ones a change
    within the same jiffy is not, and the ctime comparison would be flaky."""
    probe = os.path.join(os.path.dirname(ref), "ctime-probe")   # beside the tree, on its filesystem
    try:
        os.close(os.open(probe, os.O_CREAT | os.O_WRONLY, 0o644))
        for _ in range(20):
            before = os.lstat(probe).st_ctime_ns
            os.chmod(probe, 0o644)
            if os.lstat(probe).st_ctime_ns == before:
                print("note: the reference's ctime is coarse-grained (no multigrain timestamps): ctime not compared")
                return False
        return True
    finally:
        os.unlink(probe)


def reference_supports_xattrs(ref):
    try:
        os.setxattr(ref, "user.probe", b"1")
        os.removexattr(ref, "user.probe")
        return True
    except OSError as e:
        print("note: the reference directory has no user xattrs (%s): xattr operations disabled" % errname(e.errno))
        return False


def generate_and_run(run, seed, ops, checkpoint, remount_every):
    ex = run.ex
    gen = Generator(seed, ex)
    remount_at = set()
    if ops >= 2:
        remount_at.add(ops // 2)
        remount_at.update(range(remount_every, ops, remount_every))
    ex.run({"op": "checkpoint", "why": "start"})
    for i in range(1, ops + 1):
        ex.step = i
        for a in gen.step():
            ex.run(a)
        if i % checkpoint == 0:
            ex.run({"op": "checkpoint", "why": "after op %d" % i})
        if i in remount_at:
            ex.run({"op": "remount", "why": "mid-run, after op %d" % i})
    ex.step = ops + 1
    ex.run({"op": "checkpoint", "why": "end"})
    ex.run({"op": "remount", "why": "end"})
    return gen.counts


def replay_actions(run, actions):
    ex = run.ex
    for i, a in enumerate(actions, 1):
        ex.step = i
        ex.run(a)
    ex.step = len(actions) + 1
    ex.run({"op": "checkpoint", "why": "end of replay"})
    ex.close_all()


OBSERVING = {"stat", "listdir", "readlink", "pread", "fstat", "checkpoint"}


def is_observation(a):
    return a["op"] in OBSERVING or (a["op"] in ("xattr", "fxattr") and a["sub"] in ("get", "list"))


def minimize(binary, args, actions, pattern, progress_file):
    """ddmin over the action list: a 1-minimal list whose replay still fails with a message
    matching `pattern`. Each reduction is written to `progress_file`, so an interrupted
    minimization can go on from there with --replay-actions."""
    trials = [0]

    def fails(cand):
        trials[0] += 1
        run = Run(binary, args, tag="-min")
        ACTIVE["run"] = run
        try:
            run.start()
            replay_actions(run, cand)
            return False
        except TestFailure as e:
            return re.search(pattern, str(e)) is not None
        finally:
            problems = run.cleanup()
            if problems:
                raise SystemExit("minimize: cleanup failed: %s" % problems)

    def keep(cand):
        with open(progress_file, "w") as f:
            json.dump(cand, f, ensure_ascii=False, indent=0)
        print("minimize: %d actions (%d trials)" % (len(cand), trials[0]), flush=True)
        return cand

    if not fails(actions):
        print("minimize: the actions do not fail on replay (timing-dependent?)")
        return actions
    # First, in one go, what only observes (its failure is the last action: kept).
    cand = [a for a in actions[:-1] if not is_observation(a)] + actions[-1:]
    if len(cand) < len(actions) and fails(cand):
        actions = keep(cand)
    n = 2
    while len(actions) >= 2:
        chunk = max(1, len(actions) // n)
        reduced = False
        # From the end backwards: late actions depend on early ones, rarely the reverse.
        for start in reversed(range(0, len(actions), chunk)):
            cand = actions[:start] + actions[start + chunk:]
            if cand and fails(cand):
                actions = keep(cand)
                n = max(n - 1, 2)
                reduced = True
                break
        if not reduced:
            if chunk == 1:
                break
            n = min(len(actions), n * 2)
    print("minimize: done, %d actions after %d trials" % (len(actions), trials[0]))
    return actions


# ---------------------------------------------------------------------------------------
# Main



def preflight(binary):
    """None when the binary and /dev/fuse are usable; else the exit status, after saying
    why (77 = skip, except under CI=true where a test that cannot mount fails)."""
    if not binary or not os.access(binary, os.X_OK):
        print("FAIL: set UBIQUITY to the ubiquity binary (got %r)" % binary)
        return 1
    try:
        os.close(os.open("/dev/fuse", os.O_RDWR))
    except OSError as e:
        if os.environ.get("CI") == "true":
            print("FAIL: /dev/fuse cannot be opened (%s) and CI=true: the FUSE tests must run" % e)
            return 1
        print("SKIP: /dev/fuse cannot be opened (%s)" % e)
        return 77
    return None

def run_as_user(args):
    """--user: this test again, run by that user. Root lets others open /dev/fuse for the
    run (fusermount3 needs it; restored after) and removes what the run leaves, which
    directories of mode 000 may keep the user from removing."""
    if os.geteuid() != 0:
        print("FAIL: --user needs root (it starts the test as that user)")
        return 1
    import glob
    import pwd
    try:
        gid, home = pwd.getpwuid(args.user).pw_gid, pwd.getpwuid(args.user).pw_dir
    except KeyError:
        gid, home = args.user, "/nonexistent"
    argv, skip = [], False
    for a in sys.argv[1:]:
        if skip:
            skip = False
        elif a == "--user":
            skip = True
        elif not a.startswith("--user="):
            argv.append(a)
    child = ["setpriv", "--reuid=%d" % args.user, "--regid=%d" % gid, "--clear-groups",
             sys.executable, os.path.abspath(sys.argv[0])] + argv + ["--seed", str(args.seed)]
    old_mode = stat.S_IMODE(os.stat("/dev/fuse").st_mode)
    os.chmod("/dev/fuse", old_mode | 0o666)
    proc = None
    try:
        proc = subprocess.Popen(child, env=dict(os.environ, HOME=home, UBQ_DIFF_USER=str(args.user)))
        while True:
            try:
                return proc.wait()
            except KeyboardInterrupt:
                proc.send_signal(signal.SIGINT)
    finally:
        os.chmod("/dev/fuse", old_mode)
        if proc is not None and not args.keep:
            for base in glob.glob("/tmp/ubiquity-test-%d-diff*" % proc.pid):
                for mnt in glob.glob(os.path.join(base, "m", "1", "2", "mnt")):
                    if is_mounted(mnt):
                        subprocess.run(["fusermount3", "-u", "-z", mnt], capture_output=True, timeout=30)
                shutil.rmtree(base, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=None, help="random seed (default: random)")
    ap.add_argument("--ops", type=int, default=DEFAULT_OPS, help="random operations (default %d)" % DEFAULT_OPS)
    ap.add_argument("--checkpoint", type=int, default=DEFAULTS["checkpoint"], help="full tree comparison every N ops")
    ap.add_argument("--remount-every", type=int, default=DEFAULTS["remount_every"],
                    help="unmount + mount every N ops, besides the one at half-way and the one at the end")
    ap.add_argument("--max-fds", type=int, default=DEFAULTS["max_fds"], help="descriptors kept open at once")
    ap.add_argument("--history", type=int, default=20, help="operations shown on failure")
    ap.add_argument("--hang-timeout", type=float, default=60, help="seconds one step may take before it counts as a hang")
    ap.add_argument("--save-actions", metavar="FILE", help="on failure, write the executed actions (JSON) to FILE")
    ap.add_argument("--replay-actions", metavar="FILE", help="run the actions saved in FILE instead of random ones")
    ap.add_argument("--minimize", metavar="REGEX", nargs="?", const=".",
                    help="on failure, shrink the failing action list to a minimal one whose failure matches REGEX "
                         "(default: any failure) and print it")
    ap.add_argument("--relax", action="append", default=[], choices=["mtime", "ctime"],
                    help="triage only, never in CI: mtime: stop comparing mtimes, to look for further differences "
                         "while a known mtime bug is unfixed; ctime: a ctime difference does not stop the run, "
                         "all of them are listed by class at the end (the run still fails)")
    ap.add_argument("--user", type=int, metavar="UID",
                    help="run as this unprivileged user, on its own mount (no allow_other: the daemon checks "
                         "permissions itself), against a reference directory of its own; needs root")
    ap.add_argument("--keep", action="store_true", help="keep the temp directory (the mount is removed anyway)")
    ap.add_argument("-v", "--verbose", action="store_true", help="print every operation")
    args = ap.parse_args()
    if args.seed is None:
        args.seed = random.SystemRandom().randrange(1, 2**31)

    binary = os.environ.get("UBIQUITY")
    script = os.path.relpath(os.path.abspath(sys.argv[0]))
    if script.startswith("../"):
        script = os.path.abspath(sys.argv[0])
    replay = "UBIQUITY=%s %s --seed %d --ops %d" % (shlex.quote(binary or "..."), shlex.quote(script), args.seed, args.ops)
    for opt, default in DEFAULTS.items():
        if getattr(args, opt) != default:
            replay += " --%s %d" % (opt.replace("_", "-"), getattr(args, opt))
    for r in args.relax:
        replay += " --relax " + r
    if args.replay_actions:
        replay = "UBIQUITY=%s %s --replay-actions %s" % (shlex.quote(binary or "..."), shlex.quote(script),
                                                         shlex.quote(args.replay_actions))
    if os.environ.get("UBQ_DIFF_USER"):
        replay += " --user " + os.environ["UBQ_DIFF_USER"]
    if args.user is not None:
        return run_as_user(args)
    print("t-differential: seed %d, ops %d%s" % (args.seed, args.ops,
          ", as uid %d" % os.geteuid() if os.geteuid() != 0 else ""), flush=True)
    print("replay: %s" % replay, flush=True)

    rc = preflight(binary)
    if rc is not None:
        return rc
    os.umask(0o022)
    run = Run(binary, args)
    ACTIVE["run"] = run
    state = {"failed": False}
    atexit.register(lambda: run.cleanup(keep=args.keep))

    def on_signal(signum, _frame):
        raise SystemExit(128 + signum)
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, on_signal)

    hang = {"fired": False}

    def watchdog():
        # Watches whichever run is active (the main one or a minimizer trial). On a hang it
        # kills that run's daemon (started by this test): the kernel then fails the pending
        # requests (ECONNABORTED/ENOTCONN) and auto_unmount removes the mount.
        while True:
            time.sleep(2)
            r = ACTIVE.get("run")
            ex = r.ex if r is not None else None
            if ex is None or r.cleaned or time.monotonic() - ex.last_progress <= args.hang_timeout:
                continue
            if r is run:
                hang["fired"] = True
                print("\nFAIL (seed %d): no progress for %.0f s (a hang in the filesystem) during: %s\n"
                      "last operations:\n  %s\ndaemon log tail:\n%sreplay: %s"
                      % (args.seed, args.hang_timeout, ex.current, "\n  ".join(ex.history), r.mount.log_tail(), replay), flush=True)
            else:
                print("minimize: trial hung during %s; killing its daemon" % ex.current, flush=True)
            ex.last_progress = time.monotonic()
            r.mount.kill_daemon()
            time.sleep(30)
            if r is run and not r.cleaned and time.monotonic() - ex.last_progress > 25:
                r.cleanup()
                os._exit(1)
    threading.Thread(target=watchdog, daemon=True).start()

    rc = 1
    t0 = time.monotonic()
    counts = None
    failure = None
    try:
        run.start()
        if args.replay_actions:
            with open(args.replay_actions) as f:
                replay_actions(run, json.load(f))
        else:
            counts = generate_and_run(run, args.seed, args.ops, args.checkpoint, args.remount_every)
        run.mount.unmount()
        rc = 0
    except TestFailure as e:
        failure = e
        state["failed"] = True
        print("\nFAIL (seed %d): %s" % (args.seed, e), flush=True)
        if run.ex is not None:
            print("last %d operations ([step] call -> reference result, MOUNT: result where it differs):" % len(run.ex.history))
            for line in run.ex.history:
                print("  " + line)
        print("daemon log tail (%s):\n%s" % (run.mount.log, run.mount.log_tail()))
        print("replay: %s" % replay, flush=True)
    except (SystemExit, KeyboardInterrupt) as e:
        state["failed"] = True
        print("\nFAIL (seed %d): interrupted (%s); cleaning up" % (args.seed, e or "SIGINT"), flush=True)
    except BaseException as e:  # noqa: BLE001 - report, clean up, fail
        state["failed"] = True
        if not hang["fired"]:
            import traceback
            traceback.print_exc()
            print("\nFAIL (seed %d): %s: %s" % (args.seed, type(e).__name__, e))
            if run.ex is not None:
                print("last operations:\n  " + "\n  ".join(run.ex.history))
            print("replay: %s" % replay, flush=True)
    finally:
        problems = run.cleanup(keep=args.keep and state["failed"])
        if problems:
            print("FAIL: cleanup: %s" % "; ".join(problems))
            rc = 1
        elif args.keep and state["failed"]:
            print("kept %s" % run.base)

    if failure is not None and run.ex is not None:
        # The executed actions, to replay or minimize a failure that depends on timing.
        actions = list(run.ex.executed)
        saved = args.save_actions or os.path.join(os.environ.get("TMPDIR", "/tmp"), "t-differential-failure-%d.json" % args.seed)
        try:
            with open(saved, "w") as f:
                json.dump(actions, f, ensure_ascii=False, indent=0)
            print("saved the %d executed actions: replay with %s %s --replay-actions %s [--minimize REGEX]"
                  % (len(actions), "UBIQUITY=" + shlex.quote(binary), shlex.quote(script), shlex.quote(saved)))
        except OSError as e:
            print("could not save the actions to %s: %s" % (saved, e))
        if args.minimize:
            path = re.sub(r"\.json$", "", saved) + ".min.json"
            small = minimize(binary, args, actions, args.minimize, path)
            with open(path, "w") as f:
                json.dump(small, f, ensure_ascii=False, indent=0)
            print("minimal failing actions (%s):" % path)
            for a in small:
                print("  " + json.dumps(a, ensure_ascii=False))
            margs = argparse.Namespace(**vars(args))
            margs.verbose = True
            margs.history = 1000
            r2 = Run(binary, margs, tag="-min")
            ACTIVE["run"] = r2
            try:
                r2.start()
                replay_actions(r2, small)
            except TestFailure as e:
                print("minimal replay fails: %s" % str(e).splitlines()[0])
            finally:
                r2.cleanup()
    if run.ex is not None and run.ex.ctime_diffs:
        # --relax ctime: every class of ctime difference, with its first occurrence.
        print("\nctime differences (--relax ctime), by class: count, operation, object, which side changed, first occurrence:")
        for (opc, obj, how), (n, first) in sorted(run.ex.ctime_diffs.items()):
            print("  %4d  %s | %s | %s | %s" % (n, opc, obj, how, first))
        if rc == 0:
            print("FAIL (seed %d): %d ctime differences in %d classes; replay: %s"
                  % (args.seed, sum(n for n, _ in run.ex.ctime_diffs.values()), len(run.ex.ctime_diffs), replay))
            rc = 1
    if rc == 0:
        if counts:
            print("op mix: " + ", ".join("%s %d" % kv for kv in sorted(counts.items())))
        if run.ex is not None and run.ex.eacces_later:
            print("differences by design (--user; see Executor.faults): " +
                  ", ".join("%s %d" % kv for kv in sorted(run.ex.eacces_later.items())))
        if args.replay_actions:
            print("t-differential: PASS replay of %s in %.1f s" % (args.replay_actions, time.monotonic() - t0))
        else:
            print("t-differential: PASS seed %d, %d ops in %.1f s" % (args.seed, args.ops, time.monotonic() - t0))
    return rc


if __name__ == "__main__":
    sys.exit(main())
