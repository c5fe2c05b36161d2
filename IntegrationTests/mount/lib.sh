# shellcheck shell=bash
# Helpers for the real-mount scenarios (IntegrationTests/mount/t-*.sh). Source it first thing:
#
#   source "$(dirname "$0")/lib.sh"
#   mount_fresh main            # sets ROOT MNT STORE BACKING DATA DAEMON_PID
#   ... assertions ...
#   pass                        # optional: prints a PASS line
#
# Sync scenarios mount more devices on the same BACKING (mount_device NAME), wait for
# conditions instead of sleeping (wait_for, wait_eq, wait_content, wait_missing,
# wait_same_tree) and sync on demand (sync_dev, sync_all, pause_dev, resume_dev): see
# "Several devices sharing one backing directory" below.
#
# Every scenario runs as its own process. All of its files live under
# /tmp/ubiquity-test-$$-NAME/ (scripts/sweep-test-mounts.sh knows that prefix), and an
# EXIT trap unmounts what the script mounted (newest first), kills the daemons it
# started (by PID, never by name), removes its temp dirs, and fails the scenario if
# anything is still mounted under its prefix afterwards.
#
# Exit codes: 0 pass, 1 fail, 77 skipped (only when CI is not "true" and /dev/fuse
# cannot be opened).

set -euo pipefail

if [[ -z ${UBIQUITY:-} ]]; then
  echo "FAIL: UBIQUITY is not set (scripts/test.sh exports it; for a manual run:" \
    "UBIQUITY=/tmp/ubq/ubiquity $0)" >&2
  exit 1
fi
if [[ ! -x $UBIQUITY ]]; then
  echo "FAIL: UBIQUITY=$UBIQUITY is not an executable file" >&2
  exit 1
fi

TEST_NAME=$(basename "$0" .sh)
# $$ is this scenario's own PID, so concurrent or leftover runs never collide.
TEST_PREFIX="/tmp/ubiquity-test-$$-"
DEVICE=testdev
readonly SKIP_CODE=77

# Bookkeeping for cleanup. Parallel arrays: _UBQ_MOUNTS[i] was served by
# _UBQ_DAEMONS[i] (the same mount point appears again after a remount).
_UBQ_MOUNTS=()
_UBQ_DAEMONS=()
_UBQ_CLEANING=0

# Keep everything away from the real home: the daemon's default data dir, git's
# config, python caches.
export XDG_DATA_HOME="${TEST_PREFIX}home/data"
export GIT_CONFIG_NOSYSTEM=1 GIT_CONFIG_GLOBAL=/dev/null
export GIT_AUTHOR_NAME=ubiquity-test GIT_AUTHOR_EMAIL=test@ubiquity.invalid
export GIT_COMMITTER_NAME=ubiquity-test GIT_COMMITTER_EMAIL=test@ubiquity.invalid
export PYTHONDONTWRITEBYTECODE=1
# Expected timestamps in the scenarios are written for UTC.
export TZ=UTC

# ---------------------------------------------------------------------------------
# Messages and assertions. Every failure says what was expected and what was got.

