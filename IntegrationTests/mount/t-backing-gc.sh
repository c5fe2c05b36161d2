#!/usr/bin/env bash
# The backing store's gc through real mounts (backing format 5, docs/FORMAT.md
# "Collecting (format 5)"): after alpha prunes, `ubiquity gc` writes a checkpoint of its
# live records (devices/<id>/checkpoint-<seq>/, `end` last) and the collector writes a
# fossil marker fossils/<pack> (the time) for each pack no record of any device's newest
# checkpoint or later segments names; a gc before the marker's age deletes nothing; the
# age later (7 days; 8 s here: UBQ_TEST_FOSSIL_AGE) the packs and their markers go. beta,
# which kept the old history, shows no conflict and reads on; a device that joins gets the
# current tree from the checkpoint; a version beta made offline meanwhile, whose content
# was in a deleted pack, reaches everyone (beta uploads the chunk again, in a new pack).
# alpha's own segments its checkpoint covers stay while younger than a day, and go once
# older (aged here by giving them an older <t>, as format 4's test aged objects with
# touch); one after the checkpoint stays; a device joining then reads checkpoint and that
# segment. Repacking: of 8 files in one pack 6 are deleted; alpha's gc finds the pack
# less than half named and writes a checkpoint that puts the 2 named chunks in a new
# pack; the next gc makes the old one a fossil, deleted after the wait; beta and a new
# device read the 2 files. SIGKILL of alpha's daemon during the backing gc (each with a
# sparse pack to repack), 5 times: the mounts stay whole, and every pack a live record
# names is still there.
# ubq-timeout: 240
set -euo pipefail
source "$(dirname "$0")/lib.sh"

DEVICE=alpha
# alpha's collector deletes a pack 8 s after its fossil marker instead of 7 days (a test
# setting; the marker holds its time, the rest is as shipped).
fossil_age=8
export UBQ_TEST_FOSSIL_AGE=$fossil_age
mount_fresh backinggc --poll 0.2
unset UBQ_TEST_FOSSIL_AGE
A=$MNT
mount_device beta --poll 0.2
B=$(mnt_of beta)
on_failure dump_sync_state
packs() { backing_packs "$BACKING"; }
markers() { find "$BACKING/fossils" -type f -printf '%f\n' 2>/dev/null | LC_ALL=C sort; }
count() { if [[ -z $1 ]]; then echo 0; else wc -l <<<"$1"; fi; }
sha_of() { sha256sum <"$1" | cut -d' ' -f1; }

# live_packs_present: every chunk place in every device's newest complete checkpoint and
# in its segments after it (the references, docs/FORMAT.md) points into a pack that is
# there and holds the chunk's bytes: gc never deletes a pack a live record names.
live_packs_present() {
  python3 - "$BACKING" <<'PY'
import hashlib, os, re, sys
b = sys.argv[1]
lines, bad, n = {}, [], 0
for name in os.listdir(f"{b}/log"):
    m = re.fullmatch(r"[0-9]{13}-([0-9a-f]{16})-([0-9a-f]{16})", name)
    if m:
        lines.setdefault(m.group(1), []).append((int(m.group(2), 16), f"{b}/log/{name}"))
newest = {}
for dev in os.listdir(f"{b}/devices"):
    for c in os.listdir(f"{b}/devices/{dev}"):
        if c.startswith("checkpoint-") and os.path.exists(f"{b}/devices/{dev}/{c}/end"):
            newest[dev] = max(newest.get(dev, 0), int(c[11:], 16))
files = []
for dev in set(lines) | set(newest):
    seq = newest.get(dev, 0)
    if dev in newest:
        d = f"{b}/devices/{dev}/checkpoint-{seq:016x}"
        files += [f"{d}/{p}" for p in sorted(os.listdir(d)) if p != "end"]
    files += [f for s, f in lines.get(dev, []) if s > seq]
for f in files:
    for sha, size, pack, off in re.findall(rb"([0-9a-f]{64}):([0-9]+)@([0-9a-f]{32}):([0-9]+)", open(f, "rb").read()):
        n += 1
        p = f"{b}/packs/{pack[:2].decode()}/{pack.decode()}"
        try:
            with open(p, "rb") as fh:
                fh.seek(int(off))
                ok = hashlib.sha256(fh.read(int(size))).hexdigest().encode() == sha
        except OSError:
            ok = False
        if not ok:
            bad.append(f"{f}: pack {pack.decode()} at {off.decode()}")
print(f"{n} places checked")
for x in bad[:10]:
    print("MISSING", x)
sys.exit(1 if bad else 0)
PY
}

