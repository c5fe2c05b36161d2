#!/usr/bin/env bash
# Live queries and watchers through real mounts: `ubiquity query` lists a consistent
# snapshot with sync states (scopes, name patterns, hidden files only with --all);
# `query --watch` on beta reports a file created on alpha and a conflict when both edit;
# `kv watch` on beta reports alpha's key change (not beta's own); watchers end when the
# mount goes.
# ubq-timeout: 180
set -euo pipefail
source "$(dirname "$0")/lib.sh"

DEVICE=alpha
mount_fresh query --poll 0.2
A=$MNT
mount_device beta --poll 0.2
B=$(mnt_of beta)
on_failure dump_sync_state

WATCHERS=()
stop_watchers() { local p; for p in "${WATCHERS[@]}"; do kill "$p" 2>/dev/null || true; done; }
on_failure stop_watchers
# in_file FILE TEXT: FILE has a line containing TEXT (for wait_eq).
in_file() { if grep -qF -- "$2" "$1"; then echo yes; else echo no; fi; }

step "a snapshot: every file with its state; scopes, a name pattern, hidden files with --all"
mkdir -p "$A/Documents/sub"
echo doc >"$A/Documents/a.txt"
echo pic >"$A/Documents/sub/p.dat"
echo note >"$A/notes.txt"
echo hidden >"$A/.hidden"
sync_all
out=$(ubq query --mount "$B" --json)
assert_eq 3 "$(json_count '{"state":"remote"}' <<<"$out")" "files from alpha listed on beta as remote: $out"
assert_not_contains "$out" ".hidden" "a hidden file without --all"
assert_eq 1 "$(json_count '{"event":"gathered","count":3}' <<<"$out")" "the end of the listing: $out"
assert_eq 1 "$(ubq query --mount "$B" --all --json | json_count '{"path":".hidden"}')" "a hidden file with --all"
docs=$(ubq query --mount "$A" --scope documents --json)
assert_eq 1 "$(json_count '{"path":"Documents/sub/p.dat"}' <<<"$docs")" "the documents scope: $docs"
assert_not_contains "$docs" "notes.txt" "the documents scope leaves out the rest"
assert_contains "$(ubq query --mount "$A" --scope data)" "notes.txt" "the data scope"
txt=$(ubq query --mount "$A" --name '*.txt' --json)
assert_eq 1 "$(json_count '{"event":"gathered","count":2}' <<<"$txt")" "--name '*.txt': two files: $txt"
assert_eq 1 "$(json_count '{"path":"notes.txt"}' <<<"$txt")" "--name '*.txt' lists notes.txt: $txt"
assert_eq 0 "$(json_count '{"path":"Documents/sub/p.dat"}' <<<"$txt")" "--name '*.txt' leaves p.dat out: $txt"
assert_contains "$(ubq query --mount "$A" --name notes.txt)" "uploaded" "state of alpha's own uploaded file"

step "query --watch on beta: a file created on alpha is reported as added"
ubq_query_out="$ROOT/query-watch.out"
"$UBIQUITY" query --mount "$B" --watch --json >"$ubq_query_out" 2>&1 &
WATCHERS+=($!)
query_pid=$!
wait_eq yes "the watch's gathered line" json_has "$ubq_query_out" '{"event":"gathered"}'
echo new >"$A/Documents/new.txt"
wait_eq yes "an added event for Documents/new.txt" json_has "$ubq_query_out" '{"event":"added","path":"Documents/new.txt"}'
echo here >"$B/local.txt"
wait_eq yes "an event for a file made on beta itself" json_has "$ubq_query_out" '{"path":"local.txt"}'
rm "$A/Documents/a.txt"
wait_eq yes "a removed event for Documents/a.txt" json_has "$ubq_query_out" '{"event":"removed","path":"Documents/a.txt"}'

step "both edit notes.txt while beta is paused: the watch reports the conflict"
pause_dev "$B"
echo "alpha's edit" >"$A/notes.txt"
sync_dev "$A"
echo "beta's edit" >"$B/notes.txt"
resume_dev "$B"
sync_all
wait_eq yes "a conflict event for notes.txt" json_has "$ubq_query_out" '{"event":"conflict","path":"notes.txt"}'
assert_contains "$(ubq query --mount "$B" --name notes.txt)" "conflict" "notes.txt's state in a new query"

step "kv watch on beta: alpha's change is announced with its device, beta's own is not"
kv_out="$ROOT/kv-watch.out"
"$UBIQUITY" kv watch --mount "$B" --json >"$kv_out" 2>&1 &
WATCHERS+=($!)
kv_pid=$!
wait_eq yes "kv watch started" json_has "$kv_out" '{"event":"watching"}'
ubq kv set selectedColorIndex 2 --type integer --mount "$B"
ubq kv set theme dark --mount "$A"
wait_eq yes "alpha's theme on beta's watch" json_has "$kv_out" '{"event":"changed","key":"theme"}'
assert_eq yes "$(json_has "$kv_out" '{"key":"theme","new":"dark","type":"string"}')" "the new value: $(cat "$kv_out")"
assert_eq yes "$(json_has "$kv_out" '{"key":"theme","name":"alpha"}')" "the writer's device name: $(cat "$kv_out")"
assert_eq no "$(in_file "$kv_out" selectedColorIndex)" "beta's own change is not announced on beta"

step "the watchers end when beta is unmounted"
unmount_device beta
for p in "$query_pid" "$kv_pid"; do
  for _ in $(seq 100); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "$p" 2>/dev/null; then fail "watcher $p still running 10 s after the unmount"; fi
done
WATCHERS=()
pass
