#!/usr/bin/env bash
# A backing directory with junk and hostile records in it (docs/FORMAT.md, "What a
# reader rejects"), shared by alpha and beta polling every 0.2 s: random objects, stray
# files and directories, things under devices/ that are no device, a journal of random
# bytes, and a hand-written device journal with junk lines, a bad checksum, a tampered
# line, path escapes (../, absolute, reserved, local-only, invalid names) and bad keys,
# all with correct checksums, among well-formed records that must be applied. A
# complete line without its final newline waits; a crashed writer's fragment is
# skipped once a newline ends it; a record whose object is missing waits (and so does
# the rest of that journal) until the object arrives; one whose object has the wrong
# bytes is never applied. Through all of it edits keep flowing both ways, nothing
# appears outside the mounts, no junk is changed or removed, and both daemons live.
# Then the backing directory goes missing while mounted: both devices keep working
# locally and catch up once it is back.
# ubq-timeout: 180
set -euo pipefail
source "$(dirname "$0")/lib.sh"

DEVICE=alpha
mount_fresh garbage --poll 0.2
A=$MNT
mount_device beta --poll 0.2
B=$(mnt_of beta)
on_failure dump_sync_state
# Every record that must be rejected names a path containing $esc, a string nothing else
# uses, so a leak can be looked for anywhere.
esc="escape-$$"

# check_flow WITH: an edit on alpha reaches beta and one on beta reaches alpha (each
# waits for the last, so they never conflict). WITH says what junk is around.
flow=0
check_flow() {
  flow=$((flow + 1))
  echo "alpha $flow" >"$A/flow.txt"
  wait_content "$B/flow.txt" "alpha $flow" "alpha's edit of flow.txt on beta, with $1"
  echo "beta $flow" >"$B/flow.txt"
  wait_content "$A/flow.txt" "beta $flow" "beta's edit of flow.txt on alpha, with $1"
}

step "baseline: edits flow both ways"
echo one >"$A/f.txt"
wait_content "$B/f.txt" one "f.txt on beta"
assert_eq "ubiquity-backing 4" "$(cat "$BACKING/FORMAT")" "content of BACKING/FORMAT"
check_flow "a clean backing directory"

# The junk is checked at the end: nobody may change or delete it (only gc deletes).
junk=()
add_junk() { junk+=("$@"); }

step "junk in objects/ and at the top level"
mkdir -p "$BACKING/objects/zz" "$BACKING/objects/ab"
head -c 4096 /dev/urandom >"$BACKING/objects/zz/garbage"
head -c 100 /dev/urandom >"$BACKING/objects/ab/.tmp-half-written"
# A well-formed object name whose bytes do not match it; no record names it.
wrong_name="ab$(rand_hex 62)"
head -c 100 /dev/urandom >"$BACKING/objects/ab/$wrong_name"
echo "not an object" >"$BACKING/objects/README"
head -c 2048 /dev/urandom >"$BACKING/random.bin"
echo "notes about this folder" >"$BACKING/README.txt"
: >"$BACKING/.DS_Store"
mkdir "$BACKING/stray-dir"
echo stray >"$BACKING/stray-dir/stray.txt"
add_junk objects/zz/garbage objects/ab/.tmp-half-written "objects/ab/$wrong_name" objects/README \
  random.bin README.txt .DS_Store stray-dir/stray.txt
check_flow "junk in objects/ and at the top level"

printf 'hand\n' >"$WORK/hand.txt"
hand_chunks=$(backing_put_object "$BACKING" "$WORK/hand.txt")
hand_size=5

# record DEVICE-ID PATH [KEY=VALUE | +KEY=VALUE | -KEY ...]: a well-formed journal line
# (correct checksum, final \n) for a new file node at PATH (percent-encoded here) with
# the content of hand.txt. KEY=VALUE replaces or adds a key (VALUE as written, already
# encoded), +KEY=VALUE appends a repeat of a key, -KEY leaves a key out. path comes
# first, so half a line still names it.
record() {
  local dev=$1 path=$2 now k item
  shift 2
  now=$(date +%s%N)
  local -a order=(path id kind node parents device name committed mtime mode tomb meta size chunks xattrs)
  local -a extra=() fields=()
  local -A kv=([path]=$(pct_encode "$path") [id]=$(rand_hex 32) [kind]=file [node]=$(rand_hex 32)
    [parents]="" [device]=$dev [name]=hand [committed]=$now [mtime]=$now [mode]=420 [tomb]=0
    [meta]=0 [size]=$hand_size [chunks]=$hand_chunks [xattrs]="")
  for item in "$@"; do
    case $item in
      +*) extra+=("${item#+}") ;;
      -*) unset "kv[${item#-}]" ;;
      *)
        k=${item%%=*}
        [[ -n ${kv[$k]+set} ]] || order+=("$k")
        kv[$k]=${item#*=}
        ;;
    esac
  done
  for k in "${order[@]}"; do
    if [[ -n ${kv[$k]+set} ]]; then fields+=("$k=${kv[$k]}"); fi
  done
  journal_line "${fields[@]}" ${extra[@]+"${extra[@]}"}
}

