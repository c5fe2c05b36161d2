#!/usr/bin/env bash
# Conflicts between two devices (docs/FORMAT.md, "Meaning"). While beta is paused both
# devices edit the same files, beta about a second later; after resume and sync both
# show the same current version (the latest mtime, then the greatest device id, then
# the greatest version id) and exactly one conflict version under .conflicts/<path>/
# (user.ubiquity.conflicts = 1), named <UTC time>@<device>.<ext>, a .tinypix one as a
# grid. Also: the mtime decides, not the order of the saves; an mtime tie goes to the
# greater device id; a path created on both devices shows one and keeps the other as a
# conflict; edit beats delete (also of a deleted directory), with no conflict. Every
# way to resolve, each synced to the other device: rm (discard; the version stays in
# .versions/), mv onto the file (take), `ubiquity resolve --keep-current` and
# `--take NAME`. Afterwards edits flow normally again.
# Checks right after sync_all do not wait: `ubiquity sync` returns once what it pulled
# is applied and the kernel's caches of it are invalidated (DESIGN 1.3).
# ubq-timeout: 180
set -euo pipefail
source "$(dirname "$0")/lib.sh"

DEVICE=alpha
mount_fresh conflicts --poll 0.2
A=$MNT
mount_device beta --poll 0.2
B=$(mnt_of beta)
on_failure dump_sync_state

grid_alpha=$'#......#\n.#....#.\n..#..#..\n...##...\n...##...\n..#..#..\n.#....#.\n#......#'
grid_beta=$'########\n#......#\n#......#\n#......#\n#......#\n#......#\n#......#\n########'
# Version names: 2026-11-22T13.45.01.123Z@laptop.txt (~<id prefix> on a millisecond tie).
name_re='^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}\.[0-9]{2}\.[0-9]{2}\.[0-9]{3}Z@'

# check_in_conflict PATH CURRENT OTHER DEVICE EXT: on both devices PATH reads CURRENT,
# user.ubiquity.conflicts is 1 and .conflicts/PATH/ holds exactly one entry, the same
# name on both, made by DEVICE, ending in .EXT, reading OTHER. Sets CONFLICT to its name.
CONFLICT=
check_in_conflict() {
  local path=$1 current=$2 other=$3 dev=$4 ext=$5 m na nb
  for m in "$A" "$B"; do
    assert_file_content "$m/$path" "$current" "current $path on $m"
    assert_eq 1 "$(xattr "$m/$path" user.ubiquity.conflicts)" "user.ubiquity.conflicts of $path on $m"
  done
  na=$(conflict_names "$A" "$path")
  nb=$(conflict_names "$B" "$path")
  assert_eq 1 "$(conflict_count "$A" "$path")" "entries in $A/.conflicts/$path/ [${na//$'\n'/ }]"
  assert_eq "$na" "$nb" "names in .conflicts/$path/, beta vs alpha"
  [[ $na =~ ${name_re}${dev}(~[0-9a-f]+)?\.${ext}$ ]] ||
    fail "conflict version of $path: expected a name <UTC time>@$dev.$ext, got [$na]"
  for m in "$A" "$B"; do
    assert_file_content "$m/.conflicts/$path/$na" "$other" "conflict version of $path on $m"
  done
  CONFLICT=$na
}

# check_resolved PATH CONTENT: on both devices PATH reads CONTENT, has no conflict
# versions left and user.ubiquity.conflicts is 0.
check_resolved() {
  local m
  for m in "$A" "$B"; do
    assert_file_content "$m/$1" "$2" "$1 on $m after resolving"
    assert_eq 0 "$(conflict_count "$m" "$1")" "entries left in $m/.conflicts/$1/ [$(conflict_names "$m" "$1")]"
    assert_eq 0 "$(xattr "$m/$1" user.ubiquity.conflicts)" "user.ubiquity.conflicts of $1 on $m after resolving"
  done
}

