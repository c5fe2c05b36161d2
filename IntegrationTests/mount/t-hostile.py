#!/usr/bin/env python3
# ubq-timeout: 150
"""Hostile system calls: a seeded generator of system calls with extreme arguments, run
against a fresh Ubiquity mount and against a plain directory on the local disk.

Offsets and sizes at 0, 2^31±1, 2^32±1, 2^40, ext4's limit 2^44-4096, 2^50, 2^62, 2^63-1
and negative; fallocate modes; copy_file_range across files; truncate up and down; xattrs
of 0 bytes and of the maximum size and over it; names of 255, 256, 1024 and 1025 bytes
(ASCII, UTF-8, not UTF-8); directory chains deeper than PATH_MAX; symlink targets of 4095
and 4096 bytes; mknod of fifos, sockets and (as root) devices; listing a directory
descriptor after rewinddir. Every call's result (value or errno name) must be the same on
both sides unless the difference is listed in INTENDED below with its reason; after every
call the daemon must be alive (its pid, the mount still answering), under --rss-limit-mib
of resident memory and the call under --slow-call seconds (no work or memory in proportion
to a size a call names); every 100 operations and at the end both trees are compared
(bounded content hashes); at the end the mount is unmounted cleanly (fusermount3 -u, the
daemon must exit 0) and `ubiquity fsck` must find the store clean (after a failure too).

    UBIQUITY=/path/to/ubiquity IntegrationTests/mount/t-hostile.py [--seed N] [--ops K] [-v]
    UBIQUITY=... IntegrationTests/mount/t-hostile.py --seed 1234 --ops 100000    # by hand
    UBIQUITY=... IntegrationTests/mount/t-hostile.py --keep-going --ops 5000     # triage: list every distinct difference

The seed comes first in the output; a failure prints the seed, the op index, the op (as
Python), both results, the last operations, the daemon's log and the command that replays
it. A failing seed becomes a regression test: add it to REGRESSION_SEEDS (each replayed up
to its op count before the random seed, unless --seed is given). The default 5000 ops take
about 10 s (with the regression seeds about 15 s) on an idle 2-core machine; 100000 about
7 minutes.

Exit 0: pass. Exit 77 (IntegrationTests/mount/run.sh's SKIP): /dev/fuse cannot be opened and CI is
not "true". Exit 1: a difference, a dead/hung/oversized daemon, an unclean unmount or fsck.
Standard library only. Mounting conventions as in t-differential.py (whose small helpers
it imports): everything under /tmp/ubiquity-test-<pid>-hostile/, each mount recorded in
$UBQ_STATE_FILE for run.sh's sweep, the daemon ended by its pid only.
"""

import argparse
import atexit
import collections
import ctypes
import errno
import hashlib
import importlib.util
import os
import random
import re
import resource
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def _load_differential():
    """t-differential.py's helpers (is_mounted, errname), without copying them."""
    sys.dont_write_bytecode = True   # no __pycache__ next to the tests
    spec = importlib.util.spec_from_file_location("t_differential", os.path.join(HERE, "t-differential.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


_tdiff = _load_differential()
is_mounted = _tdiff.is_mounted
errname = _tdiff.errname

# ---------------------------------------------------------------------------------------
# Regression seeds: seeds that found a bug, replayed (up to their op count) before the
# random seed of every run. (seed, ops, what it found)

REGRESSION_SEEDS = [
    # found against 639919d
    (304, 1, "ftruncate to 2**63-1: the daemon traps (arithmetic overflow in Attributes.blocks)"),
    (346, 18, "fsync of a file grown to 16 TiB: memory in proportion to its size"),
    (357, 2, "a write ending past 2**44-4096, within the documented 2**62: EFBIG"),
    (314, 7, "fallocate mode 0 ending past 2**62: accepted"),
    (367, 23, "fallocate KEEP_SIZE: EOPNOTSUPP"),
    (319, 2, "stat of a 256-byte name: ENOENT instead of ENAMETOOLONG"),
    (315, 3, "lstat of a 1025-byte name: ENOENT instead of ENAMETOOLONG"),
    (307, 14, "mkdir of a name that is not UTF-8: EILSEQ"),
    (303, 5, "mknod of a character device (as root): EPERM"),
    (329, 3, "mknod of a block device (as root): EPERM"),
    (302, 2, "listdir of a directory descriptor after rewinddir: the listing of its opendir"),
    (313, 3, "setxattr of the empty name 'user.': EOPNOTSUPP instead of EINVAL"),
    (305, 8, "getxattr of the empty name 'user.': ENODATA instead of EINVAL"),
    # found against cd1dcb6
    (311, 14, "lseek(SEEK_DATA) at a negative offset: EINVAL instead of ENXIO"),
]

# ---------------------------------------------------------------------------------------
# Extreme values

KiB, MiB = 1 << 10, 1 << 20
EXT4_MAX = 2**44 - 4096  # ext4 (extents, 4 KiB blocks): s_maxbytes, 16 TiB - 4 KiB

# Sizes for truncate/ftruncate/fallocate lengths/copy counts.
SIZES = [0, 1, 4095, 4096, 2**31 - 1, 2**31, 2**31 + 1, 2**32 - 1, 2**32, 2**32 + 1, 2**40,
         EXT4_MAX, 2**44, 2**50, 2**62 - 1, 2**62, 2**63 - 1, -1, -2**63]
# Offsets for pwrite/pread/lseek/fallocate/copy_file_range.
OFFSETS = SIZES + [EXT4_MAX - 4, 2**63 - 8, 2**63 - 2]
# pread/read counts: never more than 1 MiB (the test allocates the buffer).
COUNTS = [0, 1, 4095, 4096, 65536, 131073, 1 << 20]
# copy_file_range counts: the kernel copies at most to the end of the source, and the
# generator keeps the bytes actually copied under 1 MiB.
COPY_COUNTS = [0, 1, 4096, 65536, 1 << 20, 2**31 - 1, 2**31, 2**32 + 1, 2**62, 2**63 - 1]

NUM_NAMES = {}
for _base in (31, 32, 40, 44, 50, 62, 63):
    for _d in (-8, -4, -2, -1, 0, 1, 2):
        NUM_NAMES[2**_base + _d] = "2**%d%s" % (_base, "" if _d == 0 else "%+d" % _d)
        NUM_NAMES[-(2**_base) + _d] = "-2**%d%s" % (_base, "" if _d == 0 else "%+d" % _d)
NUM_NAMES[EXT4_MAX] = "2**44-4096"
NUM_NAMES[EXT4_MAX - 4] = "2**44-4100"


def cls(v):
    """The class of an extreme value, for grouping findings (--keep-going)."""
    if v is None:
        return "current offset"
    if v < 0:
        return "negative"
    if v == 0:
        return "0"
    if v <= 2**32 + 1:
        return "<= 2**32+1"
    if v <= EXT4_MAX:
        return "<= 2**44-4096"
    if v < 2**63 - 8:
        return "> 2**44-4096"
    return ">= 2**63-8"


def show(rel):
    """A path for messages, its long components abbreviated: 'd/<256-byte name>'."""
    def one(c):
        n = len(os.fsencode(c))
        kind = "" if c.isascii() else ", not UTF-8" if any("\udc80" <= ch <= "\udcff" for ch in c) else ", UTF-8"
        return c if n <= 40 else "<%d-byte name%s>" % (n, kind)
    return repr("/".join(one(c) for c in rel.split("/"))) if rel else "'.'"


def xshow(name):
    """An xattr name for messages, as a Python expression."""
    return repr(name) if len(name) <= 40 else "'user.' + 'x' * %d" % (len(name) - 5)


def num(v):
    """A readable Python literal for an extreme value."""
    if v is None:
        return "None"
    return NUM_NAMES.get(v, str(v))


FALLOC_FL_KEEP_SIZE = 0x01
FALLOC_FL_PUNCH_HOLE = 0x02
FALLOC_FL_COLLAPSE_RANGE = 0x08
FALLOC_FL_ZERO_RANGE = 0x10
FALLOC_FL_INSERT_RANGE = 0x20
FALLOC_FL_UNSHARE_RANGE = 0x40
FALLOC_MODES = {0: "0", 1: "KEEP_SIZE", 3: "PUNCH_HOLE|KEEP_SIZE", 2: "PUNCH_HOLE", 0x10: "ZERO_RANGE",
                0x11: "ZERO_RANGE|KEEP_SIZE", 8: "COLLAPSE_RANGE", 0x20: "INSERT_RANGE", 0x40: "UNSHARE_RANGE"}
ALLOCATING_MODES = {0, 1, 0x10, 0x11, 0x40}   # on ext4 these reserve real blocks for [off, off+len)

WHENCE = {"SEEK_SET": os.SEEK_SET, "SEEK_CUR": os.SEEK_CUR, "SEEK_END": os.SEEK_END,
          "SEEK_DATA": os.SEEK_DATA, "SEEK_HOLE": os.SEEK_HOLE}

# Names at and over the limits (bytes): NAME_MAX = 255; 1024 is FUSE's own limit for a
# name in a request. UTF-8 ones count bytes, not characters; "b" ones are bytes that are
# not UTF-8 at all (0xff: Python's surrogateescape), which ext4 takes like any other.
LONG_NAMES = {"255": "L" * 255, "256": "L" * 256, "255u": "\u00e9" * 127 + "L", "256u": "\u00e9" * 128,
              "255b": "\udcff" * 255, "256b": "\udcff" * 256, "1024": "M" * 1024, "1025": "M" * 1025}
XATTR_NAMES = ["user.a", "user.b", "user." + "x" * 250, "user." + "x" * 251, "user."]
XATTR_SIZES = [0, 1, 255, 3000, 4096, 65535, 65536, 65537, 1 << 20]
PATH_MAX = 4096
DEEP_COMPONENT_LENGTHS = [1, 100, 200, 254, 255]
STATUS_XATTR_PREFIX = "user.ubiquity."
HIDDEN_ROOT = {".versions", ".conflicts", ".kv"}
TYPE_NAMES = {stat.S_IFREG: "file", stat.S_IFDIR: "dir", stat.S_IFLNK: "symlink", stat.S_IFIFO: "fifo",
              stat.S_IFSOCK: "socket", stat.S_IFCHR: "chr", stat.S_IFBLK: "blk"}
OPEN_FLAGS = [("O_RDWR", os.O_RDWR), ("O_RDONLY", os.O_RDONLY), ("O_WRONLY", os.O_WRONLY),
              ("O_RDWR|O_APPEND", os.O_RDWR | os.O_APPEND), ("O_WRONLY|O_TRUNC", os.O_WRONLY | os.O_TRUNC)]

DEFAULT_OPS = 5000   # about 10 s on an idle 2-core machine
CHECKPOINT_EVERY = 100
MAX_HANDLES = 6

_libc = ctypes.CDLL(None, use_errno=True)
_fallocate = _libc.fallocate
_fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
_fallocate.restype = ctypes.c_int


def fallocate(fd, mode, off, length):
    """fallocate(2) itself (glibc's posix_fallocate would emulate a refusal by writing)."""
    if _fallocate(fd, mode, off, length) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))


