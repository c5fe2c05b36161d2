#!/usr/bin/env bash
# Runs the real-mount scenarios IntegrationTests/mount/t-*.sh and t-*.py, each as its own process under a
# timeout, one line per scenario (PASS/FAIL/SKIP and seconds). Logs of failing
# scenarios are kept and printed. The last line is exactly
#   mount: N passed, M failed
# and the exit status is non-zero when M > 0.
#
#   UBIQUITY=/path/to/ubiquity IntegrationTests/mount/run.sh [NAME-PATTERN...]
#
# A pattern selects scenarios by substring of their name (e.g. `run.sh git sqlite`).
# A scenario may declare its own time limit with a line `# ubq-timeout: SECONDS`
# (default 90); past it the scenario gets SIGTERM (its trap cleans up), and if it is
# stuck (e.g. in a request to a hung daemon) its mounts are swept and it is killed;
# the whole suite also has a budget (UBQ_SUITE_BUDGET, default 1200 s) so a hanging
# product cannot make it run for more than a few minutes.
#
# Scenarios run UBQ_MOUNT_LANES at a time (default 2: most of a scenario's time is spent
# waiting for a sync poll, a daemon or a disk), longest time limit first. One that declares
# `# ubq-alone: WHY` runs after the others, by itself: it counts what another scenario would
# disturb (context switches) or stops what the others share (the S3 gateway).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
if [[ -z ${UBIQUITY:-} ]]; then
  echo "run.sh: UBIQUITY must name the ubiquity binary (scripts/test.sh exports it)" >&2
  exit 2
fi
export UBIQUITY

default_timeout=90
budget=${UBQ_SUITE_BUDGET:-1200}
if [[ -n ${UBQ_LOG_DIR:-} ]]; then
  logdir=$UBQ_LOG_DIR own_logdir=0
  mkdir -p "$logdir"
else
  logdir=$(mktemp -d /tmp/ubiquity-mount-logs.XXXXXX) own_logdir=1
fi

# now: seconds since the epoch with microseconds (bash 5 EPOCHREALTIME).
now() { printf '%s' "${EPOCHREALTIME/,/.}"; }
elapsed() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

# sweep_after NAME STATE PID: if a scenario was killed before its own cleanup ran,
# undo what its state file says it made, and anything still mounted under its
# prefix /tmp/ubiquity-test-PID- (the scenario's $$ is PID: setsid execs it).
# Returns 1 when something had to be cleaned.
sweep_after() {
  local state=$2 prefix="/tmp/ubiquity-test-$3-" kind a b p dirty=0
  while read -r a; do
    [[ -n $a ]] || continue
    echo "run.sh: $1 left $a mounted; lazy unmount" >&2
    fusermount3 -u -z "$a" 2>/dev/null || umount -l "$a" 2>/dev/null || true
    for p in /proc/[0-9]*; do
      if tr '\0' ' ' 2>/dev/null <"$p/cmdline" | grep -qF -- " mount $a "; then
        echo "run.sh: killing its daemon ${p#/proc/}" >&2
        kill -KILL "${p#/proc/}" 2>/dev/null || true
      fi
    done
    dirty=1
  done < <(findmnt -rn -o TARGET 2>/dev/null | grep -F -- "$prefix" | tac)
  # Mounts newest first, as the scenario's own cleanup would.
  while read -r kind a b; do
    [[ $kind == mount ]] || continue
    if findmnt -rn -M "$a" >/dev/null 2>&1; then
      echo "run.sh: $1 left $a mounted; lazy unmount" >&2
      fusermount3 -u -z "$a" 2>/dev/null || umount -l "$a" 2>/dev/null || true
      dirty=1
    fi
    # b is the daemon PID; end it only if it is still the daemon of that mount.
    if [[ $b =~ ^[1-9][0-9]*$ ]] && tr '\0' ' ' 2>/dev/null <"/proc/$b/cmdline" | grep -qF -- " $a"; then
      echo "run.sh: $1 left daemon $b running; killing it" >&2
      kill -TERM "$b" 2>/dev/null || true
      sleep 2
      kill -KILL "$b" 2>/dev/null || true
      dirty=1
    fi
  done < <(tac "$state" 2>/dev/null)
  # The scenario's temp dirs, once nothing is mounted below them.
  if ! findmnt -rn -o TARGET | grep -qF -- "$prefix"; then
    rm -rf --one-file-system -- "$prefix"*
  fi
  return $((dirty == 0 ? 0 : 1))
}

# wait_gone PID SECONDS: wait until PID has exited, at most SECONDS.
wait_gone() {
  local i
  for ((i = 0; i < $2 * 5; i++)); do
    kill -0 "$1" 2>/dev/null || return 0
    sleep 0.2
  done
}