# assert_in_versions PATH TEXT: on both devices some version of PATH reads TEXT.
assert_in_versions() {
  local m found
  for m in "$A" "$B"; do
    found=$(grep -lxF -- "$2" "$m/.versions/$1"/* 2>/dev/null || true)
    [[ -n $found ]] || fail "no version under $m/.versions/$1/ reads [$2] (there: $(version_names_at "$m" "$1" | tr '\n' ' '))"
  done
  assert_eq "$(version_names_at "$A" "$1")" "$(version_names_at "$B" "$1")" "version names of $1, alpha vs beta"
}

step "a shared starting point"
mkdir "$A/sub" "$A/olddir"
for f in note take keep take2 mtime tie survive; do echo "$f: base" >"$A/$f.txt"; done
echo "sub/deep: base" >"$A/sub/deep.txt"
echo "olddir/inner: base" >"$A/olddir/inner.txt"
echo "olddir/other: base" >"$A/olddir/other.txt"
printf '\x01\x02\x04\x08\x10\x20\x40\x80' >"$A/pic.tinypix"
sync_all
assert_same_tree "$A" "$B" "trees before the partition"

step "beta pauses; both edit the same files, beta about a second later"
pause_dev "$B"
for f in note take keep take2 tie; do echo "$f: from alpha" >"$A/$f.txt"; done
echo "sub/deep: from alpha" >"$A/sub/deep.txt"
echo "both: from alpha" >"$A/both.txt"
printf '%s\n' "$grid_alpha" >"$A/pic.tinypix"
sync_dev "$A"
# Beta's saves get a later mtime, so they win (FORMAT.md: the latest mtime, then the
# greatest device id, then the greatest version id).
sleep 1.1
for f in note take keep take2 mtime tie survive; do echo "$f: from beta" >"$B/$f.txt"; done
echo "sub/deep: from beta" >"$B/sub/deep.txt"
echo "both: from beta" >"$B/both.txt"
echo "olddir/inner: from beta" >"$B/olddir/inner.txt"
printf '%s\n' "$grid_beta" >"$B/pic.tinypix"
assert_file_content "$B/note.txt" "note: from beta" "note.txt on paused beta (its own edit)"

step "alpha saves later but with an older mtime; both set one mtime; alpha deletes what beta edited"
echo "mtime: from alpha" >"$A/mtime.txt"
touch -d '2001-01-01 00:00:00' "$A/mtime.txt"
touch -d '2030-01-01 00:00:00' "$A/tie.txt" "$B/tie.txt"
rm "$A/survive.txt"
rm -r "$A/olddir"
sync_dev "$A"
assert_exists "$B/olddir/other.txt" "olddir/other.txt on paused beta (it has not heard of the delete)"
assert_file_content "$B/survive.txt" "survive: from beta" "survive.txt on paused beta"

step "beta resumes; both sync"
resume_dev "$B"
sync_all

step "ubiquity conflicts --paths and the sync status count what .conflicts/ shows"
for m in "$A" "$B"; do
  listed=$(ubq conflicts --paths "$m" | LC_ALL=C sort)
  shown=$(cd "$m/.conflicts" && find . -type f | sed "s|^\.|$m/.conflicts|" | LC_ALL=C sort)
  assert_eq "$shown" "$listed" "ubiquity conflicts --paths $m vs the files under $m/.conflicts/"
  assert_eq 9 "$(wc -l <<<"$shown")" "conflict versions under $m/.conflicts/ (note take keep take2 sub/deep mtime tie both pic)"
  assert_eq 9 "$(sync_status "$m" conflicts)" "conflicts in user.ubiquity.sync of $m"
  assert_contains "$(ls -A "$m")" ".conflicts" "the root listing of $m while it has conflicts"
done

step "the later edit is current on both devices; the earlier one is the only conflict version"
for f in note take keep take2; do
  check_in_conflict "$f.txt" "$f: from beta" "$f: from alpha" alpha txt
done
check_in_conflict sub/deep.txt "sub/deep: from beta" "sub/deep: from alpha" alpha txt
assert_in_versions note.txt "note: from alpha"
assert_in_versions note.txt "note: from beta"

step "the mtime decides, not the order of the saves"
check_in_conflict mtime.txt "mtime: from beta" "mtime: from alpha" alpha txt

step "equal mtimes: the greater device id wins, on both devices"
id_alpha=$(backing_device_id alpha)
id_beta=$(backing_device_id beta)
[[ $id_alpha =~ ^[0-9a-f]{16}$ && $id_beta =~ ^[0-9a-f]{16}$ ]] ||
  fail "device ids found in the segments of $BACKING/log: alpha [$id_alpha], beta [$id_beta]"
if [[ $(printf '%s\n' "$id_alpha" "$id_beta" | LC_ALL=C sort | tail -n1) == "$id_beta" ]]; then
  winner=beta loser=alpha
else
  winner=alpha loser=beta
fi
log "    device ids: alpha $id_alpha, beta $id_beta: $winner should win the tie"
check_in_conflict tie.txt "tie: from $winner" "tie: from $loser" "$loser" txt
for m in "$A" "$B"; do
  assert_eq "2030-01-01 00:00:00.000000000 +0000" "$(stat -c %y "$m/tie.txt")" "mtime of tie.txt on $m"
done

step "the same new path made on both devices: one is shown, the other is its conflict"
check_in_conflict both.txt "both: from beta" "both: from alpha" alpha txt

step "a conflict version of a .tinypix reads as a grid"
check_in_conflict pic.tinypix "$grid_beta" "$grid_alpha" alpha tinypix
for m in "$A" "$B"; do
  grid=$(cat "$m/.conflicts/pic.tinypix/$CONFLICT")
  assert_eq 8 "$(grep -cE '^[#.]{8}$' <<<"$grid")" "grid lines (8 of # and .) in the conflict version on $m"
  assert_eq 72 "$(stat -c %s "$m/.conflicts/pic.tinypix/$CONFLICT")" "st_size of the conflict version on $m"
done

step "edit beats delete: beta's edits survive alpha's later deletes, with no conflict"
for m in "$A" "$B"; do
  assert_file_content "$m/survive.txt" "survive: from beta" "survive.txt on $m"
  assert_file_content "$m/olddir/inner.txt" "olddir/inner: from beta" "olddir/inner.txt on $m"
  assert_missing "$m/olddir/other.txt" "olddir/other.txt on $m (deleted by alpha, not edited by beta)"
  for f in survive.txt olddir/inner.txt; do
    assert_eq 0 "$(xattr "$m/$f" user.ubiquity.conflicts)" "user.ubiquity.conflicts of $f on $m"
    assert_eq 0 "$(conflict_count "$m" "$f")" "entries in $m/.conflicts/$f/"
  done
done

step "conflicts survive a remount of beta"
remount_device beta
B=$(mnt_of beta)
assert_eq 1 "$(conflict_count "$B" note.txt)" "entries in beta's .conflicts/note.txt/ after its remount"
assert_eq 1 "$(xattr "$B/note.txt" user.ubiquity.conflicts)" "user.ubiquity.conflicts of note.txt on beta after its remount"

step "rm of the conflict version on alpha discards it on both; it stays in .versions/"
check_in_conflict note.txt "note: from beta" "note: from alpha" alpha txt
rm "$A/.conflicts/note.txt/$CONFLICT"
sync_all
check_resolved note.txt "note: from beta"
assert_in_versions note.txt "note: from alpha"

step "mv of the conflict version onto the file (on beta) takes it, on both"
check_in_conflict take.txt "take: from beta" "take: from alpha" alpha txt
mv "$B/.conflicts/take.txt/$CONFLICT" "$B/take.txt"
sync_all
check_resolved take.txt "take: from alpha"
assert_in_versions take.txt "take: from beta"

step "ubiquity resolve --keep-current (on alpha)"
ubq resolve "$A/keep.txt" --keep-current >/dev/null
sync_all
check_resolved keep.txt "keep: from beta"
assert_in_versions keep.txt "keep: from alpha"

step "ubiquity resolve --take NAME (on beta); a NAME that is no conflict version fails"
check_in_conflict take2.txt "take2: from beta" "take2: from alpha" alpha txt
assert_fails "ubiquity resolve --take of a made-up name" \
  "$UBIQUITY" resolve "$B/take2.txt" --take "1999-01-01T00.00.00.000Z@nobody.txt"
assert_eq 1 "$(xattr "$B/take2.txt" user.ubiquity.conflicts)" "user.ubiquity.conflicts of take2.txt after the failed resolve"
ubq resolve "$B/take2.txt" --take "$CONFLICT" >/dev/null
sync_all
check_resolved take2.txt "take2: from alpha"

step "the rest: rm on beta, mv on alpha, resolve on either; then .conflicts/ is empty"
rm "$B/.conflicts/sub/deep.txt/$(conflict_names "$B" sub/deep.txt)"
rm "$B/.conflicts/pic.tinypix/$(conflict_names "$B" pic.tinypix)"
mv "$A/.conflicts/both.txt/$(conflict_names "$A" both.txt)" "$A/both.txt"
ubq resolve "$A/mtime.txt" --keep-current >/dev/null
ubq resolve "$B/tie.txt" --keep-current >/dev/null
sync_all
check_resolved sub/deep.txt "sub/deep: from beta"
check_resolved pic.tinypix "$grid_beta"
check_resolved both.txt "both: from alpha"
check_resolved mtime.txt "mtime: from beta"
check_resolved tie.txt "tie: from $winner"
for m in "$A" "$B"; do
  assert_eq "" "$(ls -A "$m/.conflicts")" "entries in $m/.conflicts/ once every conflict is resolved"
  assert_eq 0 "$(sync_status "$m" conflicts)" "conflicts in user.ubiquity.sync of $m once every conflict is resolved"
  assert_not_contains "$(ls -A "$m")" ".conflicts" "the root listing of $m once every conflict is resolved"
done

step "after resolving, edits flow normally again"
echo "note: after" >"$A/note.txt"
echo "take: after" >"$B/take.txt"
wait_content "$B/note.txt" "note: after" "note.txt on beta"
wait_content "$A/take.txt" "take: after" "take.txt on alpha"
sync_all
for m in "$A" "$B"; do
  for f in note.txt take.txt; do
    assert_eq 0 "$(xattr "$m/$f" user.ubiquity.conflicts)" "user.ubiquity.conflicts of $f on $m after a later edit"
  done
done
assert_same_tree "$A" "$B" "trees at the end"
assert_daemon_alive alpha
assert_daemon_alive beta

unmount_device beta
unmount_it
pass