_ubq_where() {
  # The first caller outside lib.sh: "t-foo.sh:42".
  local i
  for ((i = 1; i < ${#BASH_SOURCE[@]}; i++)); do
    if [[ ${BASH_SOURCE[i]} != "${BASH_SOURCE[0]}" ]]; then
      echo "$(basename "${BASH_SOURCE[i]}"):${BASH_LINENO[i - 1]}"
      return
    fi
  done
  echo "$TEST_NAME"
}

log() { printf '%s\n' "$*"; }
_UBQ_T0=${EPOCHREALTIME/,/.}
# step TEXT: a progress line with the seconds since the scenario started.
step() {
  printf -- '--- [%5.1fs] %s\n' "$(awk -v a="$_UBQ_T0" -v b="${EPOCHREALTIME/,/.}" 'BEGIN { print b - a }')" "$*"
}

fail() {
  printf 'FAIL [%s] %s\n' "$(_ubq_where)" "$*" >&2
  exit 1
}

skip() {
  printf 'SKIP [%s] %s\n' "$TEST_NAME" "$*" >&2
  exit "$SKIP_CODE"
}

pass() { printf 'PASS %s\n' "$TEST_NAME"; }

# assert_eq EXPECTED ACTUAL WHAT
assert_eq() {
  if [[ $1 != "$2" ]]; then
    fail "$3: expected [$1], got [$2]"
  fi
}

# assert_ne UNEXPECTED ACTUAL WHAT
assert_ne() {
  if [[ $1 == "$2" ]]; then
    fail "$3: expected something other than [$1]"
  fi
}

# assert_contains HAYSTACK NEEDLE WHAT
assert_contains() {
  if [[ $1 != *"$2"* ]]; then
    fail "$3: expected output containing [$2], got [$1]"
  fi
}

# assert_not_contains HAYSTACK NEEDLE WHAT
assert_not_contains() {
  if [[ $1 == *"$2"* ]]; then
    fail "$3: expected no [$2], got [$1]"
  fi
}

# json_count PATTERN [FILE]: how many lines of FILE (default: standard input) are JSON
# objects holding every field of PATTERN (a JSON object) with an equal value of the same
# JSON type; lines that are not JSON are skipped. For the control socket's lines and the
# CLI's --json output, which are JSON: a test parses them and never relies on key order.
_UBQ_JSON_COUNT='
import json, sys
def same(a, b):
    if type(a) is not type(b): return False
    if isinstance(a, dict): return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list): return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b
want = json.loads(sys.argv[1])
n = 0
for line in (open(sys.argv[2], errors="replace") if len(sys.argv) > 2 else sys.stdin):
    try: got = json.loads(line)
    except ValueError: continue
    if isinstance(got, dict) and all(k in got and same(v, got[k]) for k, v in want.items()): n += 1
print(n)'
json_count() { python3 -c "$_UBQ_JSON_COUNT" "$@"; }

# json_has FILE PATTERN: "yes" when a line of FILE matches PATTERN (json_count), else "no"
# (for wait_eq).
json_has() { if (($(json_count "$2" "$1") > 0)); then echo yes; else echo no; fi; }

# assert_same_file EXPECTED_FILE ACTUAL_FILE WHAT: byte-exact comparison by sha256.
assert_same_file() {
  local want got
  want=$(sha256sum <"$1" | cut -d' ' -f1)
  got=$(sha256sum <"$2" | cut -d' ' -f1) || fail "$3: cannot read $2"
  assert_eq "$want" "$got" "$3 (sha256 of $2 vs $1)"
}

# assert_file_content FILE EXPECTED_TEXT WHAT (compares the whole file; a trailing
# newline written by echo is part of EXPECTED_TEXT only if given).
assert_file_content() {
  local got
  got=$(cat -- "$1") || fail "$3: cannot read $1"
  assert_eq "$2" "$got" "$3"
}

# assert_exists PATH WHAT / assert_missing PATH WHAT (lstat, so dangling links count)
assert_exists() {
  if [[ ! -e $1 && ! -L $1 ]]; then fail "$2: expected $1 to exist, it does not"; fi
}
assert_missing() {
  if [[ -e $1 || -L $1 ]]; then fail "$2: expected $1 to be absent, it exists"; fi
}

# assert_fails WHAT CMD...: CMD must exit non-zero. Its stderr is kept in LAST_ERR
# for the scenario to look at.
# shellcheck disable=SC2034
LAST_ERR=
assert_fails() {
  local what=$1 errf
  shift
  errf=$(mktemp "${TEST_PREFIX}err.XXXXXX")
  if "$@" >/dev/null 2>"$errf"; then
    # shellcheck disable=SC2034
    LAST_ERR=$(cat "$errf")
    rm -f "$errf"
    fail "$what: expected [$*] to fail, it succeeded"
  fi
  # shellcheck disable=SC2034
  LAST_ERR=$(cat "$errf")
  rm -f "$errf"
}

# py_errno 'PYTHON STATEMENT': runs the statement with os/errno imported; prints "ok"
# or the errno name it raised (ENOTEMPTY, EROFS, ...). Used to check exact errno
# values that shell tools only show as translated text.
py_errno() {
  python3 - "$1" <<'EOF'
import errno, os, sys
try:
    exec(sys.argv[1])
    print("ok")
except OSError as e:
    print(errno.errorcode.get(e.errno, str(e.errno)))
EOF
}

# assert_errno EXPECTED 'PYTHON STATEMENT' WHAT (EXPECTED may be "A|B" for either)
assert_errno() {
  local got
  got=$(py_errno "$2")
  if [[ "|$1|" != *"|$got|"* ]]; then
    fail "$3: expected $1, got $got (from: $2)"
  fi
}

# xattr FILE NAME: value of one extended attribute ("" when absent).
xattr() {
  getfattr --absolute-names --only-values -n "$2" -- "$1" 2>/dev/null || true
}

# version_count PATH_IN_MOUNT: entries in MNT/.versions/PATH (0 if no history dir).
version_count() {
  local dir="$MNT/.versions/$1"
  if [[ -d $dir ]]; then
    find "$dir" -mindepth 1 -maxdepth 1 | wc -l
  else
    echo 0
  fi
}

# version_names PATH_IN_MOUNT: names in MNT/.versions/PATH, one a line, as ls sorts.
version_names() { LC_ALL=C ls -1 -- "$MNT/.versions/$1"; }

# bounded SECONDS WHAT CMD...: run CMD, failing the scenario if it has not finished
# within SECONDS. CMD runs in the background and is polled, never waited for
# blindly: a process stuck in a request to a hung daemon cannot be interrupted, and
# the cleanup (which kills the daemon) is what frees it. Prints how long it took.
bounded() {
  local limit=$1 what=$2 pid t0 took rc=0
  shift 2
  t0=${EPOCHREALTIME/,/.}
  "$@" &
  pid=$!
  while kill -0 "$pid" 2>/dev/null; do
    if awk -v a="$t0" -v b="${EPOCHREALTIME/,/.}" -v l="$limit" 'BEGIN { exit !(b - a > l) }'; then
      fail "$what: still running after ${limit}s ($(ps -o stat=,wchan:25= -p "$pid" 2>/dev/null || true))"
    fi
    sleep 0.1
  done
  wait "$pid" || rc=$?
  took=$(awk -v a="$t0" -v b="${EPOCHREALTIME/,/.}" 'BEGIN { printf "%.1f", b - a }')
  log "    $what took ${took}s"
  ((rc == 0)) || fail "$what: exited with status $rc"
}

# require_cmd NAME [HOW TO GET IT]: a missing tool is a failure, never a skip.
require_cmd() {
  command -v "$1" >/dev/null 2>&1 || fail "required tool '$1' is missing${2:+ ($2)}"
}

# ---------------------------------------------------------------------------------
# FUSE availability: skipping is allowed only outside CI.

require_fuse() {
  local why=""
  # UBQ_FUSE_DEV exists only to test this logic itself (point it at a missing file).
  local dev=${UBQ_FUSE_DEV:-/dev/fuse}
  # -c first: `<>` would create a plain file where no device is.
  if [[ ! -c $dev ]] || ! { : <>"$dev"; } 2>/dev/null; then
    why="$dev cannot be opened"
  elif ! command -v fusermount3 >/dev/null 2>&1; then
    why="fusermount3 is missing (apt-get install fuse3)"
  fi
  if [[ -n $why ]]; then
    if [[ ${CI:-} == true ]]; then
      fail "$why, and under CI=true that is a failure, not a skip"
    fi
    skip "$why"
  fi
}

# ---------------------------------------------------------------------------------
# Mounts.

# is_mounted PATH: PATH is a mount point right now (exact match in the mount table).
is_mounted() { findmnt -rn -M "$1" >/dev/null 2>&1; }

# is_dead_mount PATH: PATH is a mount whose daemon is gone (the kernel answers ENOTCONN).
# `ubiquity mount` clears such a mount itself, so remounting over it is allowed. Asked with
# statfs (`stat -f`), which always reaches the daemon: a plain stat of the root may be
# answered from the kernel's attribute cache (5 minutes) after the daemon died, which made
# crash_daemon call a dead mount live when auto_unmount was slow (t-backing-gc, under load).
is_dead_mount() {
  is_mounted "$1" && [[ $(timeout 5 stat -f -c %i "$1" 2>&1) == *"not connected"* ]]
}

# _process_alive PID: running, not a zombie (a dead process waits for its reaper, which in
# some containers takes a second or more).
_process_alive() {
  local state
  state=$(ps -o stat= -p "$1" 2>/dev/null) || return 1
  [[ $state != Z* ]]
}

# crash_daemon: SIGKILL the daemon of MNT and wait until the process is really gone (a
# thread in an fsync finishes it first: seconds on a slow CI disk), then give
# fusermount3's auto_unmount a moment. What may remain is a dead mount, which the next
# `ubiquity mount` clears as it would for a user.
crash_daemon() {
  kill -9 "$DAEMON_PID"
  local i
  for i in $(seq 600); do _process_alive "$DAEMON_PID" || break; sleep 0.1; done
  ! _process_alive "$DAEMON_PID" || fail "daemon $DAEMON_PID still alive 60 s after SIGKILL"
  for i in $(seq 50); do is_mounted "$MNT" || break; sleep 0.1; done
  ! is_mounted "$MNT" || is_dead_mount "$MNT" || fail "$MNT is still a live mount after its daemon was killed"
}

# simulate_reboot STORE: what a power loss does besides dropping writes: the next mount
# runs in another boot than the one the store's last mount noted, so it reads back what
# was written since the last durability barrier (Store+Recovery). The daemon must be dead.
simulate_reboot() {
  python3 -c 'import sqlite3, sys; c = sqlite3.connect(sys.argv[1]); c.execute("DELETE FROM settings WHERE key = ?", ("boot_id",)); c.commit()' "$1/meta.sqlite"
}

# mount_tmpfs SIZE DIR: a tmpfs of SIZE (e.g. 48m) on DIR (root only), unmounted by the
# cleanup after every ubiquity mount.
_UBQ_PLAIN_MOUNTS=()
mount_tmpfs() {
  mount -t tmpfs -o "size=$1" ubiquity-test-tmpfs "$2"
  _UBQ_PLAIN_MOUNTS+=("$2")
}

# mounts_under_prefix: every mount point this script could have made that is live.
mounts_under_prefix() {
  findmnt -rn -o TARGET 2>/dev/null | grep -F -- "$TEST_PREFIX" || true
}

# The state file lets IntegrationTests/mount/run.sh clean up after a scenario it had to kill
# (its EXIT trap then never ran).
_ubq_state() {
  if [[ -n ${UBQ_STATE_FILE:-} ]]; then
    printf '%s\n' "$*" >>"$UBQ_STATE_FILE"
  fi
}

# s3_backing NAME: sets UBQ_BACKING to a fresh prefix of the loopback S3 server's bucket
# (scripts/test.sh starts it and exports AWS_* and UBIQUITY_S3_BUCKET), so the next
# mount_fresh and its devices sync through S3. Fails when no server is configured.
s3_backing() {
  [[ -n ${UBIQUITY_S3_BUCKET:-} && -n ${AWS_ENDPOINT_URL:-} ]] ||
    fail "no S3 server: UBIQUITY_S3_BUCKET/AWS_ENDPOINT_URL unset (scripts/test.sh starts one; or eval \"\$(scripts/s3-server.sh start /tmp/s3)\")"
  UBQ_BACKING="s3://$UBIQUITY_S3_BUCKET/ubq-test-$$-$1-$RANDOM"
}

# mount_fresh NAME [MOUNT-ARG...]: new ROOT=/tmp/ubiquity-test-$$-NAME/ with mnt store
# backing data, mounted as device $DEVICE (set DEVICE=... before it to name it). Sets
# ROOT MNT STORE BACKING DATA and DAEMON_PID. Extra arguments go to `ubiquity mount`
# (e.g. --poll 0.2) and are kept in MOUNT_ARGS for remount and _ubq_mount.
#
# UBQ_USER=UID (set before mount_fresh): the mount is that user's own, made and served by
# a daemon running as UID (through fusermount3, without allow_other), as a login mount
# is; ROOT is theirs. Needs root, which opens /dev/fuse to others for the scenario.
MOUNT_ARGS=()
mount_fresh() {
  local name=$1
  shift
  require_fuse
  ROOT="${TEST_PREFIX}${name}"
  [[ ! -e $ROOT ]] || fail "$ROOT already exists"
  mkdir -p "$ROOT"/{mnt,store,backing,data}
  if [[ -n ${UBQ_USER:-} ]]; then
    chown -R "$UBQ_USER:$UBQ_USER" "$ROOT"
    _ubq_open_dev_fuse
  fi
  _ubq_state "root $ROOT"
  MNT="$ROOT/mnt" STORE="$ROOT/store" BACKING="${UBQ_BACKING:-$ROOT/backing}" DATA="$ROOT/data"
  MOUNT_ARGS=("$@")
  _ubq_mount
}

# _ubq_mount: mount MNT with STORE/BACKING/DATA/DEVICE (+ MOUNT_ARGS) and record the
# daemon; sets DAEMON_PID.
_ubq_mount() {
  _ubq_mount_at "$MNT" "$STORE" "$BACKING" "$DATA" "$DEVICE" ${MOUNT_ARGS[@]+"${MOUNT_ARGS[@]}"}
  DAEMON_PID=$_UBQ_PID
}

# _ubq_mount_at MNT STORE BACKING DATA DEVICE [MOUNT-ARG...]: `ubiquity mount` and record
# the mount and its daemon for cleanup (the one place that does); sets _UBQ_PID. The
# mount point stays right after "mount" on the command line: cleanup and run.sh find a
# daemon by " mount MNT" in its command line.
_UBQ_PID=
_ubq_mount_at() {
  local mnt=$1 store=$2 backing=$3 data=$4 device=$5 out pid as=()
  shift 5
  ! is_mounted "$mnt" || is_dead_mount "$mnt" || fail "$mnt is already mounted"
  [[ -z ${UBQ_USER:-} ]] || as=(setpriv --reuid="$UBQ_USER" --regid="$UBQ_USER" --clear-groups env HOME=/nonexistent)
  if ! out=$(XDG_DATA_HOME="$data" timeout 60 ${as[@]+"${as[@]}"} "$UBIQUITY" mount "$mnt" --store "$store" \
    --backing "$backing" --device "$device" "$@" 2>&1); then
    _ubq_record_from_status "$mnt"
    fail "ubiquity mount $mnt failed: $out"
  fi
  # "Mounted MNT (daemon pid N, log ...)": the PID is what cleanup kills if needed.
  pid=$(sed -n 's/.*daemon pid \([0-9][0-9]*\).*/\1/p' <<<"$out" | head -n1)
  _UBQ_MOUNTS+=("$mnt")
  _UBQ_DAEMONS+=("${pid:-0}")
  _ubq_state "mount $mnt ${pid:-0}"
  [[ -n $pid ]] || fail "no daemon pid in the output of ubiquity mount: [$out]"
  _UBQ_PID=$pid
  is_mounted "$mnt" || fail "ubiquity mount returned 0 but $mnt is not mounted: [$out]"
}

# count_requests CMD...: runs CMD while strace records the requests the daemon
# (DAEMON_PID) reads from /dev/fuse; sets REQUESTS to "opcode:count ..." of them (opcodes
# of linux/fuse.h: 3 GETATTR, 10 UNLINK, 16 WRITE, 22 GETXATTR).
REQUESTS=
count_requests() {
  local trace=$DATA/strace tracer
  strace -f -q -e trace=read -e signal=none -x -s 8 -p "$DAEMON_PID" -o "$trace" &
  tracer=$!
  sleep 1 # attached to every thread
  "$@"
  sleep 0.5
  kill -INT "$tracer"
  wait "$tracer" || true
  # Each completed read ("\x.."..., SIZE) = N) is one request, whose first 8 bytes are its
  # length and opcode (fuse_in_header, little-endian).
  REQUESTS=$(python3 - "$trace" <<'PY'
import collections, re, sys
seen = collections.Counter()
for m in re.finditer(r'"((?:\\x[0-9a-f]{2}){8})"(?:\.\.\.)?, \d+\) = \d+', open(sys.argv[1]).read()):
    head = bytes.fromhex(m.group(1).replace("\\x", ""))
    seen[int.from_bytes(head[4:8], "little")] += 1
print(" ".join(f"{op}:{n}" for op, n in sorted(seen.items())))
PY
  )
}

# request_count OPCODE: how many of that opcode count_requests saw (0 if none).
request_count() {
  local n
  n=$(tr ' ' '\n' <<<"$REQUESTS" | sed -n "s/^$1://p")
  echo "${n:-0}"
}

# _ubq_open_dev_fuse: lets every user open /dev/fuse (fusermount3 needs it: some machines
# keep it root's) until the scenario exits.
_UBQ_DEV_FUSE_MODE=
_ubq_open_dev_fuse() {
  [[ -z $_UBQ_DEV_FUSE_MODE ]] || return 0
  [[ $(id -u) == 0 ]] || fail "UBQ_USER needs root (it mounts as another user)"
  _UBQ_DEV_FUSE_MODE=$(stat -c %a /dev/fuse)
  on_exit chmod "$_UBQ_DEV_FUSE_MODE" /dev/fuse
  chmod a+rw /dev/fuse
}

# If mount failed half-way, still remember the mount point (default MNT) so cleanup
# checks it.
_ubq_record_from_status() {
  local mnt=${1:-$MNT}
  _UBQ_MOUNTS+=("$mnt")
  _UBQ_DAEMONS+=(0)
  _ubq_state "mount $mnt 0"
}

# unmount_it: `ubiquity unmount MNT`, which must commit, unmount and wait for the
# daemon to exit. Any of those not happening fails the scenario.
unmount_it() { _ubq_unmount_at "$MNT" "${DAEMON_PID:-}"; }

# _ubq_unmount_at MNT [PID]: unmount_it for any mount point (PID: its daemon).
_ubq_unmount_at() {
  local mnt=$1 pid=${2:-} out
  cd /
  if ! out=$(timeout 90 "$UBIQUITY" unmount "$mnt" --timeout 60 2>&1); then
    fail "ubiquity unmount $mnt failed: $out"
  fi
  if is_mounted "$mnt"; then
    fail "ubiquity unmount returned 0 but $mnt is still mounted: $out"
  fi
  if [[ -n $pid ]] && _ubq_is_our_daemon "$pid" "$mnt"; then
    fail "ubiquity unmount returned but daemon $pid is still running"
  fi
}

# remount: unmount_it, then mount the same store/backing/data again (a new daemon).
remount() {
  unmount_it
  _ubq_mount
}

# _ubq_is_our_daemon PID MNT: PID is alive and is the ubiquity daemon serving MNT
# (guards against PID reuse before we signal it).
_ubq_is_our_daemon() {
  local pid=$1 mnt=$2 cmd
  [[ $pid =~ ^[1-9][0-9]*$ ]] || return 1
  cmd=$(tr '\0' ' ' 2>/dev/null <"/proc/$pid/cmdline") || return 1
  [[ $cmd == *" mount "*"$mnt"* || $cmd == *" mount $mnt"* ]]
}

# _ubq_daemons_of MNT: PIDs of ubiquity daemons whose command line names MNT.
_ubq_daemons_of() {
  local p
  for p in /proc/[0-9]*; do
    _ubq_is_our_daemon "${p#/proc/}" "$1" && echo "${p#/proc/}"
  done
  return 0
}

# ---------------------------------------------------------------------------------
# Several devices sharing one backing directory (sync scenarios).
#
#   DEVICE=alpha
#   mount_fresh sync --poll 0.2     # device alpha: MNT STORE BACKING DATA DAEMON_PID
#   mount_device beta --poll 0.2    # device beta: MNT_beta STORE_beta DATA_beta PID_beta
#   echo hi >"$MNT/f"; wait_content "$MNT_beta/f" hi "f on beta"
#
# Each extra device lives in $ROOT/dev-NAME/{mnt,store,data}, shares $BACKING, is named
# NAME (--device NAME) and is registered for cleanup exactly like mount_fresh's mount.

_UBQ_DEV_NAMES=()
declare -gA _UBQ_DEV_ARGS=()

# mount_device NAME [MOUNT-ARG...]: mount device NAME on the scenario's BACKING. Sets
# MNT_NAME STORE_NAME DATA_NAME PID_NAME. Called again for a device that is unmounted,
# it mounts the same store again (with the same arguments unless new ones are given).
mount_device() {
  local name=$1 dir
  shift
  [[ $name =~ ^[A-Za-z0-9_]+$ ]] ||
    fail "mount_device: device name [$name] may only have letters, digits and _ (it names variables)"
  [[ -n ${ROOT:-} && -n ${BACKING:-} ]] ||
    fail "mount_device $name: mount_fresh first (it makes ROOT and the shared BACKING)"
  [[ $name != "$DEVICE" ]] || fail "mount_device $name: that is already the main device's name (DEVICE)"
  dir="$ROOT/dev-$name"
  if [[ -z ${_UBQ_DEV_ARGS[$name]+set} ]]; then
    [[ ! -e $dir ]] || fail "mount_device $name: $dir already exists"
    mkdir -p "$dir"/{mnt,store,data}
    [[ -z ${UBQ_USER:-} ]] || chown -R "$UBQ_USER:$UBQ_USER" "$dir"
    _UBQ_DEV_NAMES+=("$name")
    printf -v "MNT_$name" '%s' "$dir/mnt"
    printf -v "STORE_$name" '%s' "$dir/store"
    printf -v "DATA_$name" '%s' "$dir/data"
    _UBQ_DEV_ARGS[$name]=""
  fi
  if (($# > 0)); then _UBQ_DEV_ARGS[$name]=${*@Q}; fi
  local -a args=()
  eval "args=(${_UBQ_DEV_ARGS[$name]})"
  _ubq_mount_at "$dir/mnt" "$dir/store" "$BACKING" "$dir/data" "$name" ${args[@]+"${args[@]}"}
  printf -v "PID_$name" '%s' "$_UBQ_PID"
}

# _ubq_dev_known NAME: fail unless NAME is the main device or one mount_device made.
_ubq_dev_known() {
  [[ $1 == "$DEVICE" || -n ${_UBQ_DEV_ARGS[$1]+set} ]] || fail "no device named [$1] in this scenario"
}

# mnt_of NAME / pid_of NAME: mount point / daemon PID of a device (also the main one).
mnt_of() {
  _ubq_dev_known "$1"
  if [[ $1 == "$DEVICE" ]]; then echo "$MNT"; else local v="MNT_$1"; echo "${!v}"; fi
}
pid_of() {
  _ubq_dev_known "$1"
  if [[ $1 == "$DEVICE" ]]; then echo "${DAEMON_PID:-}"; else local v="PID_$1"; echo "${!v:-}"; fi
}

# unmount_device NAME: unmount_it for device NAME. remount_device NAME: unmount, mount.
unmount_device() {
  _ubq_dev_known "$1"
  [[ $1 != "$DEVICE" ]] || fail "unmount_device: use unmount_it for the main device"
  _ubq_unmount_at "$(mnt_of "$1")" "$(pid_of "$1")"
}
remount_device() {
  unmount_device "$1"
  mount_device "$1"
}

# assert_daemon_alive NAME: the daemon of device NAME is still running (and still is
# the daemon of its mount point, not a reused PID) and its mount is live.
assert_daemon_alive() {
  local pid mnt
  pid=$(pid_of "$1")
  mnt=$(mnt_of "$1")
  kill -0 "$pid" 2>/dev/null || fail "device $1: kill -0 $pid failed: its daemon is gone"
  _ubq_is_our_daemon "$pid" "$mnt" || fail "device $1: pid $pid is no longer the daemon of $mnt"
  is_mounted "$mnt" || fail "device $1: $mnt is not mounted any more"
}

# device_mounts: mount points of this scenario's devices that are mounted now, main first.
device_mounts() {
  local n m
  if [[ -n ${MNT:-} ]] && is_mounted "$MNT"; then echo "$MNT"; fi
  for n in ${_UBQ_DEV_NAMES[@]+"${_UBQ_DEV_NAMES[@]}"}; do
    m=$(mnt_of "$n")
    if is_mounted "$m"; then echo "$m"; fi
  done
}

# ubq ARG...: `ubiquity ARG...`, at most 60 s; prints its stdout. A non-zero exit (or
# the time limit) fails the scenario, showing the command's stdout and stderr.
ubq() {
  local out err errf rc=0
  errf=$(mktemp "${TEST_PREFIX}err.XXXXXX")
  out=$(timeout -k 5 60 "$UBIQUITY" "$@" 2>"$errf") || rc=$?
  err=$(cat "$errf")
  rm -f "$errf"
  if ((rc == 124 || rc == 137)); then
    fail "ubiquity $*: still running after 60 s (exit $rc from timeout): stdout [$out] stderr [$err]"
  elif ((rc != 0)); then
    fail "ubiquity $*: exit $rc: stdout [$out] stderr [$err]"
  fi
  if [[ -n $out ]]; then printf '%s\n' "$out"; fi
}

# sync_dev MNT...: `ubiquity sync` each mount point in turn (push and pull now).
sync_dev() {
  local m
  for m in "$@"; do ubq sync "$m" >/dev/null; done
}

# sync_all: sync every mounted device of the scenario, in order, twice. Two rounds are
# enough for all of them to have read all records: round one pushes everything (each
# device also pulls what the earlier ones pushed), round two pulls the rest.
sync_all() {
  local -a mounts
  mapfile -t mounts < <(device_mounts)
  ((${#mounts[@]} > 0)) || fail "sync_all: no device is mounted"
  sync_dev "${mounts[@]}"
  sync_dev "${mounts[@]}"
}

# pause_dev MNT / resume_dev MNT: stop / restart syncing that device (Airplane Mode).
pause_dev() { ubq pause "$1" >/dev/null; }
resume_dev() { ubq resume "$1" >/dev/null; }

# sync_status MNT KEY: one value of the daemon's sync status (the key=value lines of
# user.ubiquity.sync on the mount point: state, pending, conflicts, device-id, ...).
sync_status() { xattr "$1" user.ubiquity.sync | sed -n "s/^$2=//p"; }

# Waiting for a condition instead of sleeping. Every wait_* takes an optional first
# "-t SECONDS" (default WAIT_TIMEOUT, 10 s), polls every 0.1 s, and on timeout fails
# saying what was expected and what was last seen.
WAIT_TIMEOUT=${WAIT_TIMEOUT:-10}

# _ubq_deadline SECONDS: EPOCHREALTIME in microseconds, SECONDS from now.
_ubq_deadline() {
  echo $((${EPOCHREALTIME/[.,]/} + $(awk -v s="$1" 'BEGIN { printf "%d", s * 1000000 }')))
}
_ubq_past() { ((${EPOCHREALTIME/[.,]/} > $1)); }

# wait_for [-t SECONDS] WHAT CMD...: until CMD succeeds.
wait_for() {
  local limit=$WAIT_TIMEOUT what out deadline
  if [[ ${1:-} == -t ]]; then limit=$2; shift 2; fi
  what=$1
  shift
  deadline=$(_ubq_deadline "$limit")
  while :; do
    if out=$("$@" 2>&1); then return 0; fi
    if _ubq_past "$deadline"; then
      fail "$what: still not true after ${limit}s: [$*]${out:+ last said [$out]}"
      # shellcheck disable=SC2317 # not reached while fail exits; kept in case fail is overridden
      return 1
    fi
    sleep 0.1
  done
}

# wait_eq [-t SECONDS] EXPECTED WHAT CMD...: until CMD prints EXPECTED (as $(...) sees
# it: trailing newlines stripped) and exits 0.
wait_eq() {
  local limit=$WAIT_TIMEOUT want what got rc deadline errf
  if [[ ${1:-} == -t ]]; then limit=$2; shift 2; fi
  want=$1 what=$2
  shift 2
  deadline=$(_ubq_deadline "$limit")
  errf=$(mktemp "${TEST_PREFIX}err.XXXXXX")
  while :; do
    rc=0
    got=$("$@" 2>"$errf") || rc=$?
    if ((rc == 0)) && [[ $got == "$want" ]]; then
      rm -f "$errf"
      return 0
    fi
    if _ubq_past "$deadline"; then
      ((rc == 0)) || got="$got [exit $rc: $(cat "$errf")]"
      rm -f "$errf"
      fail "$what: expected [$want], got [$got] (still after ${limit}s, from: $*)"
      # shellcheck disable=SC2317 # not reached while fail exits; kept in case fail is overridden
      return 1
    fi
    sleep 0.1
  done
}

# wait_content [-t SECONDS] FILE EXPECTED WHAT: until FILE reads EXPECTED (compared as
# assert_file_content does).
wait_content() {
  local t=()
  if [[ ${1:-} == -t ]]; then t=(-t "$2"); shift 2; fi
  wait_eq ${t[@]+"${t[@]}"} "$2" "$3" cat -- "$1"
}

# wait_exists [-t SECONDS] PATH WHAT / wait_missing [-t SECONDS] PATH WHAT (lstat).
_ubq_present() { [[ -e $1 || -L $1 ]]; }
_ubq_absent() { [[ ! -e $1 && ! -L $1 ]]; }
wait_exists() {
  local t=()
  if [[ ${1:-} == -t ]]; then t=(-t "$2"); shift 2; fi
  wait_for ${t[@]+"${t[@]}"} "$2: expected $1 to appear" _ubq_present "$1"
}
wait_missing() {
  local t=()
  if [[ ${1:-} == -t ]]; then t=(-t "$2"); shift 2; fi
  wait_for ${t[@]+"${t[@]}"} "$2: expected $1 to disappear" _ubq_absent "$1"
}

# version_names_at MNT PATH / version_count_at MNT PATH: version_names / version_count
# for any mount point. conflict_names MNT PATH / conflict_count MNT PATH: the same for
# MNT/.conflicts/PATH/ (nothing / 0 when that directory is absent).
version_names_at() {
  if [[ -d $1/.versions/$2 ]]; then LC_ALL=C ls -1 -- "$1/.versions/$2"; fi
}
version_count_at() {
  local names
  names=$(version_names_at "$1" "$2")
  if [[ -z $names ]]; then echo 0; else wc -l <<<"$names"; fi
}
conflict_names() {
  if [[ -d $1/.conflicts/$2 ]]; then LC_ALL=C ls -1 -- "$1/.conflicts/$2"; fi
}
conflict_count() {
  local names
  names=$(conflict_names "$1" "$2")
  if [[ -z $names ]]; then echo 0; else wc -l <<<"$names"; fi
}

# tree_state DIR: one line per entry below DIR (sorted; .versions and .conflicts at the
# top skipped): type, path, mode; for files size, mtime in ns, sha256 prefix; symlink
# targets; user.* xattrs except user.ubiquity.*. Directory and symlink times are left
# out. Two devices in sync print the same.
tree_state() {
  python3 - "$1" <<'PY'
import hashlib, os, stat, sys

def xattrs(p):
    try:
        names = sorted(n for n in os.listxattr(p, follow_symlinks=False)
                       if n.startswith("user.") and not n.startswith("user.ubiquity."))
        return "".join(f" {n}={os.getxattr(p, n, follow_symlinks=False).hex()}" for n in names)
    except OSError as e:
        return f" xattrs:{os.strerror(e.errno)}"

def walk(d, rel):
    for name in sorted(os.listdir(d)):
        if rel == "" and name in (".versions", ".conflicts"):
            continue
        p, r = os.path.join(d, name), rel + name
        st = os.lstat(p)
        mode = format(stat.S_IMODE(st.st_mode), "o")
        if stat.S_ISLNK(st.st_mode):
            print(f"link {r!a} -> {os.readlink(p)!a}")
        elif stat.S_ISDIR(st.st_mode):
            print(f"dir  {r!a} {mode}{xattrs(p)}")
            walk(p, r + "/")
        elif stat.S_ISREG(st.st_mode):
            with open(p, "rb") as f:
                digest = hashlib.sha256(f.read()).hexdigest()[:16]
            print(f"file {r!a} {mode} size={st.st_size} mtime={st.st_mtime_ns} {digest}{xattrs(p)}")
        else:
            print(f"other {r!a} {st.st_mode:o}")

walk(sys.argv[1], "")
PY
}

# _ubq_tree_diff TREE1 TREE2: unified diff of two tree_state outputs (first 60 lines).
_ubq_tree_diff() { diff -u <(printf '%s\n' "$1") <(printf '%s\n' "$2") | tail -n +3 | head -n 60; }

# assert_same_tree DIR1 DIR2 WHAT: tree_state of both equal; else fail with the diff.
assert_same_tree() {
  local t1 t2
  t1=$(tree_state "$1") || fail "$3: tree_state $1 failed"
  t2=$(tree_state "$2") || fail "$3: tree_state $2 failed"
  if [[ $t1 != "$t2" ]]; then
    fail "$3: trees differ (- $1, + $2):"$'\n'"$(_ubq_tree_diff "$t1" "$t2")"
  fi
}

# wait_same_tree [-t SECONDS] DIR1 DIR2 WHAT: until tree_state of both is equal.
wait_same_tree() {
  local limit=$WAIT_TIMEOUT deadline t1 t2
  if [[ ${1:-} == -t ]]; then limit=$2; shift 2; fi
  deadline=$(_ubq_deadline "$limit")
  while :; do
    t1=$(tree_state "$1" 2>&1) || true
    t2=$(tree_state "$2" 2>&1) || true
    [[ $t1 != "$t2" ]] || return 0
    if _ubq_past "$deadline"; then
      fail "$3: trees still differ after ${limit}s (- $1, + $2):"$'\n'"$(_ubq_tree_diff "$t1" "$t2")"
      # shellcheck disable=SC2317 # not reached while fail exits; kept in case fail is overridden
      return 1
    fi
    sleep 0.2
  done
}

# Backing directory records by hand (docs/FORMAT.md), for scenarios that play a
# foreign or broken device.

# rand_hex N: N random lowercase hex digits (N even).
rand_hex() { od -An -N$(($1 / 2)) -tx1 /dev/urandom | tr -d ' \n'; }

# pct_encode TEXT: FORMAT.md's value encoding (every byte outside A-Z a-z 0-9 . _ ~ - /
# as %XX, uppercase). TEXT is taken as bytes (invalid UTF-8 stays as it is).
pct_encode() {
  python3 -c 'import os, sys, urllib.parse; print(urllib.parse.quote(os.fsencode(sys.argv[1]), safe="/"))' "$1"
}

# record_line KEY=VALUE...: one record line "U2 <checksum> KEY=VALUE ..." (docs/FORMAT.md,
# "Journal": the first 32 hex digits of the body's sha256) with its final \n. Values are
# written as given (encode them with pct_encode where needed).
record_line() {
  local body="$*" sum
  sum=$(printf '%s' "$body" | sha256sum | cut -d' ' -f1)
  printf 'U2 %s %s\n' "${sum:0:32}" "$body"
}

# now_ms: the clock in milliseconds, as segment names (log/<t>-...) carry it.
now_ms() { echo $((${EPOCHREALTIME/[.,]/} / 1000)); }

# backing_put_segment BACKING DEVICE SEQ [T]: stdin as the segment log/<T>-<DEVICE>-<SEQ>
# (backing format 5; SEQ decimal, written as 16 hex digits; T in ms, default now, 13
# digits), written whole under a temp name and renamed, as a device would (a segment is
# never appended to). Prints the key.
backing_put_segment() {
  local t=${4:-$(now_ms)} key
  key=$(printf 'log/%013d-%s-%016x' "$t" "$2" "$3")
  mkdir -p "$1/log"
  cat >"$1/log/.tmp-test-$$"
  mv -f -- "$1/log/.tmp-test-$$" "$1/$key"
  echo "$key"
}

# backing_put_pack BACKING FILE... : a pack (docs/FORMAT.md, "Backing format 5":
# "UBQPACK1", the chunks, the index, count, "UBQPIDX1") holding each FILE as one chunk,
# written under a temp name and renamed to packs/<xx>/<32 random hex>. Prints, per
# FILE, the chunks item a record names it by: "<sha256>:<size>@<pack>:<offset>".
# PACK_NAME=<32 hex> names the pack instead (e.g. one a record already names).
backing_put_pack() {
  python3 - "$@" <<'PY'
import hashlib, os, sys
backing, files = sys.argv[1], sys.argv[2:]
name = os.environ.get("PACK_NAME") or os.urandom(16).hex()
data, index, items = bytearray(b"UBQPACK1"), bytearray(), []
for f in files:
    chunk = open(f, "rb").read()
    sha = hashlib.sha256(chunk)
    items.append(f"{sha.hexdigest()}:{len(chunk)}@{name}:{len(data)}")
    data += chunk
    index += sha.digest() + len(chunk).to_bytes(4, "little")
data += index + len(files).to_bytes(4, "little") + b"UBQPIDX1"
d = f"{backing}/packs/{name[:2]}"
os.makedirs(d, exist_ok=True)
with open(f"{d}/.tmp-test-{os.getpid()}", "wb") as out:
    out.write(data)
os.rename(f"{d}/.tmp-test-{os.getpid()}", f"{d}/{name}")
print("\n".join(items))
PY
}

# backing_packs BACKING: the packs in BACKING, one name a line, sorted.
backing_packs() {
  find "$1/packs" -mindepth 2 -maxdepth 2 -type f -regextype posix-extended \
    -regex '.*/packs/[0-9a-f]{2}/[0-9a-f]{32}' -printf '%f\n' 2>/dev/null | LC_ALL=C sort
}

# backing_packs_holding BACKING SHA256: the packs whose index lists chunk SHA256 with
# bytes there that hash to it, one name a line (read from each pack's index, as gc or
# fsck would).
backing_packs_holding() {
  python3 - "$1" "$2" <<'PY'
import hashlib, os, sys
backing, want = sys.argv[1], sys.argv[2]
for xx in sorted(os.listdir(f"{backing}/packs")) if os.path.isdir(f"{backing}/packs") else []:
    for name in sorted(os.listdir(f"{backing}/packs/{xx}")):
        if len(name) != 32 or name.startswith(".tmp-"):
            continue
        data = open(f"{backing}/packs/{xx}/{name}", "rb").read()
        if not (data.startswith(b"UBQPACK1") and data.endswith(b"UBQPIDX1")):
            continue
        count = int.from_bytes(data[-12:-8], "little")
        index = data[-12 - 36 * count:-12]
        off = 8
        for i in range(count):
            sha, n = index[36 * i:36 * i + 32].hex(), int.from_bytes(index[36 * i + 32:36 * i + 36], "little")
            if sha == want and hashlib.sha256(data[off:off + n]).hexdigest() == want:
                print(name)
                break
            off += n
PY
}

# backing_segments BACKING [DEVICE]: the segment names in BACKING/log (of DEVICE only if
# given), in key order.
backing_segments() {
  local dev='[0-9a-f]{16}'
  [[ -z ${2:-} ]] || dev=$2
  find "$1/log" -maxdepth 1 -type f -regextype posix-extended \
    -regex ".*/log/[0-9]{13}-$dev-[0-9a-f]{16}" -printf '%f\n' 2>/dev/null | LC_ALL=C sort
}

# backing_device_id NAME: the device id whose records carry name=NAME in the scenario's
# BACKING: the <device> of a segment log/<t>-<device>-<seq> or a checkpoint
# devices/<device>/checkpoint-*/ holding such a line (nothing if none yet).
backing_device_id() {
  local f enc dev
  enc=$(pct_encode "$1")
  for f in "$BACKING"/log/* "$BACKING"/devices/*/checkpoint-*/[0-9]*; do
    [[ -f $f ]] || continue
    if grep -qE -- " name=${enc//./\\.}( |\$)" "$f"; then
      if [[ $f == */log/* ]]; then
        dev=${f##*/log/}
        dev=${dev#*-}
        echo "${dev%-*}"
      else
        dev=${f#"$BACKING"/devices/}
        echo "${dev%%/*}"
      fi
      return 0
    fi
  done
}

# on_failure CMD...: run CMD (eval'd, at most 20 s) if the scenario fails, before the
# cleanup unmounts anything, to print what helps understand the failure.
_UBQ_FAIL_HOOKS=()
on_failure() { _UBQ_FAIL_HOOKS+=("$*"); }
# on_exit CMD...: run CMD at the end whatever happens, before the mounts go (e.g. to
# restart a server the scenario stopped). after_unmount CMD...: the same, once every
# mount is gone (e.g. to end a helper process the daemons were talking to).
_UBQ_EXIT_HOOKS=()
_UBQ_LATE_HOOKS=()
on_exit() { _UBQ_EXIT_HOOKS+=("$*"); }
after_unmount() { _UBQ_LATE_HOOKS+=("$*"); }

_ubq_run_failure_hooks() {
  local h hp n
  for h in ${_UBQ_FAIL_HOOKS[@]+"${_UBQ_FAIL_HOOKS[@]}"}; do
    (eval "$h") &
    hp=$!
    for ((n = 0; n < 200; n++)); do
      kill -0 "$hp" 2>/dev/null || break
      sleep 0.1
    done
    if kill -0 "$hp" 2>/dev/null; then
      # Probably stuck in a request to a hung daemon: leave it, unmounting frees it.
      echo "cleanup: failure hook [$h] still running after 20 s; not waiting for it" >&2
      kill -KILL "$hp" 2>/dev/null
    else
      wait "$hp" 2>/dev/null
    fi
  done
}

# dump_sync_state: what every mounted device shows (names, no .versions), and the last
# segments in BACKING/log (each device's records), one short line per record, and the
# checkpoints and fossil markers there. Sync scenarios register it with on_failure.
dump_sync_state() {
  local m j b=${BACKING:-/nonexistent}
  while read -r m; do
    [[ -n $m ]] || continue
    echo "--- tree of $m (.conflicts included):"
    (cd "$m" && find . -path ./.versions -prune -o -print | LC_ALL=C sort | head -n 80)
    # What the daemon serves (O_DIRECT: past the kernel's page cache) against what a read
    # gets, the newest version's name, the device of the version shown and whether the
    # file has unsaved writes, of the small files at the top: a file that reads old tells
    # a missed notice from a change not applied, and a change not applied from one
    # deferred for unsaved writes.
    echo "--- small files at the top of $m: cached read | direct read | newest version | shown from | dirty"
    (cd "$m" && find . -maxdepth 1 -type f -size -2k 2>/dev/null | LC_ALL=C sort | head -n 20 | while read -r f; do
      printf '  %s: %q | %q | %s | %s | %s\n' "$f" "$(head -c 40 -- "$f" 2>&1)" \
        "$(dd if="$f" iflag=direct bs=4096 count=1 2>/dev/null | head -c 40)" \
        "$(LC_ALL=C ls -1 -- ".versions/${f#./}" 2>/dev/null | tail -n 1)" \
        "$(getfattr --only-values -n user.ubiquity.device -- "$f" 2>/dev/null)" \
        "$(getfattr --only-values -n user.ubiquity.dirty -- "$f" 2>/dev/null)"
    done)
  done < <(device_mounts)
  [[ -d $b/log ]] || return 0
  echo "--- $b/log: $(backing_segments "$b" | wc -l) segments; the last 12, records shortened:"
  for j in $(backing_segments "$b" | tail -n 12); do
    if [[ $(head -c 18 "$b/FORMAT" 2>/dev/null) == "ubiquity-backing 6" ]]; then
      echo "  $j: $(wc -c <"$b/log/$j") bytes, sealed"
      continue
    fi
    echo "  $j: $(wc -l <"$b/log/$j") lines"
    tail -n 8 "$b/log/$j" | cut -c1-1000 | sed -E 's/^U1 [0-9a-f]{64} //; s/^U2 [0-9a-f]{32} //; s/ (committed|chunks|xattrs|device)=[^ ]*//g; s/([0-9a-f]{8})[0-9a-f]{24}/\1/g; s/^/    /' | cut -c1-240
  done
  echo "--- checkpoints, packs, fossil markers:"
  (cd "$b" && find devices -path '*/checkpoint-*' -type f 2>/dev/null | LC_ALL=C sort | head -n 20)
  echo "  $(backing_packs "$b" | wc -l) packs; fossils/: $(ls "$b/fossils" 2>/dev/null | wc -l) markers"
}

# ---------------------------------------------------------------------------------
# Cleanup (EXIT trap). Bounded in time so run.sh's timeout is never needed for it.

_ubq_cleanup() {
  local rc=$? i m pid left n clean log
  ((_UBQ_CLEANING)) && return
  _UBQ_CLEANING=1
  set +e
  trap - EXIT INT TERM
  cd / || true
  if ((rc != 0 && rc != SKIP_CODE)); then _ubq_run_failure_hooks; fi
  for i in ${_UBQ_EXIT_HOOKS[@]+"${!_UBQ_EXIT_HOOKS[@]}"}; do eval "${_UBQ_EXIT_HOOKS[i]}" || true; done
  # Newest mount first: a later mount may live inside an earlier one's tree.
  for ((i = ${#_UBQ_MOUNTS[@]} - 1; i >= 0; i--)); do
    m=${_UBQ_MOUNTS[i]}
    pid=${_UBQ_DAEMONS[i]}
    clean=0
    if is_mounted "$m"; then
      if timeout 30 "$UBIQUITY" unmount "$m" --timeout 20 >/dev/null 2>&1; then
        clean=1
      else
        echo "cleanup: ubiquity unmount $m failed; lazy unmount with fusermount3" >&2
        fusermount3 -u -z "$m" 2>/dev/null || umount -l "$m" 2>/dev/null
      fi
    fi
    # The daemon should be gone once its mount is; if not, end it (by PID only).
    if _ubq_is_our_daemon "$pid" "$m"; then
      for n in 1 2 3 4 5 6 7 8 9 10; do
        _ubq_is_our_daemon "$pid" "$m" || break
        sleep 0.5
        [[ $n == 4 ]] && kill -TERM "$pid" 2>/dev/null
      done
      if ((clean)); then
        # `ubiquity unmount` promises to return only after the daemon exited.
        printf 'FAIL [%s] cleanup: ubiquity unmount %s succeeded but daemon %s was still running\n' \
          "$TEST_NAME" "$m" "$pid" >&2
        rc=1
      fi
      if _ubq_is_our_daemon "$pid" "$m"; then
        echo "cleanup: daemon $pid for $m did not exit; killing it" >&2
        kill -KILL "$pid" 2>/dev/null
        sleep 0.5
      fi
    fi
  done
  for i in ${_UBQ_LATE_HOOKS[@]+"${!_UBQ_LATE_HOOKS[@]}"}; do eval "${_UBQ_LATE_HOOKS[i]}" || true; done
  # Plain mounts a scenario made (a small tmpfs for a store), after the daemons using them.
  for ((i = ${#_UBQ_PLAIN_MOUNTS[@]} - 1; i >= 0; i--)); do
    is_mounted "${_UBQ_PLAIN_MOUNTS[i]}" && umount -l "${_UBQ_PLAIN_MOUNTS[i]}"
  done
  # On failure, the end of each daemon log of this scenario helps more than anything.
  if ((rc != 0 && rc != SKIP_CODE)); then
    while read -r log; do
      [[ -n $log ]] || continue
      echo "--- last lines of $log:"
      tail -n 120 "$log"
    done < <(find "${TEST_PREFIX}"* -xdev -name daemon.log 2>/dev/null)
  fi
  left=$(mounts_under_prefix)
  if [[ -n $left ]]; then
    printf 'FAIL [%s] cleanup: still mounted after cleanup:\n%s\n' "$TEST_NAME" "$left" >&2
    rc=1
    # Fail, but do not leave them: detach lazily and end their daemons (found by
    # their exact mount point argument, signalled by PID).
    while read -r m; do
      fusermount3 -u -z "$m" 2>/dev/null || umount -l "$m" 2>/dev/null
      for pid in $(_ubq_daemons_of "$m"); do kill -KILL "$pid" 2>/dev/null; done
    done <<<"$left"
  fi
  if [[ -n $(mounts_under_prefix) ]]; then
    echo "cleanup: mounts remain under ${TEST_PREFIX}*; temp dirs kept" >&2
  else
    echo "cleanup: nothing mounted under ${TEST_PREFIX}*"
    # Safe to delete now: no FUSE mount below, so rm cannot reach into a store
    # through a mount. --one-file-system is belt and braces.
    # Everything under this script's own prefix is ours (roots, work, home, ...).
    # UBQ_KEEP_FAILED=DIR: a failure's files are kept there for a look (docs/TESTING.md).
    if ((rc != 0 && rc != SKIP_CODE)) && [[ -n ${UBQ_KEEP_FAILED:-} ]]; then
      cp -a "${TEST_PREFIX}"* "$UBQ_KEEP_FAILED/" 2>/dev/null || true
    fi
    rm -rf --one-file-system -- "${TEST_PREFIX}"*
  fi
  exit "$rc"
}

# A command failing under set -e: say which one and where, then the EXIT trap runs.
_ubq_on_err() {
  local rc=$? line=$1 cmd=$2
  # Only in the script's own shell: inside $(...) a failure may be handled by the
  # caller, and set -e reports it there if not.
  [[ $BASHPID == "$$" ]] || return 0
  printf 'FAIL [%s:%s] command failed (exit %s): %s\n' "$(basename "$0")" "$line" "$rc" "$cmd" >&2
}
set -o errtrace
trap '_ubq_on_err "$LINENO" "$BASH_COMMAND"' ERR
trap _ubq_cleanup EXIT
# A signal (run.sh's timeout sends TERM) ends the script through the EXIT trap.
trap 'echo "interrupted (SIGTERM)" >&2; exit 143' TERM
trap 'echo "interrupted (SIGINT)" >&2; exit 130' INT

# WORK: a scratch dir outside any mount for reference files (removed by cleanup).
WORK="${TEST_PREFIX}work"
mkdir -p "$WORK"