patterns=("$@")
selected() {
  local p
  ((${#patterns[@]} == 0)) && return 0
  for p in "${patterns[@]}"; do
    [[ $1 == *"$p"* ]] && return 0
  done
  return 1
}

lanes=${UBQ_MOUNT_LANES:-2}
[[ $lanes =~ ^[1-9][0-9]*$ ]] || { echo "run.sh: UBQ_MOUNT_LANES must be a positive number (got $lanes)" >&2; exit 2; }
suite_start=$(now)

# time_limit SCRIPT: its `# ubq-timeout:` line, or the default.
time_limit() {
  local limit
  limit=$(sed -n 's/^# ubq-timeout: *\([0-9][0-9]*\).*/\1/p' "$1" | head -n1)
  echo "${limit:-$default_timeout}"
}

# run_one SCRIPT: runs the scenario under its time limit, prints its result line and
# leaves the result in $logdir/NAME.result for the summary.
run_one() {
  local script=$1 name log state limit spent left start pid deadline timed_out rc secs note result
  name=$(basename "$script")
  name=${name%.*}
  log="$logdir/$name.log"
  state="$logdir/$name.state"
  : >"$state"

  limit=$(time_limit "$script")
  spent=$(elapsed "$suite_start")
  left=$(awk -v b="$budget" -v s="$spent" 'BEGIN { printf "%d", b - s }')
  if ((left < 15)); then
    printf 'FAIL %-22s   0.0s  (not run: suite budget of %ss used up)\n' "$name" "$budget"
    echo FAIL >"$logdir/$name.result"
    return
  fi
  ((limit > left)) && limit=$left

  start=$(now)
  timed_out=0
  # Its own session and process group, so a timeout can signal exactly the
  # scenario and whatever it started (by group id), nothing else.
  # Append mode, so run.sh's own notes in the same file never overwrite its output.
  : >"$log"
  UBQ_STATE_FILE="$state" setsid "$script" >>"$log" 2>&1 </dev/null &
  pid=$!
  deadline=$(awk -v a="$(now)" -v l="$limit" 'BEGIN { printf "%d", a + l }')
  while kill -0 "$pid" 2>/dev/null && ((${EPOCHREALTIME%[.,]*} < deadline)); do
    sleep 0.2
  done
  if kill -0 "$pid" 2>/dev/null; then
    timed_out=1
    echo "run.sh: $name still running after ${limit}s: SIGTERM to its process group" >>"$log"
    kill -TERM -- "-$pid" 2>/dev/null || true
    wait_gone "$pid" 15
    if kill -0 "$pid" 2>/dev/null; then
      # Usually a process stuck in a FUSE request of a hung daemon: its TERM trap
      # cannot run. Unmounting lazily and killing the daemon unblocks it.
      echo "run.sh: $name did not exit on SIGTERM: sweeping its mounts, then SIGKILL" >>"$log"
      sweep_after "$name" "$state" "$pid" >>"$log" 2>&1 || true
      wait_gone "$pid" 10
      kill -KILL -- "-$pid" 2>/dev/null || true
    fi
  fi
  rc=0
  wait "$pid" || rc=$?
  secs=$(elapsed "$start")

  note=""
  if ! sweep_after "$name" "$state" "$pid" >>"$log" 2>&1; then
    note="left a mount or daemon behind"
    ((rc == 0)) && rc=1
  fi
  if ((timed_out)); then
    rc=124 note="timed out after ${limit}s${note:+; $note}"
  fi
  case $rc in
    0) result=PASS ;;
    77) result=SKIP ;;
    *) result=FAIL ;;
  esac
  printf '%s %-22s %6ss%s\n' "$result" "$name" "$secs" "${note:+  ($note)}"
  echo "$result" >"$logdir/$name.result"
  case $result in
    PASS) rm -f "$log" "$state" ;;
    SKIP) sed 's/^/    /' "$log"; rm -f "$log" "$state" ;;
  esac
}

# The scenarios selected: shared ones longest limit first (the long ones start early, so
# the lanes end together), then the ones that run alone.
shared=() alone=()
while read -r _ script; do
  name=$(basename "$script")
  selected "${name%.*}" || continue
  if grep -q '^# ubq-alone:' "$script"; then alone+=("$script"); else shared+=("$script"); fi
done < <(for script in "$here"/t-*.sh "$here"/t-*.py; do
           [[ -e $script ]] && echo "$(time_limit "$script") $script"
         done | sort -k1,1nr -k2,2 -s)

running=0
for script in "${shared[@]}"; do
  while ((running >= lanes)); do
    wait -n || true
    running=$((running - 1))
  done
  run_one "$script" &
  running=$((running + 1))
done
wait
for script in "${alone[@]}"; do run_one "$script"; done

passed=0 failed=0 skipped=0
failed_names=()
for script in "${shared[@]}" "${alone[@]}"; do
  name=$(basename "$script")
  name=${name%.*}
  case $(cat "$logdir/$name.result" 2>/dev/null || echo FAIL) in
    PASS) passed=$((passed + 1)) ;;
    SKIP) skipped=$((skipped + 1)) ;;
    *) failed=$((failed + 1)); failed_names+=("$name") ;;
  esac
  rm -f "$logdir/$name.result"
done

# Logs of failing scenarios, after the summary lines so the table stays readable.
for name in "${failed_names[@]}"; do
  log="$logdir/$name.log"
  [[ -f $log ]] || continue
  echo
  echo "===== log of $name (kept in $log) ====="
  if (($(wc -l <"$log") > 200)); then
    echo "[... $(($(wc -l <"$log") - 200)) earlier lines in the file ...]"
  fi
  tail -n 200 "$log"
done
# Each failure's own line again, last: a CI page that keeps only the head and the tail of
# the output still shows what failed.
for name in "${failed_names[@]}"; do
  why=$(grep -m 3 -E '^(FAIL \[|run\.sh: )' "$logdir/$name.log" 2>/dev/null || true)
  echo "failed: $name: ${why:-(no FAIL line: see its log above)}"
done
if ((failed == 0 && own_logdir)); then
  rm -rf "$logdir"
fi

echo
skip_note=""
((skipped == 0)) || skip_note=", $skipped skipped (no usable /dev/fuse outside CI)"
echo "total $(elapsed "$suite_start")s$skip_note"
echo "mount: $passed passed, $failed failed"
((failed == 0))