# ---------------------------------------------------------------------------------------
# Intended differences. A result that differs between the mount and the reference and is
# not explained by one of these rules is a failure. Each rule is checked in
# Hostile.explain_* and says exactly which pairs of results it accepts; when it accepts a
# pair that leaves the two sides different, the mount is brought back to the reference's
# state with ordinary calls, which must succeed.

INTENDED = {
    "max-file-size":
        "The maximum file size is each filesystem's own. The reference (ext4, 4 KiB blocks) "
        "stops at 2**44-4096 (probed at start): a size or write end past it gives EFBIG (a "
        "write that starts below it is cut short there; lseek past it: EINVAL). Ubiquity's "
        "is MOUNT_MAX_FILE_SIZE, 2**62 (README: EFBIG beyond it for a write, truncate or "
        "fallocate). Accepted, only when the end the call asks for is past the reference's "
        "maximum: up to the mount's maximum, the mount's full success; past it, EFBIG (or a "
        "write that starts below it cut short exactly there, as POSIX allows); EINVAL when "
        "the call also has a negative offset (the kernel checks the limit before the "
        "offsets, so only the reference says EFBIG); for lseek (positions are the kernel's, "
        "not limited by a file size), success or EINVAL; 0 from a copy_file_range that has "
        "nothing to copy (FUSE's kernel side answers it with its own limit, 2**63-1, without "
        "asking the daemon). Anything else (EIO, ENOSPC, a "
        "crash, memory or time in proportion to the size) is a failure. Resync: the mount's "
        "file is truncated back to the reference's size, its offset set to the reference's; a "
        "punch or zero range the mount did is done on the reference's bytes too.",
    "xattr-space":
        "ext4 without the ea_inode feature keeps all xattrs of an inode in the inode and one "
        "4 KiB block (probed at start): a value over ~4 KiB, or several that together fill "
        "the block, get ENOSPC. Ubiquity stores up to 64 KiB per user.* value (README). "
        "Accepted: setxattr gives ENOSPC on the reference and succeeds on the mount; the "
        "mount must then return exactly that value. Resync: the mount's attribute is set "
        "back to the reference's value (or removed).",
    "fallocate-modes":
        "Collapsing, inserting and unsharing ranges give EOPNOTSUPP on the mount (README), "
        "whatever ext4 does with them; the reference is then not called, so both sides stay "
        "the same. Not covered: mode 0, KEEP_SIZE, PUNCH_HOLE|KEEP_SIZE and ZERO_RANGE (with "
        "or without KEEP_SIZE), which must answer and leave the file as ext4 does, and the "
        "kernel's own argument checks (negative offset, length <= 0, bad mode combinations, "
        "EBADF, EISDIR), which come before the filesystem's on both sides.",
    "fallocate-space":
        "An allocating fallocate (mode 0, KEEP_SIZE, ZERO_RANGE) checks the space its range "
        "needs (README). A range past the reference's maximum gets EFBIG there; up to the "
        "mount's maximum the mount answers ENOSPC when the range is larger than the free "
        "space of the mount's filesystem (statvfs, less min-free and the reserve). Accepted "
        "only then: ENOSPC for a length that does not fit; a length that fits must succeed.",
    "seek-data-hole":
        "SEEK_DATA/SEEK_HOLE report holes at each filesystem's own granularity (ext4: 4 KiB "
        "blocks, and unwritten extents count as holes; a FUSE filesystem without an lseek "
        "handler: the kernel treats the whole file as data, which POSIX allows). Errors for "
        "offsets outside [0, size) must agree. Accepted for offsets inside the file: any "
        "answer valid for the mount's own contents: SEEK_DATA: off <= pos < size with only "
        "zeros in [off, pos) (or ENXIO with only zeros in [off, size)); SEEK_HOLE: "
        "off <= pos <= size, and pos == size or a zero at pos (the zero checks sample at most "
        "256 KiB at each end of a range). The summary line counts the times the mount found "
        "no hole where the reference found one. Resync: the mount's offset is set to the "
        "reference's.",
}

# Ubiquity's documented maximum file size (docs/ARCHITECTURE.md, "POSIX details").
# None would mean "not documented": the "max-file-size" rule would then only require the
# mount's answers to be consistent with one limit.
MOUNT_MAX_FILE_SIZE = 2**62


EOPNOTSUPP = errname(errno.EOPNOTSUPP)   # the same number as ENOTSUP on Linux


class Outcome(_tdiff.Outcome):
    """t-differential's result of one call (a value, or an errno name), shown with the
    extreme numbers and long names this test uses."""
    __slots__ = ()

    def __repr__(self):
        v = self.value
        if self.ok and isinstance(v, int) and not isinstance(v, bool):
            return num(v)
        if self.ok and isinstance(v, str) and len(v) > 60:
            return "<%d-byte str %r...>" % (len(os.fsencode(v)), v[:8])
        return super().__repr__()


def call(fn):
    return _tdiff.call(fn, Outcome)


class Discrepancy(Exception):
    """A difference no intended rule explains (or a failed resync / tree check)."""

    def __init__(self, desc, details, sig):
        super().__init__(desc)
        self.desc, self.details, self.sig = desc, details, sig


class DaemonDied(Exception):
    def __init__(self, desc, reason):
        super().__init__(desc)
        self.desc, self.reason = desc, reason


class TestError(Exception):
    """Setup/cleanup trouble (mount, unmount, fsck)."""


# ---------------------------------------------------------------------------------------
# The mount: `ubiquity mount --foreground` as this test's own child (its exit status and
# signal are known), address space capped, resident memory and hangs watched.


STUCK_HANDLERS = []   # run (cleanup) before the watchdog gives up on a blocked test


class Mount:
    def __init__(self, binary, base, mnt, index, args):
        self.binary = binary
        self.mnt = mnt
        self.store = os.path.join(base, "store%d" % index)
        self.backing = os.path.join(base, "backing%d" % index)
        self.xdg = os.path.join(base, "xdg")
        self.log_path = os.path.join(base, "daemon%d.log" % index)
        self.args = args
        self.proc = None
        self.dev = None
        self.killed = None          # why the watchdog killed the daemon
        self.peak_rss = 0
        self.op_started = None      # monotonic start of the call in progress (hang watch)
        self.op_desc = None
        self.stop_watch = threading.Event()

    def start(self):
        os.makedirs(self.mnt, exist_ok=True)
        os.makedirs(self.xdg, exist_ok=True)
        r, w = os.pipe()
        cap = self.args.daemon_as_limit_mib * MiB

        def limit():
            if cap > 0:
                resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [self.binary, "mount", self.mnt, "--store", self.store, "--backing", self.backing,
                 "--foreground", "--ready-fd", str(w)],
                pass_fds=(w,), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                env=dict(os.environ, XDG_DATA_HOME=self.xdg), preexec_fn=limit, start_new_session=True)
        os.close(w)
        # IntegrationTests/mount/run.sh sweeps what a killed scenario left behind from this file.
        if os.environ.get("UBQ_STATE_FILE"):
            try:
                with open(os.environ["UBQ_STATE_FILE"], "a") as f:
                    f.write("mount %s %d\n" % (self.mnt, self.proc.pid))
            except OSError:
                pass
        reply = b""
        deadline = time.monotonic() + 60
        os.set_blocking(r, False)
        while time.monotonic() < deadline and not reply.endswith(b"\n"):
            try:
                chunk = os.read(r, 256)
                if not chunk:
                    break
                reply += chunk
            except BlockingIOError:
                if self.proc.poll() is not None:
                    break
                time.sleep(0.02)
        os.close(r)
        if reply.strip() != b"OK" or not is_mounted(self.mnt):
            raise TestError("mount failed (reply %r, daemon status %r):\n%s" % (reply, self.proc.poll(), self.log_tail()))
        self.dev = os.stat(self.mnt).st_dev
        self.peak_rss = self.rss_kib()
        threading.Thread(target=self.watch, daemon=True).start()

    def rss_kib(self):
        try:
            with open("/proc/%d/status" % self.proc.pid) as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        return int(line.split()[1])
        except (OSError, ValueError):
            pass
        return 0

    def watch(self):
        """Kills the daemon (by its pid) when it holds more than --rss-limit-mib or when one
        call has hung for --hang-timeout seconds: the blocked call then returns
        ENOTCONN/ECONNABORTED and the test reports it."""
        limit_kib = self.args.rss_limit_mib * KiB
        while not self.stop_watch.wait(0.02):
            if self.proc.poll() is not None:
                return
            rss = self.rss_kib()
            self.peak_rss = max(self.peak_rss, rss)
            why = None
            if rss > limit_kib:
                why = "resident memory %d MiB > limit %d MiB (allocating in proportion to a size?) during %s" % (
                    rss // KiB, self.args.rss_limit_mib, self.op_desc)
            elif self.op_started is not None and time.monotonic() - self.op_started > self.args.hang_timeout:
                why = "no answer for %.0f s (hang) during %s" % (self.args.hang_timeout, self.op_desc)
            if why:
                self.killed = why
                self.kill()
                # A call blocked outside the daemon (a fifo, the kernel) stays blocked:
                # report and leave rather than hang the suite.
                if self.stop_watch.wait(20) or self.op_started is None:
                    return
                print("\nFAIL: still blocked 20 s after the daemon was killed, during %s; exiting" % self.op_desc, flush=True)
                for fn in STUCK_HANDLERS:
                    fn()
                os._exit(1)

    def alive_problem(self):
        """None while the daemon runs and the mount answers; else why not."""
        if self.killed:
            return "daemon killed by the test: " + self.killed
        rc = self.proc.poll()
        if rc is not None:
            return "daemon exited: " + describe_status(rc)
        try:
            st = os.stat(self.mnt)
        except OSError as e:
            return "the mount does not answer: stat(mount root) -> %s" % errname(e.errno)
        if st.st_dev != self.dev:
            return "the mount is gone (the mount point is a plain directory again)"
        return None

    def wait_exit(self, seconds):
        try:
            self.proc.wait(seconds)
        except subprocess.TimeoutExpired:
            pass

    def kill(self):
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.kill(self.proc.pid, signal.SIGKILL)
            except OSError:
                pass
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                pass

    def unmount(self, timeout):
        """fusermount3 -u, then wait for the daemon to finish its drain and exit 0."""
        self.op_started, self.op_desc = None, "unmount (drain)"
        r = subprocess.run(["fusermount3", "-u", self.mnt], capture_output=True, text=True, timeout=60)
        if r.returncode != 0:
            raise TestError("fusermount3 -u %s failed: %s" % (self.mnt, r.stderr.strip()))
        deadline = time.monotonic() + timeout
        while self.proc.poll() is None and time.monotonic() < deadline and not self.killed:
            time.sleep(0.05)
        if self.killed:
            raise DaemonDied("unmount (drain of pending saves)", "daemon killed by the test: " + self.killed)
        if self.proc.poll() is None:
            self.kill()
            raise DaemonDied("unmount (drain of pending saves)",
                             "daemon still running %d s after fusermount3 -u (killed)" % timeout)
        if self.proc.returncode != 0:
            raise DaemonDied("unmount", "daemon exited: " + describe_status(self.proc.returncode))

    def force_cleanup(self):
        """Best effort, never raises; returns a list of problems."""
        problems = []
        self.stop_watch.set()
        try:
            if is_mounted(self.mnt):
                subprocess.run(["fusermount3", "-u", self.mnt], capture_output=True, timeout=30)
            if self.proc is not None:
                try:
                    self.proc.wait(5)
                except subprocess.TimeoutExpired:
                    self.kill()
            if is_mounted(self.mnt):
                subprocess.run(["fusermount3", "-u", "-z", self.mnt], capture_output=True, timeout=30)
        except (OSError, subprocess.SubprocessError) as e:
            problems.append("cleanup of %s: %s" % (self.mnt, e))
        if is_mounted(self.mnt):
            problems.append("%s is still mounted after cleanup" % self.mnt)
        return problems

    def fsck(self):
        r = subprocess.run([self.binary, "fsck", "--store", self.store], capture_output=True, text=True,
                           timeout=300, env=dict(os.environ, XDG_DATA_HOME=self.xdg))
        return r.returncode, (r.stdout + r.stderr).strip()

    def crash_summary(self):
        """The Swift runtime's message and the first frames of the crashed thread, if any."""
        try:
            with open(self.log_path, errors="replace") as f:
                lines = f.read().splitlines()
        except OSError:
            return ""
        out = [l.strip() for l in lines if "Swift runtime failure" in l or "Fatal error" in l][:1]
        for i, l in enumerate(lines):
            if l.endswith("crashed:"):
                frames = [re.sub(r"^.*?0x[0-9a-f]+ ", "", x.strip()) for x in lines[i + 1:i + 16]
                          if re.search(r" at /[^/]", x) and "[system]" not in x]
                out += ["at " + x for x in frames[:3]]
                break
        return "\n".join(out)

    def log_tail(self, n=25):
        try:
            with open(self.log_path, errors="replace") as f:
                return "".join(f.readlines()[-n:])
        except OSError as e:
            return "(no daemon log: %s)\n" % e


def describe_status(rc):
    if rc < 0:
        try:
            return "killed by %s" % signal.Signals(-rc).name
        except ValueError:
            return "killed by signal %d" % -rc
    return "exit status %d" % rc


# ---------------------------------------------------------------------------------------
# One side of the comparison: its root and a descriptor on it (paths stay relative, so both
# sides see exactly the same path strings; the two roots have equally long absolute paths).


class Side:
    def __init__(self, key, root):
        self.key, self.root = key, root
        self.fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)

    def abs(self, rel):
        return self.root + "/" + rel if rel else self.root

    def close(self):
        if self.fd is not None:
            try:
                os.close(self.fd)
            except OSError:
                pass
            self.fd = None


