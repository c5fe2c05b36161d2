#!/usr/bin/env bash
# Three saves make exactly three versions with the right contents; copying the oldest
# back from .versions/ makes it current as a 4th version; `ubiquity versions` and
# `ubiquity restore` agree with the .versions/ directory.
set -euo pipefail
source "$(dirname "$0")/lib.sh"

mount_fresh versions
cd "$MNT"

step "three saves of notes.txt"
# Each `echo >` is open(O_TRUNC)+write+close: one save, so one version each (the
# truncate inside the same open must not make an extra, empty version).
echo one >notes.txt
echo two >notes.txt
echo three >notes.txt
assert_file_content notes.txt three "current content after three saves"
assert_eq 3 "$(version_count notes.txt)" "entries in .versions/notes.txt/"
assert_eq 3 "$(xattr notes.txt user.ubiquity.versions)" "user.ubiquity.versions"

mapfile -t names < <(version_names notes.txt)
# Version names sort by time and keep the extension, so ls order is history order.
for n in "${names[@]}"; do
  [[ $n == *.txt ]] || fail "version name [$n] does not keep the .txt extension"
  [[ $n == *@"$DEVICE"*.txt ]] || fail "version name [$n] does not name device $DEVICE"
done
assert_file_content ".versions/notes.txt/${names[0]}" one "oldest version"
assert_file_content ".versions/notes.txt/${names[1]}" two "middle version"
assert_file_content ".versions/notes.txt/${names[2]}" three "newest version"

step "ubiquity versions lists the same names, oldest first"
cli_names=$("$UBIQUITY" versions "$MNT/notes.txt" | cut -f1 | awk '{print $1}')
assert_eq "$(printf '%s\n' "${names[@]}")" "$cli_names" "ubiquity versions vs ls .versions/notes.txt"

step "cp the oldest version back"
v_before=$(xattr notes.txt user.ubiquity.version)
cp ".versions/notes.txt/${names[0]}" notes.txt
assert_file_content notes.txt one "file after copying the oldest version back"
assert_eq 4 "$(version_count notes.txt)" "versions after cp back"
assert_ne "$v_before" "$(xattr notes.txt user.ubiquity.version)" "user.ubiquity.version after cp back"
mapfile -t names4 < <(version_names notes.txt)
assert_eq "${names[*]}" "${names4[*]:0:3}" "the first three versions are unchanged"
assert_file_content ".versions/notes.txt/${names4[3]}" one "the new 4th version"
# The old versions' contents are untouched by the restore.
assert_file_content ".versions/notes.txt/${names4[2]}" three "3rd version after cp back"

step "ubiquity restore of the middle version"
"$UBIQUITY" restore "$MNT/notes.txt" "${names[1]}" >/dev/null
assert_file_content notes.txt two "file after ubiquity restore"
assert_eq 5 "$(version_count notes.txt)" "versions after ubiquity restore"
mapfile -t names5 < <(version_names notes.txt)
assert_file_content ".versions/notes.txt/${names5[4]}" two "the version made by restore"
cli_names=$("$UBIQUITY" versions "$MNT/notes.txt" | cut -f1 | awk '{print $1}')
assert_eq "$(printf '%s\n' "${names5[@]}")" "$cli_names" "ubiquity versions vs .versions after restore"

step "restore of a name that does not exist fails and changes nothing"
assert_fails "restore of a bogus version" "$UBIQUITY" restore "$MNT/notes.txt" "1999-01-01T00.00.00.000Z@nobody.txt"
assert_file_content notes.txt two "file after a failed restore"
assert_eq 5 "$(version_count notes.txt)" "versions after a failed restore"

step "history survives a remount"
remount
cd "$MNT"
assert_eq "$(printf '%s\n' "${names5[@]}")" "$(version_names notes.txt)" "version names after remount"
assert_file_content ".versions/notes.txt/${names5[0]}" one "oldest version after remount"
assert_file_content notes.txt two "current content after remount"

step "--show-versions lists .versions in the root; without it, it is hidden but works by name"
assert_not_contains "$(ls -A "$MNT")" ".versions" "ls -A of the root by default"
cd /
MOUNT_ARGS=(--show-versions)
remount
assert_contains "$(ls -A "$MNT")" ".versions" "ls -A of the root with --show-versions"
assert_eq "$(printf '%s\n' "${names5[@]}")" "$(version_names notes.txt)" "version names with --show-versions"

pass