step "a hand-written device journal: junk and rejected records around valid ones"
hand_dev=0123456789abcdef
J1="$BACKING/devices/$hand_dev/journal"
mkdir -p "$(dirname "$J1")"
{
  echo "this is not a record"
  echo
  echo "U1 nothex path=junk-$esc.txt"
  printf 'U1 %s\n' "$(rand_hex 64)"
  head -c 300 /dev/urandom | tr -d '\n'
  echo
  # A bad checksum (its first digit changed), and a line changed after its checksum.
  line=$(record $hand_dev "bad-checksum-$esc.txt")
  [[ ${line:3:1} == 0 ]] && d=1 || d=0
  echo "${line:0:3}$d${line:4}"
  line=$(record $hand_dev "tampered-$esc.txt")
  echo "${line/tampered-/tampered-after-}"
  # Paths that must never be applied, every line with a correct checksum.
  record $hand_dev "../$esc"
  record $hand_dev "a/../../$esc-2"
  record $hand_dev "$ROOT/$esc-absolute"
  record $hand_dev "./$esc-dot"
  record $hand_dev "sub//$esc-empty-component"
  record $hand_dev "sub/$esc-trailing-slash/"
  record $hand_dev "" path=
  record $hand_dev ".versions/$esc-reserved"
  record $hand_dev ".conflicts/$esc-reserved"
  record $hand_dev "x.nosync/$esc-local-only"
  record $hand_dev "$esc-scratch.swp"
  record $hand_dev x path="bad%FF%FE-$esc.txt"
  record $hand_dev x path="nul%00-$esc.txt"
  record $hand_dev "$(printf 'L%.0s' {1..256})-$esc.txt"
  # Bad keys.
  record $hand_dev "wrong-device-$esc.txt" device=fedcba9876543210
  record $hand_dev "repeated-key-$esc.txt" "+mode=420"
  record $hand_dev "missing-key-$esc.txt" -mtime
  record $hand_dev "bad-size-$esc.txt" size=999
  record $hand_dev "bad-mode-$esc.txt" mode=4096
  record $hand_dev "bad-kind-$esc.txt" kind=socket
  line=$(record $hand_dev "u2-$esc.txt")
  echo "U2${line:2}"
  # Valid records: an unknown key is ignored; a name that needs percent-encoding.
  record $hand_dev hand-future.txt future=unknown-keys-are-ignored
  record $hand_dev "hand spaced é.txt"
  record $hand_dev hand-written.txt
  # Complete but without its final newline: an append in progress.
  line=$(record $hand_dev hand-pending.txt)
  printf '%s' "$line"
} >"$J1"

hint="(if no hand-written record is applied at all, compare journal_line/record with the daemon's reader)"
for m in "$A" "$B"; do
  wait_content "$m/hand-written.txt" hand "a valid hand-written record after junk and rejected lines, on $m $hint"
  wait_content "$m/hand-future.txt" hand "a valid record with an unknown key, on $m"
  wait_content "$m/hand spaced é.txt" hand "a valid record whose path is percent-encoded, on $m"
done
assert_eq hand "$(xattr "$A/hand-written.txt" user.ubiquity.device)" "user.ubiquity.device of hand-written.txt"

step "a complete line without its newline waits; the newline completes it"
sync_all
sleep 1 # a negative check: 5 poll periods
for m in "$A" "$B"; do
  assert_missing "$m/hand-pending.txt" "a record without its final newline (being appended), on $m"
done
printf '\n' >>"$J1"
for m in "$A" "$B"; do
  wait_content "$m/hand-pending.txt" hand "hand-pending.txt once its line ends, on $m"
done

