# shellcheck shell=bash
# Helpers for the real-mount scenarios (tests/mount/t-*.sh). Source it first thing:
#
#   source "$(dirname "$0")/lib.sh"
#   mount_fresh main            # sets ROOT MNT STORE BACKING DATA DAEMON_PID
#   ... assertions ...
#   pass                        # optional: prints a PASS line
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

# mounts_under_prefix: every mount point this script could have made that is live.
mounts_under_prefix() {
  findmnt -rn -o TARGET 2>/dev/null | grep -F -- "$TEST_PREFIX" || true
}

# The state file lets tests/mount/run.sh clean up after a scenario it had to kill
# (its EXIT trap then never ran).
_ubq_state() {
  if [[ -n ${UBQ_STATE_FILE:-} ]]; then
    printf '%s\n' "$*" >>"$UBQ_STATE_FILE"
  fi
}

# mount_fresh NAME: new ROOT=/tmp/ubiquity-test-$$-NAME/ with mnt store backing data,
# mounted. Sets ROOT MNT STORE BACKING DATA and DAEMON_PID.
mount_fresh() {
  local name=$1
  require_fuse
  ROOT="${TEST_PREFIX}${name}"
  [[ ! -e $ROOT ]] || fail "$ROOT already exists"
  mkdir -p "$ROOT"/{mnt,store,backing,data}
  _ubq_state "root $ROOT"
  MNT="$ROOT/mnt" STORE="$ROOT/store" BACKING="$ROOT/backing" DATA="$ROOT/data"
  _ubq_mount
}

# _ubq_mount: mount MNT with STORE/BACKING/DATA and record the daemon.
_ubq_mount() {
  local out pid
  ! is_mounted "$MNT" || fail "$MNT is already mounted"
  if ! out=$(XDG_DATA_HOME="$DATA" timeout 60 "$UBIQUITY" mount "$MNT" --store "$STORE" \
    --backing "$BACKING" --device "$DEVICE" 2>&1); then
    _ubq_record_from_status
    fail "ubiquity mount $MNT failed: $out"
  fi
  # "Mounted MNT (daemon pid N, log ...)": the PID is what cleanup kills if needed.
  pid=$(sed -n 's/.*daemon pid \([0-9][0-9]*\).*/\1/p' <<<"$out" | head -n1)
  _UBQ_MOUNTS+=("$MNT")
  _UBQ_DAEMONS+=("${pid:-0}")
  _ubq_state "mount $MNT ${pid:-0}"
  [[ -n $pid ]] || fail "no daemon pid in the output of ubiquity mount: [$out]"
  DAEMON_PID=$pid
  is_mounted "$MNT" || fail "ubiquity mount returned 0 but $MNT is not mounted: [$out]"
}

# If mount failed half-way, still remember the mount point so cleanup checks it.
_ubq_record_from_status() {
  _UBQ_MOUNTS+=("$MNT")
  _UBQ_DAEMONS+=(0)
  _ubq_state "mount $MNT 0"
}

# unmount_it: `ubiquity unmount MNT`, which must commit, unmount and wait for the
# daemon to exit. Any of those not happening fails the scenario.
unmount_it() {
  local out
  cd /
  if ! out=$(timeout 90 "$UBIQUITY" unmount "$MNT" --timeout 60 2>&1); then
    fail "ubiquity unmount $MNT failed: $out"
  fi
  if is_mounted "$MNT"; then
    fail "ubiquity unmount returned 0 but $MNT is still mounted: $out"
  fi
  if [[ -n ${DAEMON_PID:-} ]] && _ubq_is_our_daemon "$DAEMON_PID" "$MNT"; then
    fail "ubiquity unmount returned but daemon $DAEMON_PID is still running"
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
# Cleanup (EXIT trap). Bounded in time so run.sh's timeout is never needed for it.

_ubq_cleanup() {
  local rc=$? i m pid left n clean log
  ((_UBQ_CLEANING)) && return
  _UBQ_CLEANING=1
  set +e
  trap - EXIT INT TERM
  cd / || true
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
  # On failure, the end of each daemon log of this scenario helps more than anything.
  if ((rc != 0 && rc != SKIP_CODE)); then
    while read -r log; do
      [[ -n $log ]] || continue
      echo "--- last lines of $log:"
      tail -n 25 "$log"
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