class Handle:
    def __init__(self, hid, path, flags_name, flags, fds):
        self.hid, self.path, self.flags_name, self.flags, self.fds = hid, path, flags_name, flags, fds

    @property
    def name(self):
        return "fd%d" % self.hid


def walk_open(side, comps):
    """A descriptor on root/comps[0]/comps[1]/..., opened one short component at a time."""
    fd = os.open(comps[0], os.O_RDONLY | os.O_DIRECTORY, dir_fd=side.fd)
    try:
        for c in comps[1:]:
            nfd = os.open(c, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = nfd
    except OSError:
        os.close(fd)
        raise
    return fd


def read_zero(fd, off, length):
    """True when the bytes in [off, off+length) read as zeros (samples at most 256 KiB at
    each end of the range)."""
    spans = [(off, min(length, 256 * KiB))]
    if length > 256 * KiB:
        spans.append((off + length - 256 * KiB, 256 * KiB))
    for o, n in spans:
        data = b""
        while len(data) < n:
            b = os.pread(fd, n - len(data), o + len(data))
            if not b:
                break
            data += b
        if data.count(0) != len(data):
            return False
    return True


# ---------------------------------------------------------------------------------------
# The test: generator and executor in one (the sequence depends only on the seed and on
# the reference's state, never on the mount's).


class Hostile:
    OPS = [("truncate", 6), ("ftruncate", 8), ("pwrite", 9), ("write", 3), ("pread", 6), ("read", 2),
           ("lseek", 7), ("fallocate", 7), ("posix_fallocate", 2), ("copy_file_range", 7),
           ("xattr", 9), ("names", 9), ("deep", 7), ("mknod", 3), ("reopen", 6), ("fsync", 3),
           ("stat", 2), ("listdir_fd", 1), ("churn", 4), ("recreate", 2)]

    def __init__(self, binary, args, seed, ops, base):
        self.binary, self.args, self.seed, self.nops = binary, args, seed, ops
        self.base = base
        self.rng = random.Random(seed)
        self.mnt = os.path.join(base, "m", "mnt")
        self.ref = os.path.join(base, "r", "ref")
        assert len(self.mnt) == len(self.ref)
        os.makedirs(self.ref)
        self.mounts = []
        self.mount = None
        self.m = self.r = None
        self.handles = {}
        self.next_hid = 1
        self.step = 0
        self.history = collections.deque(maxlen=args.history)
        self.intended_counts = collections.Counter()
        self.op_counts = collections.Counter()
        self.found = collections.OrderedDict()   # signature -> (first step, text) in --keep-going
        self.mount_accepts = 0                   # largest end the mount accepted past the reference's max
        self.mount_refuses = None                # smallest end it refused with EFBIG
        self.no_hole_notes = 0
        self.fscked = False
        self.t0 = time.monotonic()
        self.sig = None
        self.ref_max = probe_max_file_size(os.path.dirname(self.ref))
        self.ref_xattrs, self.ref_xattr_value_max = probe_xattrs(os.path.dirname(self.ref))

    # ---- mounting and the pool ------------------------------------------------------------

    def start(self):
        self.mount = Mount(self.binary, self.base, self.mnt, len(self.mounts), self.args)
        self.mounts.append(self.mount)
        self.mount.start()
        self.m = Side("m", self.mnt)
        self.r = Side("r", self.ref)
        try:
            self.make_pool()
        except OSError as e:
            raise TestError("setting up the pool failed: %s\n%s" % (e, self.mount.log_tail()))

    def make_pool(self):
        """The same small tree on both sides (not compared call by call: set-up)."""
        prng = random.Random(self.seed ^ 0x5eed)
        contents = {"f0": prng.randbytes(5000), "f1": b"", "f2": prng.randbytes(100), "d/f3": prng.randbytes(4096)}
        for side in (self.m, self.r):
            for d in ("d", "e", "deep"):
                os.mkdir(d, 0o755, dir_fd=side.fd)
            for rel, data in contents.items():
                fd = os.open(rel, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644, dir_fd=side.fd)
                os.write(fd, data)
                os.close(fd)
            if self.ref_xattrs:
                os.setxattr(side.abs("f0"), "user.a", b"1")
        for rel, fl in (("f0", "O_RDWR"), ("f1", "O_RDWR"), ("f2", "O_RDONLY"), ("d/f3", "O_WRONLY|O_APPEND")):
            self.open_handle(rel, fl, setup=True)

    def open_handle(self, rel, flags_name, setup=False):
        flags = dict(OPEN_FLAGS).get(flags_name, os.O_WRONLY | os.O_APPEND)
        hid = self.next_hid
        self.next_hid += 1
        # O_NONBLOCK everywhere a name is opened: should the mount have a fifo where the
        # reference has a file, the open must fail the comparison, not block the test.
        desc = "fd%d = os.open(%r, os.%s|os.O_NONBLOCK, dir_fd=root)" % (hid, rel, flags_name.replace("|", "|os."))
        fds = {}

        def op(side):
            fds[side.key] = os.open(rel, flags | os.O_NONBLOCK, 0o644, dir_fd=side.fd)
            return "fd"
        if setup:
            op(self.m)
            op(self.r)
            om = Outcome(True, "fd")
        else:
            om, _ = self.both(desc, op, sig=("open", flags_name))
        if om.ok:
            self.handles[hid] = Handle(hid, rel, flags_name, flags, fds)
            return self.handles[hid]
        for fd in fds.values():
            os.close(fd)
        return None

    def close_handle(self, h):
        del self.handles[h.hid]
        self.both("os.close(%s)" % h.name, lambda s: os.close(h.fds[s.key]), sig=("close",))

    def teardown_sides(self):
        for h in list(self.handles.values()):
            for fd in h.fds.values():
                try:
                    os.close(fd)
                except OSError:
                    pass
        self.handles.clear()
        for s in (self.m, self.r):
            if s is not None:
                s.close()

    def reset(self):
        """After a failure in --keep-going: a fresh mount (new store) and reference."""
        self.teardown_sides()
        problems = self.mount.force_cleanup()
        if problems:
            raise TestError("; ".join(problems))
        shutil.rmtree(self.ref)
        os.makedirs(self.ref)
        self.start()

    # ---- calling both sides -------------------------------------------------------------

    def log(self, text):
        line = "[%d] %s" % (self.step, text)
        self.history.append(line)
        if self.args.verbose:
            print(line, flush=True)

    def check_alive(self, desc):
        problem = self.mount.alive_problem()
        if problem:
            crash = self.mount.crash_summary()
            raise DaemonDied(desc, problem + ("\n      " + crash.replace("\n", "\n      ") if crash else ""))

    def both(self, desc, fn, explain=None, sig=None, skip_ref=None, group=False):
        """fn(side) on the mount, then on the reference. Unequal results must be explained
        by explain(om, orf) -> rule name (see INTENDED), else Discrepancy. skip_ref(om) ->
        rule name: the mount's result alone is accepted and the reference is not called."""
        t0 = time.monotonic()
        self.mount.op_desc, self.mount.op_started = desc, t0
        try:
            om = call(lambda: fn(self.m))
        finally:
            self.mount.op_started = None
        spent = time.monotonic() - t0
        if not om.ok and om.value in ("ENOTCONN", "ECONNABORTED"):
            self.mount.wait_exit(15)   # the connection was aborted: the daemon is dying (backtrace)
        self.check_alive(desc)
        if spent > self.args.slow_call:
            self.log("%s -> mount %r after %.1f s" % (desc, om, spent))
            raise Discrepancy(desc, ["the mount took %.1f s (limit --slow-call %g s): work in proportion to a size "
                                     "the call names? (mount result %r)" % (spent, self.args.slow_call, om)],
                              ("slow call",) + (sig or (desc,))[:2])
        rule = skip_ref(om) if skip_ref else None
        if rule:
            self.intended_counts[rule] += 1
            self.log("%s -> mount %r  [intended: %s; reference not called]" % (desc, om, rule))
            return om, None
        orf = call(lambda: fn(self.r))
        if om == orf:
            self.log("%s -> %r" % (desc, orf))
            return om, orf
        rule = explain(om, orf) if explain else None
        if rule:
            self.intended_counts[rule] += 1
            self.log("%s -> reference %r, mount %r  [intended: %s]" % (desc, orf, om, rule))
            return om, orf
        self.log("%s -> reference %r   MOUNT: %r" % (desc, orf, om))
        sig = sig or (desc,)
        if orf.value == "ENAMETOOLONG":
            sig = ("a name or path over the limit",)   # one finding, whatever the call
        if not group:
            sig += ("mount " + repr(om), "reference " + repr(orf))
        raise Discrepancy(desc, ["mount:     %r" % (om,), "reference: %r" % (orf,)], sig)

    def setup_call(self, desc, fn):
        """A resync call on the mount alone; it must succeed."""
        self.mount.op_desc, self.mount.op_started = desc, time.monotonic()
        try:
            o = call(fn)
        finally:
            self.mount.op_started = None
        self.check_alive(desc)
        self.log("  resync: %s -> %r" % (desc, o))
        if not o.ok:
            raise Discrepancy("resync " + desc, ["mount: %r" % (o,)], ("resync",) + self.sig + (repr(o),))
        return o.value

    # ---- the intended-difference rules --------------------------------------------------

    def explain_size(self, end, om, orf, kind="size", full=None, negative=False):
        """Rule "max-file-size". end: the size/position the call asks for; kind: "size"
        (EFBIG), "write" (EFBIG or cut short at the maximum; full = the full count), "pos"
        (lseek: EINVAL, not limited by the mount's file size)."""
        if end is None or end <= self.ref_max:
            return None
        if kind == "pos":
            return "max-file-size" if orf.value == "EINVAL" and (om.ok or om == orf) else None
        ref_limited = orf.value == "EFBIG" or (kind == "write" and orf.ok and isinstance(orf.value, int) and orf.value < full)
        if not ref_limited:
            return None
        if om.ok and kind == "write" and full == 0 and om.value == 0:
            # Nothing to write (copy_file_range from the source's end): FUSE's kernel side
            # answers 0 itself, its own limit being 2**63-1; the daemon is never asked.
            return "max-file-size"
        if om.ok and kind == "write" and om.value != full:
            # Cut short exactly at the mount's own maximum (POSIX: as much as there is room for).
            start = end - full
            ok_short = MOUNT_MAX_FILE_SIZE is not None and start < MOUNT_MAX_FILE_SIZE < end \
                and om.value == MOUNT_MAX_FILE_SIZE - start
            return "max-file-size" if ok_short else None
        if not om.ok and om.value != "EFBIG":
            # The kernel checks the size limit before the offsets: with the larger limit the
            # mount's answer to a call that also has a negative offset is EINVAL.
            return "max-file-size" if negative and om.value == "EINVAL" else None
        accepted = om.ok
        if MOUNT_MAX_FILE_SIZE is not None:
            if accepted != (end <= MOUNT_MAX_FILE_SIZE):
                return None
        elif accepted:
            if self.mount_refuses is not None and end >= self.mount_refuses:
                raise Discrepancy("inconsistent maximum file size", [
                    "the mount accepted an end of %s after refusing %s with EFBIG" % (num(end), num(self.mount_refuses))],
                    ("max-size-inconsistent",))
            self.mount_accepts = max(self.mount_accepts, end)
        else:
            if end <= self.mount_accepts:
                raise Discrepancy("inconsistent maximum file size", [
                    "the mount refused an end of %s with EFBIG after accepting %s" % (num(end), num(self.mount_accepts))],
                    ("max-size-inconsistent",))
            self.mount_refuses = end if self.mount_refuses is None else min(self.mount_refuses, end)
        return "max-file-size"

    def note_size_accepts(self, end, om, orf, kind="size", full=None):
        """Also when both sides agree: a refusal (EFBIG, or a write cut short) of an end
        within the mount's documented maximum is a failure, even if ext4 refuses it too."""
        if end is None or end <= 0:
            return
        refused = (not om.ok and om.value == "EFBIG") or \
            (kind == "write" and om.ok and isinstance(om.value, int) and full is not None and om.value < full)
        if refused and MOUNT_MAX_FILE_SIZE is not None and end <= MOUNT_MAX_FILE_SIZE:
            raise Discrepancy("the mount refused a size within its documented maximum (%s)" % num(MOUNT_MAX_FILE_SIZE), [
                "the call asked for an end of %s; mount %r, reference %r" % (num(end), om, orf)],
                ("refused below the documented maximum", self.sig[0]))
        if end > self.ref_max and not om.ok and om.value == "EFBIG" and MOUNT_MAX_FILE_SIZE is None:
            if end <= self.mount_accepts:
                raise Discrepancy("inconsistent maximum file size", [
                    "the mount refused an end of %s with EFBIG after accepting %s" % (num(end), num(self.mount_accepts))],
                    ("max-size-inconsistent",))
            self.mount_refuses = end if self.mount_refuses is None else min(self.mount_refuses, end)

    def resync_fd(self, h):
        """The mount's file back to the reference's size, its offset to the reference's."""
        size = os.fstat(h.fds["r"]).st_size
        pos = os.lseek(h.fds["r"], 0, os.SEEK_CUR)
        mfd = h.fds["m"]
        if os.fstat(mfd).st_size != size:
            def cut():
                fd = os.open("/proc/self/fd/%d" % mfd, os.O_WRONLY)
                try:
                    os.ftruncate(fd, size)
                finally:
                    os.close(fd)
            self.setup_call("os.ftruncate(<%s reopened>, %s)" % (h.name, num(size)), cut)
        if os.lseek(mfd, 0, os.SEEK_CUR) != pos:
            self.setup_call("os.lseek(%s, %s, os.SEEK_SET)" % (h.name, num(pos)), lambda: os.lseek(mfd, pos, os.SEEK_SET))

    def resync_path(self, rel):
        try:
            size = os.stat(self.r.abs(rel)).st_size
        except OSError:
            return
        if os.stat(self.m.abs(rel)).st_size != size:
            self.setup_call("os.truncate(%s, %s)" % (show(rel), num(size)), lambda: os.truncate(self.m.abs(rel), size))

    # ---- reference state (the generator's only input besides the seed) -------------------

    def ref_entries(self, skip_deep=True):
        out = []
        stack = [""]
        while stack:
            d = stack.pop()
            for n in sorted(os.listdir(self.r.abs(d))):
                rel = d + "/" + n if d else n
                if skip_deep and rel == "deep":
                    continue
                try:
                    st = os.lstat(self.r.abs(rel))
                except OSError:
                    continue
                t = TYPE_NAMES.get(stat.S_IFMT(st.st_mode), "other")
                out.append((rel, t))
                if t == "dir":
                    stack.append(rel)
        out.sort()
        return out

    def ref_is_device(self, rel):
        """Never open a device node by name: on the reference (no nodev) that opens the
        device itself; FUSE mounts are nodev (EACCES). Symlinks to one count too."""
        for follow in (False, True):
            try:
                st = os.stat(self.r.abs(rel), follow_symlinks=follow)
            except OSError:
                continue
            if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode):
                return True
        return False

    def ref_files(self):
        return [rel for rel, t in self.ref_entries() if t == "file"]

    def ref_size(self, h):
        try:
            return os.fstat(h.fds["r"]).st_size
        except OSError:
            return 0

    def pick_handle(self):
        if not self.handles:
            return None
        return self.handles[self.rng.choice(sorted(self.handles))]

    def pick_path(self):
        """Mostly an existing regular file; sometimes a directory, a missing name, a name at
        or over the limits."""
        x = self.rng.random()
        files = self.ref_files()
        if x < 0.75 and files:
            return self.rng.choice(files)
        if x < 0.82:
            return self.rng.choice(["d", "e", ""])
        if x < 0.88:
            return self.rng.choice(["missing", "d/missing", "f0/x"])
        return self.rng.choice(["", "d/"]) + LONG_NAMES[self.rng.choice(["255", "256", "255u", "256u", "255b", "1025"])]

    def deep_chain(self):
        """The reference's chain under deep/: one directory per level."""
        chain = []
        d = self.r.abs("deep")
        fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
        try:
            while True:
                subdirs = sorted(n for n in os.listdir(fd) if stat.S_ISDIR(os.stat(n, dir_fd=fd, follow_symlinks=False).st_mode))
                if not subdirs:
                    return chain
                chain.append(subdirs[0])
                nfd = os.open(subdirs[0], os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
                os.close(fd)
                fd = nfd
        finally:
            os.close(fd)

    # ---- the operations -----------------------------------------------------------------

    def op_truncate(self):
        rel, size = self.pick_path(), self.rng.choice(SIZES)
        self.sig = ("truncate", cls(size))
        om, orf = self.both("os.truncate(%s, %s)" % (show(rel), num(size)), lambda s: os.truncate(s.abs(rel), size),
                            explain=lambda om, orf: self.explain_size(size, om, orf), sig=self.sig)
        if orf is not None and om != orf:
            self.resync_path(rel)
        self.note_size_accepts(size, om, orf)
        self.post_path(rel)

    def op_ftruncate(self):
        h, size = self.pick_handle(), self.rng.choice(SIZES)
        if h is None:
            return
        self.sig = ("ftruncate", h.flags_name, cls(size))
        om, orf = self.both("os.ftruncate(%s, %s)" % (h.name, num(size)), lambda s: os.ftruncate(h.fds[s.key], size),
                            explain=lambda om, orf: self.explain_size(size, om, orf), sig=self.sig)
        if om != orf:
            self.resync_fd(h)
        self.note_size_accepts(size, om, orf)
        self.post_fd(h)

    def rand_data(self):
        n = self.rng.choice([0, 1, 3, 8])
        return bytes(self.rng.randrange(1, 256) for _ in range(n))

    def op_pwrite(self):
        h, off, data = self.pick_handle(), self.rng.choice(OFFSETS), self.rand_data()
        if h is None:
            return
        # O_APPEND: Linux's pwrite appends whatever the offset.
        end = self.ref_size(h) + len(data) if h.flags & os.O_APPEND else off + len(data) if off >= 0 else None
        self.sig = ("pwrite", "O_APPEND" if h.flags & os.O_APPEND else "", cls(off), len(data) > 0)
        om, orf = self.both("os.pwrite(%s, %r, %s)" % (h.name, data, num(off)), lambda s: os.pwrite(h.fds[s.key], data, off),
                            explain=lambda om, orf: self.explain_size(end, om, orf, "write", len(data)), sig=self.sig)
        if om != orf:
            self.resync_fd(h)
        self.note_size_accepts(end, om, orf, "write", len(data))
        self.post_fd(h)

    def op_write(self):
        """lseek to an extreme position, then write(2) there."""
        h, off, data = self.pick_handle(), self.rng.choice(OFFSETS), self.rand_data()
        if h is None:
            return
        self.sig = ("lseek+write", "O_APPEND" if h.flags & os.O_APPEND else "", cls(off), len(data) > 0)
        om, orf = self.both("os.lseek(%s, %s, os.SEEK_SET)" % (h.name, num(off)), lambda s: os.lseek(h.fds[s.key], off, os.SEEK_SET),
                            explain=lambda om, orf: self.explain_size(off, om, orf, "pos"), sig=self.sig)
        if om != orf:
            self.resync_fd(h)
        pos = os.lseek(h.fds["r"], 0, os.SEEK_CUR)
        end = (self.ref_size(h) if h.flags & os.O_APPEND else pos) + len(data)
        om, orf = self.both("os.write(%s, %r)" % (h.name, data), lambda s: os.write(h.fds[s.key], data),
                            explain=lambda om, orf: self.explain_size(end, om, orf, "write", len(data)), sig=self.sig)
        if om != orf:
            self.resync_fd(h)
        self.note_size_accepts(end, om, orf, "write", len(data))
        self.both("os.lseek(%s, 0, os.SEEK_CUR)" % h.name, lambda s: os.lseek(h.fds[s.key], 0, os.SEEK_CUR), sig=self.sig)
        self.post_fd(h)

    def op_pread(self):
        h, off, n = self.pick_handle(), self.rng.choice(OFFSETS), self.rng.choice(COUNTS)
        if h is None:
            return
        self.sig = ("pread", cls(off), n > 0)
        self.both("os.pread(%s, %d, %s)" % (h.name, n, num(off)), lambda s: os.pread(h.fds[s.key], n, off), sig=self.sig)

    def op_read(self):
        h, n = self.pick_handle(), self.rng.choice(COUNTS)
        if h is None:
            return
        self.sig = ("read", n > 0)
        self.both("os.read(%s, %d)" % (h.name, n), lambda s: os.read(h.fds[s.key], n), sig=self.sig)
        self.both("os.lseek(%s, 0, os.SEEK_CUR)" % h.name, lambda s: os.lseek(h.fds[s.key], 0, os.SEEK_CUR), sig=self.sig)

    def op_lseek(self):
        h = self.pick_handle()
        if h is None:
            return
        wname = self.rng.choice(sorted(WHENCE))
        off = self.rng.choice(OFFSETS)
        whence = WHENCE[wname]
        size = self.ref_size(h)
        cur = os.lseek(h.fds["r"], 0, os.SEEK_CUR)
        self.sig = ("lseek", wname, cls(off))
        if wname == "SEEK_SET":
            target = off
        elif wname == "SEEK_CUR":
            target = cur + off
        elif wname == "SEEK_END":
            target = size + off
        else:
            target = None

        def explain(om, orf):
            if target is not None:
                return self.explain_size(target, om, orf, "pos")
            return self.explain_seek_data_hole(h, wname, off, size, om, orf)
        om, orf = self.both("os.lseek(%s, %s, os.%s)" % (h.name, num(off), wname),
                            lambda s: os.lseek(h.fds[s.key], off, whence), explain=explain, sig=self.sig)
        if om != orf:
            self.resync_fd(h)

    def explain_seek_data_hole(self, h, wname, off, size, om, orf):
        """Rule "seek-data-hole": the mount's answer must be valid for its own contents."""
        if off < 0 or off >= size:
            return None   # outside the file: the errors must agree
        fd = os.open("/proc/self/fd/%d" % h.fds["m"], os.O_RDONLY)
        try:
            if wname == "SEEK_DATA":
                if om.ok:
                    valid = off <= om.value < size and read_zero(fd, off, om.value - off)
                else:
                    valid = om.value == "ENXIO" and read_zero(fd, off, size - off)
            else:
                valid = om.ok and off <= om.value <= size and (om.value == size or read_zero(fd, om.value, 1))
        finally:
            os.close(fd)
        if valid and orf.ok and om.ok and wname == "SEEK_HOLE" and orf.value < om.value:
            self.no_hole_notes += 1
        return "seek-data-hole" if valid else None

    def fallocate_args(self, h, allocating):
        off, length = self.rng.choice(OFFSETS), self.rng.choice(SIZES)
        # ext4 really reserves blocks for [off, off+len) in the allocating modes: keep that
        # under 1 MiB unless the range lies past the reference's maximum (then the kernel
        # refuses it with EFBIG before allocating anything).
        if allocating and off >= 0 and length > MiB and off + length <= self.ref_max:
            length = self.rng.choice([1, 4096, 65536, MiB])
        return off, length

    def op_fallocate(self):
        h = self.pick_handle()
        if h is None:
            return
        mode = self.rng.choice(sorted(FALLOC_MODES))
        off, length = self.fallocate_args(h, mode in ALLOCATING_MODES)
        end = off + length if off >= 0 and length > 0 else None   # the kernel checks it in every mode
        self.sig = ("fallocate", FALLOC_MODES[mode], cls(off), cls(length))

        def skip_ref(om):
            unsupported = mode & ~FALLOC_FL_KEEP_SIZE in (FALLOC_FL_COLLAPSE_RANGE, FALLOC_FL_INSERT_RANGE, FALLOC_FL_UNSHARE_RANGE)
            return "fallocate-modes" if unsupported and om.value == EOPNOTSUPP else None

        def explain(om, orf):
            if mode in ALLOCATING_MODES and om.value == "ENOSPC" and orf.value == "EFBIG" and self.exceeds_free_space(length):
                return "fallocate-space"
            return self.explain_size(end, om, orf)
        om, orf = self.both("fallocate(%s, %s, %s, %s)" % (h.name, FALLOC_MODES[mode], num(off), num(length)),
                            lambda s: fallocate(h.fds[s.key], mode, off, length),
                            explain=explain, sig=self.sig, skip_ref=skip_ref)
        if orf is not None and om != orf:
            if om.ok and mode & ~FALLOC_FL_KEEP_SIZE in (FALLOC_FL_PUNCH_HOLE, FALLOC_FL_ZERO_RANGE):
                self.mirror_zeroing(h, off, length)
            self.resync_fd(h)
        if orf is not None:
            self.note_size_accepts(end, om, orf)
        self.post_fd(h)

    def mirror_zeroing(self, h, off, length):
        """A punch or zero range the mount accepted past the reference's maximum (rule
        "max-file-size") zeroed the mount's bytes from `off`: zero the same bytes of the
        reference's file (those it has), so both hold the same content again."""
        size = os.fstat(h.fds["r"]).st_size
        if off >= size:
            return
        cut = min(length, size - off)
        rfd = h.fds["r"]
        def punch():
            fd = os.open("/proc/self/fd/%d" % rfd, os.O_WRONLY)
            try:
                fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, off, cut)
            finally:
                os.close(fd)
        self.setup_call("fallocate(<reference %s reopened>, PUNCH_HOLE|KEEP_SIZE, %s, %s)" % (h.name, num(off), num(cut)), punch)

    def exceeds_free_space(self, length):
        """Whether `length` bytes are more than the mount's filesystem has free beyond
        min-free (2 %) and the 16 MiB reserve: fallocate's ENOSPC is right then."""
        st = os.statvfs(self.mnt)
        free = st.f_bavail * st.f_frsize
        return length > free - st.f_blocks * st.f_frsize // 50 - 16 * MiB

    def op_posix_fallocate(self):
        h = self.pick_handle()
        if h is None:
            return
        off, length = self.fallocate_args(h, True)
        # glibc emulates a refused fallocate by writing every block: keep len small.
        if length > MiB:
            length = self.rng.choice([1, 4096, MiB])
        end = off + length if off >= 0 and length > 0 else None
        self.sig = ("posix_fallocate", cls(off), cls(length))
        om, orf = self.both("os.posix_fallocate(%s, %s, %s)" % (h.name, num(off), num(length)),
                            lambda s: os.posix_fallocate(h.fds[s.key], off, length),
                            explain=lambda om, orf: self.explain_size(end, om, orf), sig=self.sig)
        if om != orf:
            self.resync_fd(h)
        self.note_size_accepts(end, om, orf)
        self.post_fd(h)

    def op_copy_file_range(self):
        if len(self.handles) < 1:
            return
        hin, hout = self.pick_handle(), self.pick_handle()
        off_in = self.rng.choice(OFFSETS + [None, None])
        off_out = self.rng.choice(OFFSETS + [None, None])
        count = self.rng.choice(COPY_COUNTS)
        size_in = self.ref_size(hin)
        pos_in = off_in if off_in is not None else os.lseek(hin.fds["r"], 0, os.SEEK_CUR)
        pos_out = off_out if off_out is not None else os.lseek(hout.fds["r"], 0, os.SEEK_CUR)
        # The bytes really copied (the kernel stops at the source's end) stay under 1 MiB.
        if pos_in >= 0 and min(count, max(0, size_in - pos_in)) > MiB:
            count = self.rng.choice([1, 4096, MiB])
        copied = max(0, min(count, size_in - pos_in)) if pos_in >= 0 else 0
        # The kernel refuses an out offset at or past the maximum even for 0 bytes.
        end = pos_out + max(copied, 1) if pos_out >= 0 else None
        self.sig = ("copy_file_range", "in " + cls(off_in), "out " + cls(off_out), "count " + cls(count))
        desc = "os.copy_file_range(%s, %s, %s, %s, %s)" % (hin.name, hout.name, num(count), num(off_in), num(off_out))
        om, orf = self.both(desc, lambda s: os.copy_file_range(hin.fds[s.key], hout.fds[s.key], count, off_in, off_out),
                            explain=lambda om, orf: self.explain_size(end, om, orf, "write", copied, negative=pos_in < 0 or pos_out < 0),
                            sig=self.sig)
        if om != orf:
            self.resync_fd(hout)
            self.resync_fd(hin)
        self.note_size_accepts(end, om, orf, "write", copied)
        self.post_fd(hout)
        if hin is not hout:
            self.post_fd(hin)

    def op_xattr(self):
        if not self.ref_xattrs:
            return
        # Target: a descriptor, a path (pool file, directory, root, long name), or the
        # deepest directory of the chain (by descriptor: its path is too long).
        x = self.rng.random()
        h = None
        if x < 0.3 and self.handles:
            h = self.pick_handle()
            tdesc, target = h.name, (lambda s: h.fds[s.key])
        else:
            rel = self.pick_path()
            tdesc, target = show(rel), (lambda s: s.abs(rel))
        sub = self.rng.choice(["set", "set", "set", "get", "list", "remove"])
        name = self.rng.choice(XATTR_NAMES)
        ncls = "'user.'" if name == "user." else "name > 255 bytes" if len(name) > 255 else "name"
        self.sig = ("xattr", sub, ncls)
        if sub == "set":
            size = self.rng.choice(XATTR_SIZES)
            value = bytes([self.rng.randrange(256)]) * size
            flags = self.rng.choice([0, 0, os.XATTR_CREATE, os.XATTR_REPLACE])
            if ncls == "name":
                self.sig += ("value of %s bytes" % ("0" if size == 0 else "<= 4 KiB" if size <= 4096 else "<= 64 KiB" if size <= 65536 else "> 64 KiB"),)
            old = call(lambda: os.getxattr(target(self.r), name))

            def explain(om, orf):
                if orf.value == "ENOSPC" and om.ok and self.ref_xattr_value_max is not None:
                    return "xattr-space"
                return None
            om, orf = self.both("os.setxattr(%s, %s, <%d bytes>, %d)" % (tdesc, xshow(name), size, flags),
                                lambda s: os.setxattr(target(s), name, value, flags), explain=explain, sig=self.sig)
            if om != orf:
                got = self.setup_call("os.getxattr(%s, %s)" % (tdesc, xshow(name)), lambda: os.getxattr(target(self.m), name))
                if got != value:
                    raise Discrepancy("setxattr succeeded on the mount but getxattr returns another value",
                                      ["set %d bytes, got %d bytes" % (len(value), len(got))], self.sig + ("readback",))
                if old.ok:
                    self.setup_call("os.setxattr(%s, %s, <%d bytes>)" % (tdesc, xshow(name), len(old.value)),
                                    lambda: os.setxattr(target(self.m), name, old.value))
                else:
                    self.setup_call("os.removexattr(%s, %s)" % (tdesc, xshow(name)), lambda: os.removexattr(target(self.m), name))
        elif sub == "get":
            self.both("os.getxattr(%s, %s)" % (tdesc, xshow(name)), lambda s: os.getxattr(target(s), name), sig=self.sig)
        elif sub == "list":
            self.both("os.listxattr(%s) [user.* only]" % tdesc,
                      lambda s: sorted(n for n in os.listxattr(target(s)) if n.startswith("user.")
                                       and not n.startswith(STATUS_XATTR_PREFIX)), sig=self.sig)
        else:
            self.both("os.removexattr(%s, %s)" % (tdesc, xshow(name)), lambda s: os.removexattr(target(s), name), sig=self.sig)

    def op_names(self):
        key = self.rng.choice(sorted(LONG_NAMES))
        parent = self.rng.choice(["", "d/"])
        rel = parent + LONG_NAMES[key]
        act = self.rng.choice(["create", "mkdir", "symlink", "link", "rename-to", "rename-from", "stat", "lstat",
                               "open", "unlink", "rmdir", "mknod-fifo", "truncate", "setxattr", "readlink",
                               "symlink-long-target", "listdir"])
        self.sig = ("name", key.rstrip("ub"), act)
        shown = show(rel)
        if act in ("create", "open") and self.ref_is_device(rel):
            return
        if act == "create":
            fds = {}

            def create(s):
                fds[s.key] = os.open(rel, os.O_CREAT | os.O_WRONLY | os.O_NONBLOCK, 0o644, dir_fd=s.fd)
                return "fd"
            try:
                self.both("os.open(%s, os.O_CREAT|os.O_WRONLY|os.O_NONBLOCK, dir_fd=root)" % shown, create, sig=self.sig)
            finally:
                if len(fds) == 2:
                    self.both("os.close(<new %s>)" % shown, lambda s: os.close(fds.pop(s.key)), sig=self.sig)
                for v in fds.values():
                    os.close(v)
        elif act == "mkdir":
            self.both("os.mkdir(%s, dir_fd=root)" % shown, lambda s: os.mkdir(rel, 0o755, dir_fd=s.fd), sig=self.sig)
        elif act == "symlink":
            self.both("os.symlink('f0', %s, dir_fd=root)" % shown, lambda s: os.symlink("f0", rel, dir_fd=s.fd), sig=self.sig)
        elif act == "symlink-long-target":
            # Targets at and over the limit (4095 bytes + NUL = PATH_MAX), either one long
            # component (following it looks up a name over 255 bytes) or short components.
            n = self.rng.choice([255, 256, 1024, 4095, 4096])
            split = self.rng.random() < 0.5
            tgt = "/".join("t" * 199 for _ in range(n // 200 + 1))[:n] if split else "t" * n
            tgt = tgt[:-1] + "u" if tgt.endswith("/") else tgt
            link = parent + "s%d" % n
            self.sig = ("symlink-target", n)
            self.both("os.symlink(<%d-byte target%s>, %r, dir_fd=root)" % (n, " of 199-byte components" if split else "", link),
                      lambda s: os.symlink(tgt, link, dir_fd=s.fd), sig=self.sig)
            self.both("os.readlink(%r, dir_fd=root)" % link, lambda s: os.readlink(link, dir_fd=s.fd), sig=self.sig)
            return
        elif act == "link":
            self.both("os.link('f0', %s, src_dir_fd=root, dst_dir_fd=root)" % shown,
                      lambda s: os.link("f0", rel, src_dir_fd=s.fd, dst_dir_fd=s.fd), sig=self.sig)
        elif act == "rename-to":
            src = self.rng.choice(["f1", "f2", "e", "missing"])
            self.both("os.rename(%r, %s, src_dir_fd=root, dst_dir_fd=root)" % (src, shown),
                      lambda s: os.rename(src, rel, src_dir_fd=s.fd, dst_dir_fd=s.fd), sig=self.sig)
            self.post_path(src)
        elif act == "rename-from":
            dst = self.rng.choice(["f1", "f2", "e2"])
            self.both("os.rename(%s, %r, src_dir_fd=root, dst_dir_fd=root)" % (shown, dst),
                      lambda s: os.rename(rel, dst, src_dir_fd=s.fd, dst_dir_fd=s.fd), sig=self.sig)
            self.post_path(dst)
        elif act in ("stat", "lstat"):
            follow = act == "stat"
            self.both("os.%s(%s, dir_fd=root)" % (act, shown),
                      lambda s: self.norm(os.stat(rel, dir_fd=s.fd, follow_symlinks=follow)), sig=self.sig)
            return
        elif act == "open":
            def op(s):
                os.close(os.open(rel, os.O_RDONLY | os.O_NONBLOCK, dir_fd=s.fd))
            self.both("os.close(os.open(%s, os.O_RDONLY|os.O_NONBLOCK, dir_fd=root))" % shown, op, sig=self.sig)
        elif act == "unlink":
            self.both("os.unlink(%s, dir_fd=root)" % shown, lambda s: os.unlink(rel, dir_fd=s.fd), sig=self.sig)
        elif act == "rmdir":
            self.both("os.rmdir(%s, dir_fd=root)" % shown, lambda s: os.rmdir(rel, dir_fd=s.fd), sig=self.sig)
        elif act == "mknod-fifo":
            self.both("os.mkfifo(%s, dir_fd=root)" % shown, lambda s: os.mkfifo(rel, 0o644, dir_fd=s.fd), sig=self.sig)
        elif act == "truncate":
            self.both("os.truncate(%s, 10)" % shown, lambda s: os.truncate(s.abs(rel), 10), sig=self.sig)
        elif act == "setxattr":
            if not self.ref_xattrs:
                return
            self.both("os.setxattr(%s, 'user.a', b'1', follow_symlinks=False)" % shown,
                      lambda s: os.setxattr(s.abs(rel), "user.a", b"1", follow_symlinks=False), sig=self.sig)
        elif act == "readlink":
            self.both("os.readlink(%s, dir_fd=root)" % shown, lambda s: os.readlink(rel, dir_fd=s.fd), sig=self.sig)
            return
        elif act == "listdir":
            def ls(s):
                names = os.listdir(s.abs(parent.rstrip("/")))
                return sorted(n for n in names if n not in HIDDEN_ROOT)
            self.both("os.listdir(%r)" % (parent or "."), ls, sig=self.sig)
            return
        self.post_path(rel)

    def op_deep(self):
        """A chain of directories under deep/ whose full path grows past PATH_MAX, built and
        used through descriptors (each component is short enough)."""
        chain = self.deep_chain()
        total = len("deep/" + "/".join(chain))
        act = self.rng.choice(["extend", "extend", "extend", "file", "stat-path", "mkdir-path", "open-path",
                               "rename-up", "xattr", "trim", "listdir"])
        if total > 2 * PATH_MAX and act == "extend":
            act = "trim"
        self.sig = ("deep", act, "over PATH_MAX" if total + 1 >= PATH_MAX else "under PATH_MAX")
        shown = "<deep chain: %d levels, %d bytes>" % (len(chain), total)

        def at_deepest(fn):
            def op(s):
                fd = walk_open(s, ["deep"] + chain)
                try:
                    return fn(fd)
                finally:
                    os.close(fd)
            return op
        if act == "extend":
            comp = ("%03d" % len(chain) + "x" * 255)[:self.rng.choice(DEEP_COMPONENT_LENGTHS)]
            self.both("os.mkdir(<%d-byte name>, dir_fd=%s)" % (len(comp), shown),
                      at_deepest(lambda fd: os.mkdir(comp, 0o755, dir_fd=fd)), sig=self.sig)
        elif act == "file":
            data = self.rand_data() * 100

            def op(fd):
                f = os.open("F", os.O_CREAT | os.O_WRONLY | os.O_TRUNC | os.O_NONBLOCK, 0o644, dir_fd=fd)
                try:
                    os.write(f, data)
                finally:
                    os.close(f)   # the mount commits a version under a path past PATH_MAX
                return os.stat("F", dir_fd=fd).st_size
            self.both("write + close %s/F (%d bytes)" % (shown, len(data)), at_deepest(op), sig=self.sig)
        elif act == "stat-path":
            rel = "/".join(["deep"] + chain)
            self.both("os.stat(%s, dir_fd=root)" % shown, lambda s: self.norm(os.stat(rel, dir_fd=s.fd)), sig=self.sig)
        elif act == "mkdir-path":
            rel = "/".join(["deep"] + chain + ["y" * self.rng.choice([1, 200])])
            self.sig = ("deep", act, len(rel) + 1 > PATH_MAX)
            self.both("os.mkdir(<%d-byte path>, dir_fd=root)" % len(rel), lambda s: os.mkdir(rel, dir_fd=s.fd), sig=self.sig)
        elif act == "open-path":
            rel = "/".join(["deep"] + chain + ["F"])
            self.sig = ("deep", act, len(rel) + 1 > PATH_MAX)

            def op(s):
                os.close(os.open(rel, os.O_RDONLY | os.O_NONBLOCK, dir_fd=s.fd))
            self.both("os.open(<%d-byte path to F>, os.O_RDONLY|os.O_NONBLOCK, dir_fd=root)" % len(rel), op, sig=self.sig)
        elif act == "rename-up":
            # The file F of the deepest level to the root and back.
            def there(s):
                fd = walk_open(s, ["deep"] + chain)
                try:
                    os.rename("F", "Fdeep", src_dir_fd=fd, dst_dir_fd=s.fd)
                    os.rename("Fdeep", "F", src_dir_fd=s.fd, dst_dir_fd=fd)
                finally:
                    os.close(fd)
            self.both("os.rename(%s/F -> Fdeep -> back)" % shown, there, sig=self.sig)
        elif act == "xattr":
            if not self.ref_xattrs:
                return
            self.both("os.setxattr(<fd of %s>, 'user.deep', b'x')" % shown,
                      at_deepest(lambda fd: os.setxattr(fd, "user.deep", b"x")), sig=self.sig)
        elif act == "listdir":
            self.both("os.listdir(<fd of %s>)" % shown, at_deepest(lambda fd: sorted(os.listdir(fd))), sig=self.sig)
        elif act == "trim":
            if not chain:
                return
            parent, last = chain[:-1], chain[-1]

            def op(s):
                fd = walk_open(s, ["deep"] + chain)
                try:
                    for n in sorted(os.listdir(fd)):
                        os.unlink(n, dir_fd=fd)
                finally:
                    os.close(fd)
                fd = walk_open(s, ["deep"] + parent)
                try:
                    os.rmdir(last, dir_fd=fd)
                finally:
                    os.close(fd)
            self.both("rm %s/* and rmdir it" % shown, op, sig=self.sig)

    def op_mknod(self):
        kinds = [("S_IFIFO", stat.S_IFIFO, 0), ("S_IFSOCK", stat.S_IFSOCK, 0), ("S_IFREG", stat.S_IFREG, 0),
                 ("S_IFCHR", stat.S_IFCHR, os.makedev(1, 3)), ("S_IFBLK", stat.S_IFBLK, os.makedev(240, 7))]
        kname, kind, dev = self.rng.choice(kinds)
        rel = self.rng.choice(["n0", "n1", "d/n2", "e/n3"])
        self.sig = ("mknod", kname)
        self.both("os.mknod(%r, stat.%s|0o644, %s, dir_fd=root)" % (rel, kname, "os.makedev(%d, %d)" % (os.major(dev), os.minor(dev))),
                  lambda s: os.mknod(rel, kind | 0o644, dev, dir_fd=s.fd), sig=self.sig)
        self.post_path(rel)

    def op_reopen(self):
        """Close a descriptor (the mount's last close commits a version, also of a file of
        2**40 bytes) and open another one."""
        if self.handles and (len(self.handles) >= MAX_HANDLES or self.rng.random() < 0.5):
            h = self.pick_handle()
            self.sig = ("close", cls(self.ref_size(h)))
            self.close_handle(h)
        files = self.ref_files()
        if files and len(self.handles) < MAX_HANDLES:
            rel = self.rng.choice(files)
            fl = self.rng.choice([n for n, _ in OPEN_FLAGS])
            self.sig = ("open", fl)
            self.open_handle(rel, fl)

    def op_fsync(self):
        h = self.pick_handle()
        if h is None:
            return
        self.sig = ("fsync", cls(self.ref_size(h)))
        self.both("os.fsync(%s)" % h.name, lambda s: os.fsync(h.fds[s.key]), sig=self.sig)
        self.post_fd(h)

    def op_stat(self):
        rel = self.pick_path()
        self.sig = ("stat",)
        self.both("os.lstat(%s)" % show(rel), lambda s: self.norm(os.lstat(s.abs(rel))), sig=self.sig)

    def op_listdir_fd(self):
        """os.listdir of the root descriptor opened at mount time. CPython reads it with
        fdopendir and ends with rewinddir(); POSIX: after rewinddir, readdir returns every
        entry that existed at the rewind. So the second of two listings must be complete."""
        self.sig = ("listdir of a long-lived directory descriptor after rewinddir",)

        def ls(s):
            os.listdir(s.fd)
            return sorted(n for n in os.listdir(s.fd) if n not in HIDDEN_ROOT)
        self.both("os.listdir(root_fd); os.listdir(root_fd)  [root_fd opened at mount time]", ls, sig=self.sig, group=True)

    def op_churn(self):
        """unlink/rmdir/rename/link among the pool (long names included)."""
        entries = [rel for rel, _ in self.ref_entries()]
        if not entries:
            return
        src = self.rng.choice(entries)
        act = self.rng.choice(["unlink", "rmdir", "rename", "link"])
        self.sig = ("churn", act)
        if act == "unlink":
            self.both("os.unlink(%s)" % show(src), lambda s: os.unlink(s.abs(src)), sig=self.sig)
        elif act == "rmdir":
            self.both("os.rmdir(%s)" % show(src), lambda s: os.rmdir(s.abs(src)), sig=self.sig)
        else:
            dst = self.rng.choice(["f0", "f1", "f2", "g", "d/g", "e/g", LONG_NAMES["255"], "d/" + LONG_NAMES["255u"]])
            if act == "rename":
                self.both("os.rename(%s, %s)" % (show(src), show(dst)), lambda s: os.rename(s.abs(src), s.abs(dst)), sig=self.sig)
            else:
                self.both("os.link(%s, %s)" % (show(src), show(dst)), lambda s: os.link(s.abs(src), s.abs(dst), follow_symlinks=False), sig=self.sig)
            self.post_path(dst)
        self.post_path(src)

    def op_recreate(self):
        """Pool files that churn removed come back."""
        rel = self.rng.choice(["f0", "f1", "f2", "d/f3"])
        data = self.rand_data() * 50
        self.sig = ("recreate",)
        if self.ref_is_device(rel):
            return

        def op(s):
            fd = os.open(rel, os.O_CREAT | os.O_WRONLY | os.O_TRUNC | os.O_NONBLOCK, 0o644, dir_fd=s.fd)
            try:
                os.write(fd, data)
            finally:
                os.close(fd)
        self.both("write + close %r (O_CREAT|O_TRUNC|O_NONBLOCK, %d bytes)" % (rel, len(data)), op, sig=self.sig)
        self.post_path(rel)

    # ---- checks after calls and at checkpoints -------------------------------------------

    def norm(self, st):
        fmt = stat.S_IFMT(st.st_mode)
        d = {"type": TYPE_NAMES.get(fmt, oct(fmt)), "mode": oct(stat.S_IMODE(st.st_mode)), "uid": st.st_uid, "gid": st.st_gid}
        if fmt != stat.S_IFDIR:
            d["size"] = st.st_size   # directory sizes are the filesystem's own
            d["nlink"] = st.st_nlink
        if fmt in (stat.S_IFCHR, stat.S_IFBLK):
            d["rdev"] = (os.major(st.st_rdev), os.minor(st.st_rdev))
        return d

    def post_fd(self, h):
        self.both("os.fstat(%s)" % h.name, lambda s: self.norm(os.fstat(h.fds[s.key])), sig=self.sig + ("fstat after",))

    def post_path(self, rel):
        rel = rel.rstrip("/")
        longest = max(len(os.fsencode(c)) for c in rel.split("/")) if rel else 0
        cls = "name>255 bytes" if longest > 255 else "name=255 bytes" if longest == 255 else "short names"
        self.both("os.lstat(%s)" % show(rel), lambda s: self.norm(os.lstat(s.abs(rel))), sig=("lstat after", self.sig[0], cls))

    def content_ranges(self, rfd, size):
        """Bounded ranges to compare: the first and last 64 KiB and up to 32 data extents
        of the reference (256 KiB of each)."""
        rs = [(0, min(size, 64 * KiB))]
        if size > 64 * KiB:
            rs.append((size - 64 * KiB, 64 * KiB))
        pos = 0
        for _ in range(32):
            try:
                d = os.lseek(rfd, pos, os.SEEK_DATA)
                e = os.lseek(rfd, d, os.SEEK_HOLE)
            except OSError:
                break
            rs.append((d, min(e - d, 256 * KiB)))
            pos = e
            if e >= size:
                break
        return rs

    def compare_trees(self, why):
        """Both trees, walked by descriptors: names, types, modes, sizes, link counts,
        symlink targets, device numbers, user.* xattrs and bounded content hashes."""
        self.sig = ("checkpoint",)
        self.mount.op_desc, self.mount.op_started = "checkpoint (%s)" % why, time.monotonic()
        lines = []
        mfd = rfd = None
        try:
            # Fresh descriptors: a directory descriptor's listing may be a snapshot taken
            # when it was opened (rewinddir is checked by op_listdir_fd instead).
            mfd = os.open(self.mnt, os.O_RDONLY | os.O_DIRECTORY)
            rfd = os.open(self.ref, os.O_RDONLY | os.O_DIRECTORY)
            self._compare_dir(mfd, rfd, "", lines)
        except OSError as e:
            lines.append(".: open on the mount: %s" % errname(e.errno))
        finally:
            self.mount.op_started = None
            for fd in (mfd, rfd):
                if fd is not None:
                    os.close(fd)
        self.check_alive("checkpoint (%s)" % why)
        self.log("checkpoint (%s)%s" % (why, ": %d differences" % len(lines) if lines else ""))
        if lines:
            raise Discrepancy("trees differ at checkpoint (%s)" % why, lines[:30],
                              ("checkpoint",) + tuple(sorted(set(l.split(":")[-1][:60] for l in lines))[:3]))

    def _xattrs(self, fd):
        try:
            names = sorted(n for n in os.listxattr(fd) if n.startswith("user.") and not n.startswith(STATUS_XATTR_PREFIX))
            return {n: hashlib.sha1(os.getxattr(fd, n)).hexdigest()[:12] for n in names}
        except OSError as e:
            return "xattr:" + errname(e.errno)

    def _compare_dir(self, mfd, rfd, rel, lines):
        try:
            mnames = sorted(n for n in os.listdir(mfd) if not (rel == "" and n in HIDDEN_ROOT))
        except OSError as e:
            lines.append("%s: listdir on the mount: %s" % (rel or ".", errname(e.errno)))
            return
        rnames = sorted(os.listdir(rfd))
        short = lambda r: r if len(r) < 120 else r[:50] + "...(%d bytes)..." % len(r) + r[-50:]
        for n in sorted(set(mnames) ^ set(rnames)):
            lines.append("%s: only on the %s" % (short(rel + "/" + n if rel else n), "mount" if n in mnames else "reference"))
        for n in sorted(set(mnames) & set(rnames)):
            r = rel + "/" + n if rel else n
            try:
                rst = os.stat(n, dir_fd=rfd, follow_symlinks=False)
            except OSError:
                continue
            try:
                mst = os.stat(n, dir_fd=mfd, follow_symlinks=False)
            except OSError as e:
                lines.append("%s: lstat on the mount: %s" % (short(r), errname(e.errno)))
                continue
            a, b = self.norm(mst), self.norm(rst)
            fmt = stat.S_IFMT(rst.st_mode)
            if fmt == stat.S_IFDIR:
                a["nlink"], b["nlink"] = mst.st_nlink, rst.st_nlink
            if a == b and fmt in (stat.S_IFREG, stat.S_IFDIR):
                flags = os.O_RDONLY | (os.O_DIRECTORY if fmt == stat.S_IFDIR else os.O_NONBLOCK)
                try:
                    fm = os.open(n, flags, dir_fd=mfd)
                except OSError as e:
                    lines.append("%s: open on the mount: %s" % (short(r), errname(e.errno)))
                    continue
                fr = os.open(n, flags, dir_fd=rfd)
                try:
                    if self.ref_xattrs:
                        a["xattrs"], b["xattrs"] = self._xattrs(fm), self._xattrs(fr)
                    if fmt == stat.S_IFREG:
                        for off, length in self.content_ranges(fr, rst.st_size):
                            hm = call(lambda: hashlib.sha1(os.pread(fm, length, off)).hexdigest()[:12])
                            hr = call(lambda: hashlib.sha1(os.pread(fr, length, off)).hexdigest()[:12])
                            if hm != hr:
                                lines.append("%s: bytes [%s, +%d): mount %r, reference %r" % (short(r), num(off), length, hm, hr))
                                break
                    else:
                        self._compare_dir(fm, fr, r, lines)
                finally:
                    os.close(fm)
                    os.close(fr)
            elif fmt == stat.S_IFLNK:
                a["target"] = call(lambda: os.readlink(n, dir_fd=mfd))
                b["target"] = call(lambda: os.readlink(n, dir_fd=rfd))
            if a != b:
                d = ", ".join("%s: mount %r, reference %r" % (k, a.get(k), b.get(k)) for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k))
                lines.append("%s: %s" % (short(r), d))

    # ---- the run ------------------------------------------------------------------------

    def generate(self):
        names = [n for n, _ in self.OPS]
        weights = [w for _, w in self.OPS]
        for i in range(1, self.nops + 1):
            self.step = i
            op = self.rng.choices(names, weights)[0]
            self.op_counts[op] += 1
            self.sig = (op,)
            self.guarded(lambda: getattr(self, "op_" + op)())
            if i % CHECKPOINT_EVERY == 0:
                self.guarded(lambda: self.compare_trees("after op %d" % i))
            if i % 10000 == 0:
                print("  ... op %d of %d, %.0f s, daemon RSS %d MiB" % (
                    i, self.nops, time.monotonic() - self.t0, self.mount.rss_kib() // KiB), flush=True)
        self.step = self.nops + 1
        self.guarded(lambda: self.compare_trees("end"))
        self.guarded(self.close_all)
        self.guarded(lambda: self.compare_trees("end, all closed"))

    def close_all(self):
        for h in list(self.handles.values()):
            self.sig = ("close at end", cls(self.ref_size(h)))
            self.close_handle(h)

    def guarded(self, fn):
        """Runs fn; in --keep-going mode a failure is recorded and the run goes on from a
        fresh mount and reference."""
        try:
            fn()
        except (Discrepancy, DaemonDied) as e:
            if not self.args.keep_going:
                raise
            self.record(e)
            self.reset()

    def record(self, e):
        if isinstance(e, DaemonDied):
            lines = e.reason.split("\n")
            where = [l.strip() for l in lines if l.strip().startswith("at ")][:1]
            sig = ("daemon", lines[0][:34]) + (tuple(where) if where else (self.sig[0],))
            text = "%s: %s" % (e.desc, e.reason)
        else:
            sig = e.sig
            text = "%s\n    %s" % (e.desc, "\n    ".join(e.details))
        if sig not in self.found:
            self.found[sig] = (self.step, text)
            print("FOUND (seed %d, op %d): %s" % (self.seed, self.step, text), flush=True)

    def finish(self):
        """Clean unmount, then fsck of every store this run used."""
        self.fscked = True
        self.teardown_sides()
        problems = []
        try:
            self.mount.unmount(self.args.unmount_timeout)
        except DaemonDied as e:
            if not self.args.keep_going:
                raise
            self.record(e)
        problems += self.mount.force_cleanup()
        for m in self.mounts:
            if m is not self.mount:
                problems += m.force_cleanup()
        for m in self.mounts:
            if not os.path.isdir(m.store):
                continue
            rc, out = m.fsck()
            self.log("fsck --store %s -> %d" % (m.store, rc))
            if rc != 0:
                problems.append("fsck of %s failed (exit %d):\n%s" % (m.store, rc, out))
        return problems

    def cleanup(self):
        self.teardown_sides()
        problems = []
        for m in reversed(self.mounts):
            problems += m.force_cleanup()
        return problems


def probe_max_file_size(parent):
    """The reference filesystem's maximum file size (binary search with truncate)."""
    path = os.path.join(parent, "probe-max-size")
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        lo, hi = 0, 2**63 - 1
        try:
            os.ftruncate(fd, hi)
            return hi
        except OSError:
            pass
        while hi - lo > 1:
            mid = (lo + hi) // 2
            try:
                os.ftruncate(fd, mid)
                lo = mid
            except OSError:
                hi = mid
        return lo
    finally:
        os.close(fd)
        os.unlink(path)


def probe_xattrs(parent):
    """(user xattrs supported, largest value the reference stores when it is < 64 KiB)."""
    path = os.path.join(parent, "probe-xattr")
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600))
    try:
        try:
            os.setxattr(path, "user.probe", b"1")
        except OSError:
            return False, None
        try:
            os.setxattr(path, "user.probe", bytes(65536))
            return True, None
        except OSError:
            pass
        lo, hi = 1, 65536
        while hi - lo > 1:
            mid = (lo + hi) // 2
            try:
                os.setxattr(path, "user.probe", bytes(mid))
                lo = mid
            except OSError:
                hi = mid
        return True, lo
    finally:
        os.unlink(path)


# ---------------------------------------------------------------------------------------
# Main


def run_seed(binary, args, seed, ops, tag, replay):
    base = "/tmp/ubiquity-test-%d-hostile%s" % (os.getpid(), tag)
    shutil.rmtree(base, ignore_errors=True)
    os.makedirs(base)
    t = Hostile(binary, args, seed, ops, base)
    ACTIVE.append(t)
    t0 = time.monotonic()
    ok = False
    try:
        print("reference %s: max file size %s, xattr value max %s" % (
            t.ref, num(t.ref_max), "n/a" if not t.ref_xattrs else t.ref_xattr_value_max or ">= 65536"), flush=True)
        t.start()
        t.generate()
        problems = t.finish()
        if problems:
            for p in problems:
                print("FAIL (seed %d): %s" % (seed, p))
        elif t.found:
            print("\nFAIL (seed %d): %d distinct differences (--keep-going):" % (seed, len(t.found)))
            for sig, (step, text) in t.found.items():
                print("  [op %d] %s" % (step, text))
            print("replay one: %s --keep-going --ops N -v (N = its op)" % replay)
        else:
            ok = True
    except Discrepancy as e:
        print("\nFAIL (seed %d, op %d): %s" % (seed, t.step, e.desc))
        for d in e.details:
            print("  " + d)
        dump_context(t, replay)
    except DaemonDied as e:
        print("\nFAIL (seed %d, op %d): the daemon died or stopped answering: %s\n  during: %s" % (seed, t.step, e.reason, e.desc))
        dump_context(t, replay)
    except TestError as e:
        print("\nFAIL (seed %d): %s" % (seed, e))
    except (SystemExit, KeyboardInterrupt) as e:
        print("\nFAIL (seed %d, op %d): interrupted (%s) during %s; cleaning up" % (
            seed, t.step, e or "SIGINT", t.mount.op_desc if t.mount else "start"), flush=True)
        dump_context(t, replay)
        raise
    finally:
        problems = t.cleanup()
        if problems:
            print("FAIL: cleanup: %s" % "; ".join(problems))
            ok = False
        elif not t.fscked:
            # After a failure too: whatever happened to the daemon, the store it leaves
            # behind must stay consistent.
            try:
                for m in t.mounts:
                    if os.path.isdir(m.store):
                        rc, out = m.fsck()
                        print("after the failure, fsck --store %s: %s" % (
                            m.store, "clean" if rc == 0 else "NOT clean (exit %d):\n%s" % (rc, out)), flush=True)
            except (OSError, subprocess.SubprocessError):
                pass   # e.g. stdout closed (| head): still remove the directory below
        if not problems and not args.keep:
            shutil.rmtree(base, ignore_errors=True)
        ACTIVE.remove(t)
    rss = max(m.peak_rss for m in t.mounts) // KiB if t.mounts else 0
    mix = ", ".join("%s %d" % kv for kv in sorted(t.intended_counts.items())) or "none"
    if args.verbose:
        print("op mix: " + ", ".join("%s %d" % kv for kv in sorted(t.op_counts.items())))
    print("seed %d: %s, %d ops in %.1f s; daemon peak RSS %d MiB; intended differences seen: %s%s" % (
        seed, "PASS" if ok else "FAIL", t.step if not ok else ops, time.monotonic() - t0, rss, mix,
        "; SEEK_HOLE found no hole where the reference did: %d times" % t.no_hole_notes if t.no_hole_notes else ""), flush=True)
    return ok


def dump_context(t, replay):
    print("last %d operations ([op] call -> reference result, MOUNT: result where it differs):" % len(t.history))
    for line in t.history:
        print("  " + line)
    if t.mount is not None:
        print("daemon log tail (%s):\n%s" % (t.mount.log_path, t.mount.log_tail()))
    print("replay: %s --ops %d -v" % (replay, t.step), flush=True)


ACTIVE = []


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=None, help="random seed (default: random); alone, no regression seeds run")
    ap.add_argument("--ops", type=int, default=DEFAULT_OPS, help="operations (default %d)" % DEFAULT_OPS)
    ap.add_argument("-v", "--verbose", action="store_true", help="print every call")
    ap.add_argument("--keep-going", action="store_true",
                    help="triage: record each distinct difference or daemon death, start over on a fresh mount, list them all at the end")
    ap.add_argument("--no-regressions", action="store_true", help="do not replay REGRESSION_SEEDS first")
    ap.add_argument("--history", type=int, default=25, help="operations shown on failure")
    ap.add_argument("--rss-limit-mib", type=int, default=1024,
                    help="kill the daemon above this resident size, a failure (default 1024; it needs ~20)")
    ap.add_argument("--slow-call", type=float, default=10,
                    help="a call on the mount that takes longer fails the test (default 10 s)")
    ap.add_argument("--daemon-as-limit-mib", type=int, default=8192,
                    help="RLIMIT_AS of the daemon, a backstop for the RSS watch (default 8192; 0: none)")
    ap.add_argument("--hang-timeout", type=float, default=30, help="seconds one call may take (default 30)")
    ap.add_argument("--unmount-timeout", type=float, default=60, help="seconds for the daemon to exit after fusermount3 -u")
    ap.add_argument("--keep", action="store_true", help="keep the temp directory of a failed run")
    args = ap.parse_args()
    explicit_seed = args.seed is not None
    if args.seed is None:
        args.seed = random.SystemRandom().randrange(1, 2**31)
    print("seed %d" % args.seed, flush=True)

    binary = os.environ.get("UBIQUITY")
    script = os.path.relpath(os.path.abspath(sys.argv[0]))
    if script.startswith("../"):
        script = os.path.abspath(sys.argv[0])
    replay = "UBIQUITY=%s %s --seed %d" % (shlex.quote(binary or "..."), shlex.quote(script), args.seed)
    print("t-hostile: %d ops; replay: %s --ops %d" % (args.ops, replay, args.ops), flush=True)
    rc = _tdiff.preflight(binary)
    if rc is not None:
        return rc
    os.umask(0o022)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)   # EFBIG, not a signal, past a file size limit

    def cleanup_all():
        for t in list(ACTIVE):
            t.cleanup()
    atexit.register(cleanup_all)
    STUCK_HANDLERS.append(cleanup_all)

    def on_signal(signum, _frame):
        raise SystemExit(128 + signum)
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, on_signal)

    t0 = time.monotonic()
    results = []
    if not explicit_seed and not args.no_regressions:
        for i, (seed, ops, what) in enumerate(REGRESSION_SEEDS):
            print("regression seed %d (%d ops): %s" % (seed, ops, what), flush=True)
            results.append(run_seed(binary, args, seed, ops, "-reg%d" % i,
                                    "UBIQUITY=%s %s --seed %d" % (shlex.quote(binary), shlex.quote(script), seed)))
    results.append(run_seed(binary, args, args.seed, args.ops, "", replay))
    ok = all(results)
    print("t-hostile: %s in %.1f s (seed %d)" % ("PASS" if ok else "FAIL", time.monotonic() - t0, args.seed), flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