step "a crashed writer's half line, ended by a newline, is skipped; the next record applies"
line=$(record $hand_dev "fragment-$esc.txt")
printf '%s' "${line:0:$((${#line} / 2))}" >>"$J1"
sync_all
printf '\n' >>"$J1"
record $hand_dev hand-after-crash.txt >>"$J1"
for m in "$A" "$B"; do
  wait_content "$m/hand-after-crash.txt" hand "the record after a fragment, on $m"
done

step "a record whose object is missing waits, with the rest of its journal, until it arrives"
late_dev=5555555555555555
mkdir -p "$BACKING/devices/$late_dev"
printf 'late object\n' >"$WORK/late.txt"
late_sha=$(sha256sum <"$WORK/late.txt" | cut -d' ' -f1)
{
  record $late_dev late-object.txt "chunks=$late_sha:12" size=12
  record $late_dev after-late.txt
} >"$BACKING/devices/$late_dev/journal"
sync_all
sleep 1 # a negative check: 5 poll periods
for m in "$A" "$B"; do
  assert_missing "$m/late-object.txt" "a record whose object is not in the backing directory yet, on $m"
  assert_missing "$m/after-late.txt" "the record after it in the same journal, on $m"
done
backing_put_object "$BACKING" "$WORK/late.txt" >/dev/null
for m in "$A" "$B"; do
  wait_content "$m/late-object.txt" "late object" "late-object.txt once its object arrived, on $m"
  wait_content "$m/after-late.txt" hand "after-late.txt once the record before it applied, on $m"
done

step "a record whose object has the wrong bytes is not applied"
corrupt_dev=4444444444444444
mkdir -p "$BACKING/devices/$corrupt_dev"
printf 'right bytes\n' >"$WORK/right.txt"
right_sha=$(sha256sum <"$WORK/right.txt" | cut -d' ' -f1)
mkdir -p "$BACKING/objects/${right_sha:0:2}"
printf 'WRONG bytes\n' >"$BACKING/objects/${right_sha:0:2}/$right_sha"
record $corrupt_dev "corrupt-$esc.txt" "chunks=$right_sha:12" size=12 >"$BACKING/devices/$corrupt_dev/journal"
add_junk "objects/${right_sha:0:2}/$right_sha" "devices/$corrupt_dev/journal"
sync_all
check_flow "a record that waits for a corrupt object"

step "things under devices/ that are no device's journal, each on its own"
mkdir -p "$BACKING/devices/not-a-device"
record not-a-device "not-a-device-$esc.txt" >"$BACKING/devices/not-a-device/journal"
check_flow "devices/not-a-device/ (not a device id) holding a journal"
mkdir -p "$BACKING/devices/0123456789ABCDEF"
record 0123456789ABCDEF "uppercase-id-$esc.txt" >"$BACKING/devices/0123456789ABCDEF/journal"
check_flow "devices/0123456789ABCDEF/ (upper-case: not a device id) holding a journal"
echo "a file where a device directory belongs" >"$BACKING/devices/1111111111111111"
check_flow "devices/1111111111111111 a regular file, not a directory"
mkdir -p "$BACKING/devices/2222222222222222/journal"
check_flow "devices/2222222222222222/journal a directory, not a file"
mkdir -p "$BACKING/devices/3333333333333333"
head -c 65536 /dev/urandom >"$BACKING/devices/3333333333333333/journal"
check_flow "devices/3333333333333333/journal of 64 KiB random bytes"
echo "unknown file in a device directory" >"$BACKING/devices/3333333333333333/notes"
check_flow "an unknown file in a device directory"
add_junk devices/not-a-device/journal devices/0123456789ABCDEF/journal devices/1111111111111111 \
  devices/3333333333333333/journal devices/3333333333333333/notes

step "with all that around, edits keep flowing both ways"
echo two >"$A/f.txt"
mkdir "$A/dir"
echo x >"$A/dir/x.txt"
wait_content "$B/f.txt" two "f.txt on beta after alpha's edit"
wait_content "$B/dir/x.txt" x "dir/x.txt on beta"
echo from-beta >"$B/dir/y.txt"
mv "$B/dir/x.txt" "$B/dir/x-renamed.txt"
wait_content "$A/dir/y.txt" from-beta "dir/y.txt on alpha"
wait_missing "$A/dir/x.txt" "dir/x.txt on alpha after beta renamed it"
wait_same_tree "$A" "$B" "trees after edits among the junk"
assert_daemon_alive alpha
assert_daemon_alive beta

