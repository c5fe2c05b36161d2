#!/usr/bin/env bash
# A backing directory with junk and hostile content in it (backing format 5; docs/FORMAT.md,
# "What a reader rejects"), shared by alpha and beta polling every 0.2 s: stray files and
# directories, names in packs/, log/ and fossils/ that are no pack, segment or marker,
# things under devices/ that are no device or no complete checkpoint, a checkpoint and a
# key-value file of random bytes, segments of random bytes, of NULs, with a line of 8 MiB,
# a directory and a sparse file of 300 MiB with segment names, and hand-written device
# segments with junk lines, a bad checksum, a tampered line, path escapes (../, absolute,
# reserved, local-only, invalid names), bad keys and bad chunk places (pack name, offset
# range, a place on a hole, a place given twice), all with correct checksums, among
# well-formed records (one with its chunk in a hand-made pack) that must be applied. A
# segment's last line without its newline (cut short) is skipped, the rest applies; an
# empty segment is nothing; a segment after a missing one waits for it. Metadata comes
# first (files on demand): a record whose pack is missing shows its file at once, whose
# read fails with EIO (after --fetch-timeout) until the pack arrives and reads right
# after; one whose bytes in the pack do not hash, or lie past the pack's end, shows a
# file that never reads (EIO, never wrong bytes); neither holds the records after it.
# Through all of it edits keep flowing both ways, nothing appears outside the mounts, no
# junk is changed or removed, and both daemons live. Then the backing directory goes
# missing while mounted: both devices keep working locally and catch up once it is back.
# ubq-timeout: 180
set -euo pipefail
source "$(dirname "$0")/lib.sh"

DEVICE=alpha
mount_fresh garbage --poll 0.2 --fetch-timeout 2
A=$MNT
mount_device beta --poll 0.2 --fetch-timeout 2
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
assert_eq "ubiquity-backing 5" "$(cat "$BACKING/FORMAT")" "content of BACKING/FORMAT"
check_flow "a clean backing directory"

# The junk is checked at the end: nobody may change or delete it (only gc deletes), keys
# relative to BACKING.
junk=()
add_junk() { junk+=("$@"); }

# record DEVICE-ID PATH [KEY=VALUE | +KEY=VALUE | -KEY ...]: a well-formed record line
# (correct checksum, final \n) for a new file node at PATH (percent-encoded here) with
# the content "hand\n" carried in the record (=<hex>). KEY=VALUE replaces or adds a key
# (VALUE as written, already encoded), +KEY=VALUE appends a repeat of a key, -KEY leaves
# a key out. path comes first, so half a line still names it.
record() {
  local dev=$1 path=$2 now k item
  shift 2
  now=$(date +%s%N)
  local -a order=(path id kind node parents device name committed mtime mode tomb meta size chunks xattrs)
  local -a extra=() fields=()
  local -A kv=([path]=$(pct_encode "$path") [id]=$(rand_hex 32) [kind]=file [node]=$(rand_hex 32)
    [parents]="" [device]=$dev [name]=hand [committed]=$now [mtime]=$now [mode]=420 [tomb]=0
    [meta]=0 [size]=5 [chunks]="=68616e640a" [xattrs]="")
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
  record_line "${fields[@]}" ${extra[@]+"${extra[@]}"}
}

# segment DEVICE-ID SEQ: stdin as that device's segment SEQ (<t> now), added to the junk
# that must stay untouched. Called at the end of pipelines, which lastpipe runs in this
# shell (so add_junk counts).
shopt -s lastpipe
segment() {
  local key
  key=$(backing_put_segment "$BACKING" "$1" "$2")
  add_junk "$key"
}