step "alpha saves big.bin 5 times (one chunk, so one pack each), beta receives every version"
for i in $(seq 5); do
  head -c 16000 /dev/urandom >"$DATA/v$i" # one chunk (under the chunker's 16 KiB minimum)
  cp "$DATA/v$i" "$A/big.bin"
  "$UBIQUITY" sync "$A" >/dev/null
done
"$UBIQUITY" sync "$B" >/dev/null
assert_same_file "$DATA/v5" "$B/big.bin" "big.bin on beta"
assert_eq 5 "$(version_count_at "$B" big.bin)" "versions of big.bin on beta"
dev=$(backing_device_id alpha)
[[ -n $dev ]] || fail "no segment of alpha in $BACKING/log"
for i in $(seq 5); do
  pack_v[i]=$(backing_packs_holding "$BACKING" "$(sha_of "$DATA/v$i")")
  [[ ${pack_v[i]} =~ ^[0-9a-f]{32}$ ]] || fail "the pack holding version $i of big.bin: [${pack_v[i]}]"
done
assert_eq 5 "$(count "$(packs)")" "packs in the backing store (one per sync of big.bin)"
segments0=$(backing_segments "$BACKING" "$dev")
last=$(tail -n1 <<<"$segments0")
seq=${last##*-}
log "    alpha ($dev): $(count "$segments0") segments, the last $last"

step "alpha prunes; gc writes a checkpoint of its one live record and makes the 4 pruned packs fossils"
sleep 1.1
out=$("$UBIQUITY" prune --keep-within 1s "$A")
assert_contains "$out" "pruned 4 version(s)" "prune on alpha"
t0=$(date +%s)
out=$("$UBIQUITY" gc --grace 0s "$A")
t1=$(date +%s)
log "    $(grep '^backing' <<<"$out")"
assert_contains "$out" "wrote a checkpoint of this device's records (1 records" "gc report: the checkpoint"
assert_contains "$out" "(1 packs named)" "gc report: references (big.bin's current version)"
assert_contains "$out" "checked 5 packs: 4 became fossils" "gc report: fossils"
cp_dir="$BACKING/devices/$dev/checkpoint-$seq"
assert_eq "$(printf '00000000\nend')" "$(ls "$cp_dir")" "files of alpha's checkpoint $seq (covering its segments up to the last)"
assert_eq "parts=1 records=1" "$(cat "$cp_dir/end")" "alpha's checkpoint's end"
assert_contains "$(cat "$cp_dir/00000000")" "@${pack_v[5]}:" "the checkpoint's record of big.bin naming the pack of version 5"
assert_eq "$(printf '%s\n' "${pack_v[@]:1:4}" | LC_ALL=C sort)" "$(markers)" "fossil markers (the packs of versions 1-4)"
for p in $(markers); do
  stamp=$(cat "$BACKING/fossils/$p")
  ((stamp >= t0 - 1 && stamp <= t1)) || fail "fossils/$p holds [$stamp], not the time of the gc ($t0..$t1)"
done
assert_eq 5 "$(count "$(packs)")" "packs (a fossil's pack stays for its wait)"
assert_eq "$segments0" "$(backing_segments "$BACKING" "$dev")" \
  "alpha's segments (covered by its checkpoint, but younger than a day: kept)"

step "a gc within the fossils' wait deletes nothing"
out=$("$UBIQUITY" gc --grace 0s "$A")
assert_contains "$out" "0 fossils deleted" "gc report right after the fossils were made"
assert_contains "$out" "4 fossils wait" "gc report: the fossils waiting"
assert_eq 5 "$(count "$(packs)")" "packs after a gc within the fossils' wait"

step "beta, which kept the whole history, reads on with no conflict; a new device gets the tree"
echo "from beta" >"$B/note.txt"
"$UBIQUITY" sync "$B" >/dev/null
"$UBIQUITY" sync "$A" >/dev/null
assert_file_content "$A/note.txt" "from beta" "note.txt on alpha"
assert_eq 0 "$(xattr "$B/big.bin" user.ubiquity.conflicts)" "conflicts of big.bin on beta"
mount_device gamma --poll 0.2
G=$(mnt_of gamma)
"$UBIQUITY" sync "$G" >/dev/null
assert_same_file "$DATA/v5" "$G/big.bin" "big.bin on gamma"
assert_file_content "$G/note.txt" "from beta" "note.txt on gamma"
assert_eq 1 "$(version_count_at "$G" big.bin)" "versions of big.bin on gamma (read from alpha's checkpoint: the rest is pruned)"
assert_eq 0 "$(xattr "$G/big.bin" user.ubiquity.conflicts)" "conflicts of big.bin on gamma"

step "beta, offline, saves the content of a pruned version"
"$UBIQUITY" pause "$B" >/dev/null
cp "$DATA/v2" "$B/offline.bin"

step "the fossils' wait later (7 days; $fossil_age s here) their packs go, then the markers"
stamp=$(cat "$BACKING/fossils/${pack_v[1]}")
while (($(date +%s) < stamp + fossil_age)); do sleep 0.2; done
out=$("$UBIQUITY" gc --grace 0s "$A")
assert_contains "$out" "4 fossils deleted" "gc report: deleted"
assert_eq "" "$(markers)" "fossil markers left"
assert_eq "${pack_v[5]}" "$(packs)" "packs left (that of big.bin's current version)"
assert_eq "" "$(backing_packs_holding "$BACKING" "$(sha_of "$DATA/v2")")" "packs holding a pruned version's chunk"
out=$(live_packs_present) || fail "a pack a live record names is gone: $out"

step "beta comes back: its version (its chunk in a new pack) reaches alpha and gamma"
"$UBIQUITY" resume "$B" >/dev/null
"$UBIQUITY" sync "$B" >/dev/null
again=$(backing_packs_holding "$BACKING" "$(sha_of "$DATA/v2")")
[[ $again =~ ^[0-9a-f]{32}$ && $again != "${pack_v[2]}" ]] ||
  fail "the pack beta uploaded v2's chunk in again: got [$again] (the deleted one was ${pack_v[2]})"
"$UBIQUITY" sync "$A" >/dev/null
"$UBIQUITY" sync "$G" >/dev/null
assert_same_file "$DATA/v2" "$A/offline.bin" "offline.bin on alpha"
assert_same_file "$DATA/v2" "$G/offline.bin" "offline.bin on gamma"

step "alpha's segments its checkpoint covers go once a day old; a later one stays"
echo after >"$A/after.txt"
"$UBIQUITY" sync "$A" >/dev/null
segments1=$(backing_segments "$BACKING" "$dev")
((${#segments1} > ${#segments0})) || fail "no new segment of alpha after after.txt: [$segments1]"
# A day is the grace (no test setting): give every segment of alpha a <t> two days back,
# which is what its name would say had it been written then.
old_t=$(printf '%013d' $(($(now_ms) - 2 * 86400 * 1000)))
for s in $segments1; do mv -- "$BACKING/log/$s" "$BACKING/log/$old_t-${s#*-}"; done
out=$("$UBIQUITY" gc --grace 0s "$A")
n0=$(count "$segments0")
assert_contains "$out" "deleted $n0 segments and 0 checkpoints this device's checkpoint covers" "gc report: alpha's covered segments"
left=$(backing_segments "$BACKING" "$dev")
assert_eq 1 "$(count "$left")" "alpha's segments left"
((16#${left##*-} > 16#$seq)) || fail "alpha's segment left [$left] is not one after its checkpoint $seq"
assert_exists "$cp_dir/end" "alpha's checkpoint (the newest: never deleted)"
out=$(live_packs_present) || fail "a pack a live record names is gone: $out"

step "a device that joins now reads alpha's checkpoint, then the segment after it"
mount_device delta --poll 0.2
D=$(mnt_of delta)
"$UBIQUITY" sync "$D" >/dev/null
assert_same_tree "$A" "$D" "delta after its first sync"
assert_eq 1 "$(version_count_at "$D" big.bin)" "versions of big.bin on delta"
assert_file_content "$D/after.txt" after "after.txt on delta (in alpha's segment after the checkpoint)"
unmount_device delta

step "repacking: a pack less than half named; alpha's gc puts the named chunks in a new pack, the old one goes a week later"
"$UBIQUITY" pause "$A" >/dev/null # the 8 files go out in one push, so in one pack
mkdir "$A/r"
for i in $(seq 8); do head -c 16000 /dev/urandom >"$DATA/r$i"; cp "$DATA/r$i" "$A/r/r$i.bin"; done
"$UBIQUITY" resume "$A" >/dev/null
"$UBIQUITY" sync "$A" >/dev/null
sparse=$(backing_packs_holding "$BACKING" "$(sha_of "$DATA/r1")")
[[ $sparse =~ ^[0-9a-f]{32}$ && $sparse == "$(backing_packs_holding "$BACKING" "$(sha_of "$DATA/r8")")" ]] ||
  fail "the 8 files of one sync are not in one pack: [$sparse]"
rm "$A"/r/r{1..6}.bin
"$UBIQUITY" sync "$A" >/dev/null
sleep 1.1
"$UBIQUITY" prune --keep-within 1s "$A" >/dev/null
out=$("$UBIQUITY" gc --grace 0s "$A")
log "    $(grep '^backing' <<<"$out")"
assert_contains "$out" "1 packs are less than half named (1 of them by this device's records, whose checkpoint repacks them)" "gc report: the sparse pack"
assert_contains "$out" "repacked: wrote a checkpoint" "gc report: the repacking checkpoint"
moved=$(backing_packs_holding "$BACKING" "$(sha_of "$DATA/r7")" | grep -vx "$sparse" || true)
[[ $moved =~ ^[0-9a-f]{32}$ ]] || fail "r7's chunk is not in one new pack: [$moved]"
out=$("$UBIQUITY" gc --grace 0s "$A")
assert_contains "$out" "1 became fossils" "gc report after the repacking: the sparse pack unnamed"
assert_eq "$sparse" "$(markers)" "fossil markers (the sparse pack)"
stamp=$(cat "$BACKING/fossils/$sparse")
while (($(date +%s) < stamp + fossil_age)); do sleep 0.2; done
out=$("$UBIQUITY" gc --grace 0s "$A")
assert_contains "$out" "1 fossils deleted" "gc report: the sparse pack deleted"
[[ ! -e "$BACKING/packs/${sparse:0:2}/$sparse" ]] || fail "the sparse pack $sparse is still there"
out=$(live_packs_present) || fail "a pack a live record names is gone: $out"
"$UBIQUITY" sync "$B" >/dev/null
mount_device epsilon --poll 0.2
E=$(mnt_of epsilon)
"$UBIQUITY" sync "$E" >/dev/null
for d in "$B" "$E"; do
  assert_eq "r7.bin r8.bin" "$(ls "$d/r" | xargs)" "r/ on $d"
  for i in 7 8; do assert_same_file "$DATA/r$i" "$d/r/r$i.bin" "r$i.bin on $d"; done
done
unmount_device epsilon

step "SIGKILL of alpha's daemon during the backing gc (which repacks), 5 times"
for round in $(seq 5); do
  for i in $(seq 3); do head -c 30000 /dev/urandom >"$A/k.bin"; done
  sum_k=$(sha256sum <"$A/k.bin")
  # Four more files in the same pack, three deleted: the pack is sparse, so the gc
  # killed below is writing a repacking checkpoint at some point.
  "$UBIQUITY" pause "$A" >/dev/null
  for j in 1 2 3 4; do head -c 16000 /dev/urandom >"$A/s$j.bin"; done
  sum_s=$(sha256sum <"$A/s1.bin")
  "$UBIQUITY" resume "$A" >/dev/null
  "$UBIQUITY" sync "$A" >/dev/null
  rm "$A"/s{2,3,4}.bin
  "$UBIQUITY" sync "$A" >/dev/null
  sleep 1.1
  "$UBIQUITY" prune --keep-within 1s "$A" >/dev/null
  "$UBIQUITY" gc --grace 0s "$A" >/dev/null 2>&1 &
  cli=$!
  sleep "0.$((RANDOM % 4))"
  crash_daemon
  wait "$cli" 2>/dev/null || true
  _ubq_mount
  A=$MNT
  assert_eq "$sum_k" "$(sha256sum <"$A/k.bin")" "k.bin on alpha after SIGKILL (round $round)"
  assert_eq "$sum_s" "$(sha256sum <"$A/s1.bin")" "s1.bin on alpha after SIGKILL (round $round)"
  "$UBIQUITY" gc --grace 0s "$A" >/dev/null
  "$UBIQUITY" sync "$B" >/dev/null
  assert_eq "$sum_k" "$(sha256sum <"$B/k.bin")" "k.bin on beta after SIGKILL (round $round)"
  assert_eq "$sum_s" "$(sha256sum <"$B/s1.bin")" "s1.bin on beta after SIGKILL (round $round)"
  assert_eq 0 "$(xattr "$B/k.bin" user.ubiquity.conflicts)" "conflicts of k.bin on beta (round $round)"
done
out=$(live_packs_present) || fail "after the SIGKILL rounds, a pack a live record names is gone: $out"
complete=$(find "$BACKING/devices/$dev" -path '*/checkpoint-*/end' | wc -l)
assert_eq 1 "$complete" "alpha's complete checkpoints (the collector deletes the older ones)"
unmount_device gamma
unmount_device beta
unmount_it
"$UBIQUITY" fsck --store "$STORE" >/dev/null || fail "fsck of alpha's store"
"$UBIQUITY" fsck --store "$STORE_beta" >/dev/null || fail "fsck of beta's store"
pass