# Snapshot of every junk file and the hand-written journals, compared at the end.
add_junk "devices/$hand_dev/journal" "devices/$late_dev/journal"
junk_sums=$(cd "$BACKING" && sha256sum -- "${junk[@]}")

# check_nothing_leaked: no rejected record shows in a mount (the exact top-level
# listing, and no name with $esc anywhere), and nothing with $esc exists outside.
check_nothing_leaked() {
  local m expected got
  expected=$(printf '%s\n' "$@" | LC_ALL=C sort)
  for m in "$A" "$B"; do
    # shellcheck disable=SC2010 # names here are known; ls sorts them as expected is sorted
    got=$(LC_ALL=C ls -A "$m" | grep -vxE '\.versions|\.conflicts' || true)
    assert_eq "$expected" "$got" "top-level entries of $m"
    assert_eq "" "$(find "$m" -name "*$esc*" 2>&1)" "names containing $esc in $m"
  done
  assert_eq "" "$(find "${TEST_PREFIX}"* -xdev -name "*$esc*" 2>&1)" "names containing $esc under ${TEST_PREFIX}*"
  assert_eq "" "$(find / /tmp -maxdepth 1 -name "*$esc*" 2>&1)" "names containing $esc in / and /tmp"
}

step "nothing rejected shows up, in the mounts or outside them"
top=(after-late.txt dir f.txt flow.txt "hand spaced é.txt" hand-after-crash.txt hand-future.txt
  hand-pending.txt hand-written.txt late-object.txt)
check_nothing_leaked "${top[@]}"

step "the backing directory goes missing: both devices keep working locally"
sync_all
mv -T "$BACKING" "$BACKING.away"
echo offline-a >"$A/offline-a.txt"
echo three >"$A/f.txt"
mkdir "$A/offline-dir"
echo offline-b >"$B/offline-b.txt"
assert_file_content "$A/offline-a.txt" offline-a "a new file on alpha while offline"
assert_file_content "$A/f.txt" three "an edit on alpha while offline"
assert_eq 1 "$(version_count_at "$A" offline-a.txt)" "versions of offline-a.txt (saved locally)"
assert_eq 0 "$(xattr "$A/offline-a.txt" user.ubiquity.uploaded)" "user.ubiquity.uploaded of a file saved while offline"
# README ("Syncing"): `ubiquity sync` fails with exit status 1 when the backing
# directory cannot be reached.
rc=0
out=$(timeout -k 5 30 "$UBIQUITY" sync "$A" 2>&1) || rc=$?
((rc != 124 && rc != 137)) || fail "ubiquity sync with the backing directory missing: still running after 30 s [$out]"
assert_eq 1 "$rc" "exit status of ubiquity sync with the backing directory missing (output: [$out])"
for m in "$A" "$B"; do
  wait_eq offline "state in user.ubiquity.sync of $m while the backing directory is away" sync_status "$m" state
done
sleep 1 # more polls against the missing directory
assert_missing "$BACKING" \
  "the backing directory while it is away (a daemon must not create it again: it may be an unmounted disk)"
assert_file_content "$B/f.txt" two "f.txt on beta while the backing directory is away"
assert_daemon_alive alpha
assert_daemon_alive beta

step "the backing directory comes back: both catch up"
mv -T "$BACKING.away" "$BACKING"
wait_content -t 20 "$B/offline-a.txt" offline-a "alpha's offline file on beta"
wait_content -t 20 "$B/f.txt" three "alpha's offline edit on beta"
wait_content -t 20 "$A/offline-b.txt" offline-b "beta's offline file on alpha"
wait_eq -t 20 1 "user.ubiquity.uploaded of offline-a.txt once back" xattr "$A/offline-a.txt" user.ubiquity.uploaded
wait_same_tree -t 20 "$A" "$B" "trees after the backing directory came back"
for m in "$A" "$B"; do
  wait_eq syncing "state in user.ubiquity.sync of $m once the backing directory is back" sync_status "$m" state
done

step "at the end: junk untouched, nothing leaked, both daemons alive"
assert_eq "$junk_sums" "$(cd "$BACKING" && sha256sum -- "${junk[@]}" 2>&1)" "junk and foreign journals (never changed or removed)"
check_nothing_leaked "${top[@]}" offline-a.txt offline-b.txt offline-dir
for m in "$A" "$B"; do
  assert_missing "$m/corrupt-$esc.txt" "a record whose object has the wrong bytes, on $m"
done
assert_daemon_alive alpha
assert_daemon_alive beta

unmount_device beta
unmount_it
pass