# packed_key ITEM: the key of the pack a chunks item "<sha>:<size>@<pack>:<offset>" names.
packed_key() {
  local pack=${1#*@}
  pack=${pack%:*}
  echo "packs/${pack:0:2}/$pack"
}

# text_file NAME BYTES: WORK/NAME, BYTES bytes of text (more than 1 KiB: a chunk that
# travels in a pack, not in its record).
text_file() { yes "$1" | head -c "$2" >"$WORK/$1" || true; }

step "junk in packs/, log/, fossils/ and at the top level"
stray_dev=7777777777777777
mkdir -p "$BACKING/packs/zz" "$BACKING/packs/ab" "$BACKING/fossils" "$BACKING/stray-dir"
head -c 4096 /dev/urandom >"$BACKING/packs/zz/garbage"
head -c 100 /dev/urandom >"$BACKING/packs/ab/.tmp-half-written"
# A well-formed pack name whose bytes are no pack; no record names it.
wrong_pack="ab$(rand_hex 30)"
head -c 100 /dev/urandom >"$BACKING/packs/ab/$wrong_pack"
echo "not a pack" >"$BACKING/packs/README"
echo "not a segment" >"$BACKING/log/README"
head -c 100 /dev/urandom >"$BACKING/log/.tmp-half-written"
t=$(now_ms)
# Names that are almost segments, each holding a valid record that must not be read.
strays=("log/$t-0123456789ABCDEF-0000000000000001" "log/$t-$stray_dev-0000000000000000"
  "log/12345-$stray_dev-0000000000000001" "log/$t-$stray_dev-0000000000000001.bak" "log/$t-$stray_dev-1"
  "log/$t-$stray_dev-0000000000000001/inside")
mkdir -p "$BACKING/log/$t-$stray_dev-0000000000000001"
for s in "${strays[@]}"; do
  record $stray_dev "stray-${s//\//-}-$esc.txt" >"$BACKING/$s"
done
marker=$(rand_hex 32)
echo "not a marker" >"$BACKING/fossils/README"
echo "garbage" >"$BACKING/fossils/$marker"
head -c 2048 /dev/urandom >"$BACKING/random.bin"
echo "notes about this folder" >"$BACKING/README.txt"
: >"$BACKING/.DS_Store"
echo stray >"$BACKING/stray-dir/stray.txt"
add_junk packs/zz/garbage packs/ab/.tmp-half-written "packs/ab/$wrong_pack" packs/README log/README \
  log/.tmp-half-written "${strays[@]}" fossils/README "fossils/$marker" random.bin README.txt .DS_Store \
  stray-dir/stray.txt
check_flow "junk in packs/, log/, fossils/ and at the top level"

step "a hand-written device segment: junk lines and rejected records around valid ones"
hand_dev=0123456789abcdef
# A chunk in a hand-made pack, named with its place by a valid record (and by rejected ones).
text_file packed.txt 2000
packed=$(backing_put_pack "$BACKING" "$WORK/packed.txt")
add_junk "$(packed_key "$packed")"
pk=${packed%@*} # <sha256>:<size>
p=$(rand_hex 32)
{
  echo "this is not a record"
  echo
  echo "U2 nothex path=junk-$esc.txt"
  printf 'U2 %s\n' "$(rand_hex 32)"
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
  record $hand_dev ".kv/$esc-reserved"
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
  # U2 with all 64 digits of checksum, U1 with 32.
  line=$(record $hand_dev "u2-long-sum-$esc.txt")
  body=${line#U2 * }
  body=${body%$'\n'}
  echo "U2 $(printf '%s' "$body" | sha256sum | cut -d' ' -f1) $body"
  line=$(record $hand_dev "u1-short-sum-$esc.txt")
  echo "U1${line:2}"
  # Bad chunk places (checked before any arithmetic or request): a pack name that is not
  # 32 lowercase hex digits, offsets below 8, above 2^42 or not decimal, a place on a
  # hole or on a chunk carried inline, a place given twice for one chunk.
  record $hand_dev "place-short-name-$esc.txt" "chunks=$pk@${p:0:31}:8" size=2000
  record $hand_dev "place-upper-name-$esc.txt" "chunks=$pk@${p^^}:8" size=2000
  record $hand_dev "place-offset-7-$esc.txt" "chunks=$pk@$p:7" size=2000
  record $hand_dev "place-offset-huge-$esc.txt" "chunks=$pk@$p:4398046511105" size=2000
  record $hand_dev "place-offset-negative-$esc.txt" "chunks=$pk@$p:-8" size=2000
  record $hand_dev "place-offset-hex-$esc.txt" "chunks=$pk@$p:0x10" size=2000
  record $hand_dev "place-no-offset-$esc.txt" "chunks=$pk@$p" size=2000
  record $hand_dev "place-on-hole-$esc.txt" "chunks=hole:2000@$p:8" size=2000
  record $hand_dev "place-on-inline-$esc.txt" "chunks==68616e640a@$p:8" size=5
  record $hand_dev "place-twice-$esc.txt" "chunks=$packed,$packed" size=4000
  # Valid records: an unknown key is ignored; a name that needs percent-encoding; a chunk
  # in a pack.
  record $hand_dev hand-future.txt future=unknown-keys-are-ignored
  record $hand_dev "hand spaced é.txt"
  record $hand_dev hand-packed.txt "chunks=$packed" size=2000
  record $hand_dev hand-written.txt
} | segment $hand_dev 1

hint="(if no hand-written record is applied at all, compare record_line/record with the daemon's reader)"
for m in "$A" "$B"; do
  wait_content "$m/hand-written.txt" hand "a valid hand-written record after junk and rejected lines, on $m $hint"
  wait_content "$m/hand-future.txt" hand "a valid record with an unknown key, on $m"
  wait_content "$m/hand spaced é.txt" hand "a valid record whose path is percent-encoded, on $m"
  wait_for "hand-packed.txt on $m: its chunk from the hand-made pack" cmp -- "$WORK/packed.txt" "$m/hand-packed.txt"
done
assert_eq hand "$(xattr "$A/hand-written.txt" user.ubiquity.device)" "user.ubiquity.device of hand-written.txt"
# Each rejected line is logged (skipped, not fatal): all but the 4 valid ones.
hand1=${junk[-1]}
rejected=$(($(wc -l <"$BACKING/$hand1") - 4))
logged_skips() { grep -ac "ubiquity: sync: skipping line [0-9]* of $hand1: " "$1/daemon.log" || true; }
for s in "$STORE" "$STORE_beta"; do
  wait_eq "$rejected" "lines of $hand1 logged as skipped in $s/daemon.log" logged_skips "$s"
done

step "a segment cut short: its last line (no newline) is skipped, so is a fragment a newline ended; the rest applies"
{
  line=$(record $hand_dev "fragment-$esc.txt")
  printf '%s\n' "${line:0:$((${#line} / 2))}"
  record $hand_dev hand-after-fragment.txt
  line=$(record $hand_dev "unterminated-$esc.txt")
  printf '%s' "${line%$'\n'}"
} | segment $hand_dev 2
for m in "$A" "$B"; do
  wait_content "$m/hand-after-fragment.txt" hand "the record after a fragment, on $m"
done

step "an empty segment is nothing; a segment after a missing one waits for it"
segment $hand_dev 3 </dev/null
record $hand_dev hand-after-empty.txt | segment $hand_dev 4
record $hand_dev hand-six.txt | segment $hand_dev 6
for m in "$A" "$B"; do
  wait_content "$m/hand-after-empty.txt" hand "the record in the segment after an empty one, on $m"
done
sync_all
sleep 1 # a negative check: 5 poll periods
for m in "$A" "$B"; do
  assert_missing "$m/hand-six.txt" "a record of segment 6 while segment 5 is missing, on $m"
done
record $hand_dev hand-five.txt | segment $hand_dev 5
for m in "$A" "$B"; do
  wait_content "$m/hand-five.txt" hand "the record of segment 5 once it came, on $m"
  wait_content "$m/hand-six.txt" hand "the record of segment 6 once segment 5 came, on $m"
done

step "a record whose pack is missing shows its file, which reads once the pack arrives; the records after it apply"
late_dev=5555555555555555
text_file late.txt 3000
late_pack=$(rand_hex 32)
late_sha=$(sha256sum <"$WORK/late.txt" | cut -d' ' -f1)
{
  record $late_dev late-object.txt "chunks=$late_sha:3000@$late_pack:8" size=3000
  record $late_dev after-late.txt
} | segment $late_dev 1
record $late_dev after-late-2.txt | segment $late_dev 2
sync_all
for m in "$A" "$B"; do
  wait_content "$m/after-late.txt" hand "the record after it in the same segment, on $m"
  wait_content "$m/after-late-2.txt" hand "the record in the device's next segment, on $m"
  assert_eq 3000 "$(stat -c %s "$m/late-object.txt")" "size of late-object.txt before its pack came, on $m"
  assert_contains "$(xattr "$m/late-object.txt" user.ubiquity.downloaded)" not-downloaded "downloaded state of late-object.txt, on $m"
  assert_fails "a read of late-object.txt before its pack came, on $m" cat "$m/late-object.txt"
  assert_contains "$LAST_ERR" "Input/output error" "the read of late-object.txt before its pack came, on $m"
done
got=$(PACK_NAME=$late_pack backing_put_pack "$BACKING" "$WORK/late.txt")
assert_eq "$late_sha:3000@$late_pack:8" "$got" "the place of late.txt in the hand-made pack"
add_junk "$(packed_key "$got")"
for m in "$A" "$B"; do
  wait_for "late-object.txt once its pack arrived, on $m" cmp -- "$WORK/late.txt" "$m/late-object.txt"
done

step "a record whose bytes in the pack do not hash to its chunk, or lie past the pack's end, never reads"
corrupt_dev=4444444444444444
text_file right.txt 3000
text_file wrong.txt 3000
right_sha=$(sha256sum <"$WORK/right.txt" | cut -d' ' -f1)
wrong=$(backing_put_pack "$BACKING" "$WORK/wrong.txt")
add_junk "$(packed_key "$wrong")"
record $corrupt_dev "corrupt.txt" "chunks=$right_sha:3000@${wrong#*@}" size=3000 | segment $corrupt_dev 1
short_dev=6666666666666666
text_file short.txt 3000
short_sha=$(sha256sum <"$WORK/short.txt" | cut -d' ' -f1)
# A pack of 2000 bytes of chunk: 3000 bytes from offset 1000 run past its end.
shortp=$(backing_put_pack "$BACKING" "$WORK/packed.txt")
add_junk "$(packed_key "$shortp")"
shortp=${shortp#*@}
record $short_dev "past-the-end.txt" "chunks=$short_sha:3000@${shortp%:*}:1000" size=3000 | segment $short_dev 1
sync_all
for m in "$A" "$B"; do
  for f in corrupt.txt past-the-end.txt; do
    wait_for "$f on $m" test -e "$m/$f"
    assert_fails "a read of $f, on $m" cat "$m/$f"
    assert_contains "$LAST_ERR" "Input/output error" "the read of $f, on $m"
  done
done
check_flow "records naming a damaged or short pack"

step "things under devices/ that are no device or no complete checkpoint, each on its own"
# checkpoint DIR LINE...: a checkpoint's part 00000000 and its end (written last).
checkpoint() {
  local dir=$1
  shift
  mkdir -p "$BACKING/$dir"
  printf '%s\n' "$@" >"$BACKING/$dir/00000000"
  printf 'parts=1 records=%d\n' $# >"$BACKING/$dir/end"
  add_junk "$dir/00000000" "$dir/end"
}
cp_dev=aaaaaaaaaaaaaaaa
checkpoint "devices/$cp_dev/checkpoint-0000000000000001" junk \
  "$(record $cp_dev "cp-wrong-device-$esc.txt" device=$hand_dev)" "$(record $cp_dev cp-record.txt)"
# devices/ is listed again when a poll finds a new segment: an edit makes one.
check_flow "a new device's checkpoint"
for m in "$A" "$B"; do
  wait_content "$m/cp-record.txt" hand "the valid record of a hand-written checkpoint, among junk, on $m"
done
checkpoint devices/not-a-device/checkpoint-0000000000000001 "$(record not-a-device "not-a-device-$esc.txt")"
check_flow "devices/not-a-device/ (not a device id) holding a checkpoint"
checkpoint devices/0123456789ABCDEF/checkpoint-0000000000000001 "$(record 0123456789ABCDEF "uppercase-id-$esc.txt")"
check_flow "devices/0123456789ABCDEF/ (upper-case: not a device id) holding a checkpoint"
mkdir -p "$BACKING/devices/8888888888888888/checkpoint-0000000000000001"
record 8888888888888888 "no-end-$esc.txt" >"$BACKING/devices/8888888888888888/checkpoint-0000000000000001/00000000"
check_flow "a checkpoint without its end (being written)"
echo "a file where a device directory belongs" >"$BACKING/devices/1111111111111111"
check_flow "devices/1111111111111111 a regular file, not a directory"
mkdir -p "$BACKING/devices/2222222222222222"
echo "a file where a checkpoint directory belongs" >"$BACKING/devices/2222222222222222/checkpoint-0000000000000001"
check_flow "devices/2222222222222222/checkpoint-... a regular file, not a directory"
mkdir -p "$BACKING/devices/3333333333333333/checkpoint-0000000000000001"
head -c 65536 /dev/urandom >"$BACKING/devices/3333333333333333/checkpoint-0000000000000001/00000000"
echo "parts=1 records=1" >"$BACKING/devices/3333333333333333/checkpoint-0000000000000001/end"
check_flow "devices/3333333333333333/checkpoint-.../00000000 of 64 KiB random bytes"
head -c 4096 /dev/urandom >"$BACKING/devices/3333333333333333/keyvalue-0000000000000001"
echo "unknown file in a device directory" >"$BACKING/devices/3333333333333333/notes"
check_flow "a key-value file of random bytes and an unknown file in a device directory"
add_junk devices/8888888888888888/checkpoint-0000000000000001/00000000 devices/1111111111111111 \
  devices/2222222222222222/checkpoint-0000000000000001 devices/3333333333333333/checkpoint-0000000000000001/00000000 \
  devices/3333333333333333/checkpoint-0000000000000001/end devices/3333333333333333/keyvalue-0000000000000001 \
  devices/3333333333333333/notes

step "odd segments: random bytes, NULs, a line of 8 MiB, a directory"
head -c 65536 /dev/urandom | segment dddddddddddddddd 1
record dddddddddddddddd after-random.txt | segment dddddddddddddddd 2
for m in "$A" "$B"; do
  wait_content "$m/after-random.txt" hand "the record in the segment after one of random bytes, on $m"
done
head -c 65536 /dev/zero | segment 9999999999999999 1
{
  head -c $((8 << 20)) /dev/zero | tr '\0' x
  echo
  record 9999999999999999 after-huge-line.txt
} | segment 9999999999999999 2
for m in "$A" "$B"; do
  wait_content "$m/after-huge-line.txt" hand "the record after a line of 8 MiB, on $m"
done
mkdir -p "$BACKING/log/$(now_ms)-bbbbbbbbbbbbbbbb-0000000000000001"
check_flow "a directory with a segment's name"

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

# Snapshot of every junk file and the hand-written segments and packs, compared at the end.
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
  # Other processes come and go in /tmp: an entry that vanishes under find is not one of ours.
  assert_eq "" "$(find / /tmp -maxdepth 1 -name "*$esc*" 2>/dev/null)" "names containing $esc in / and /tmp"
}

step "nothing rejected shows up, in the mounts or outside them"
top=(after-huge-line.txt after-late-2.txt after-late.txt after-random.txt corrupt.txt cp-record.txt dir f.txt flow.txt
  "hand spaced é.txt" hand-after-empty.txt hand-after-fragment.txt hand-five.txt hand-future.txt hand-packed.txt
  hand-six.txt hand-written.txt late-object.txt past-the-end.txt)
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
# README ("Sync and conflicts"): `ubiquity sync` fails with exit status 1 when the backing
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
assert_eq "$junk_sums" "$(cd "$BACKING" && sha256sum -- "${junk[@]}" 2>&1)" "junk, foreign segments, checkpoints and packs (never changed or removed)"
check_nothing_leaked "${top[@]}" offline-a.txt offline-b.txt offline-dir
for m in "$A" "$B"; do
  assert_missing "$m/corrupt-$esc.txt" "a record whose bytes in its pack have the wrong hash, on $m"
  assert_missing "$m/past-the-end-$esc.txt" "a record whose place lies past its pack's end, on $m"
done
assert_daemon_alive alpha
assert_daemon_alive beta

# Last, so that the steps above run whatever happens here.
step "a segment of 300 MiB (sparse; more than a reader reads): skipped, edits keep flowing"
huge="log/$(now_ms)-cccccccccccccccc-0000000000000001"
truncate -s 300M "$BACKING/$huge"
check_flow "a segment of 300 MiB"
assert_daemon_alive alpha
assert_daemon_alive beta
assert_eq "300M" "$(du -h --apparent-size "$BACKING/$huge" | cut -f1)" "the segment of 300 MiB (left as it is)"

unmount_device beta
unmount_it
pass
