#!/usr/bin/env bash
# An encrypted container (issue 25) through real mounts: made by `mount --encrypt`, joined
# by two more devices (passphrase from a file, a command and a systemd credential); a
# scan of the whole backing directory finds none of the plaintext (contents, file,
# directory and device names, xattrs, key-value keys and values); a wrong or missing
# passphrase exits 2 and mounts nothing; a changed pack is never served and is fetched
# again once whole; a segment replayed in place of another holds back only its device's
# later records; fsck names every kind of damaged object; a FORMAT replaced by a plain
# one stops the device that knew it encrypted; passphrases added, changed and removed
# while devices stay mounted and keep syncing; `key add` and `key remove` killed with -9
# at random moments leave every key whole; an encrypted container of three devices
# through the S3 server, scanned there too.
# ubq-timeout: 300
set -euo pipefail
source "$(dirname "$0")/lib.sh"

# Key files made here cost the least scrypt allows (a test setting, logged); the kill -9
# step below uses the real, tuned cost, so it has something to interrupt.
export UBQ_TEST_SCRYPT=fast
mark=$(rand_hex 12)
PW="$WORK/pw" PW2="$WORK/pw2" BAD="$WORK/bad"
printf 'first passphrase %s\n' "$mark" >"$PW"
printf 'second passphrase %s\n' "$mark" >"$PW2"
printf 'not it\n' >"$BAD"
on_failure dump_sync_state

DEVICE=alpha$mark
mount_fresh enc --poll 0.2 --encrypt --password-file "$PW"
A=$MNT
mount_device beta$mark --poll 0.2 --password-command "cat '$PW'"
B=$(mnt_of "beta$mark")
mkdir -p "$WORK/credentials"
cp "$PW" "$WORK/credentials/ubiquity-passphrase"
CREDENTIALS_DIRECTORY="$WORK/credentials" mount_device gamma$mark --poll 0.2 --download on-demand
C=$(mnt_of "gamma$mark")

step "FORMAT and keys/ are the only objects in the clear"
assert_eq "ubiquity-backing 6" "$(cat "$BACKING/FORMAT")" "FORMAT of an encrypted container"
assert_eq 1 "$(find "$BACKING/keys" -type f | wc -l)" "key files"
assert_contains "$(ubq status)" "encryption: aes-256-gcm" "ubiquity status"

step "files, names, xattrs and key-value entries sync between the three devices"
mkdir -p "$A/SecretDir$mark/inner$mark"
printf 'ContentMarker%s small\n' "$mark" >"$A/SecretDir$mark/secretname$mark.txt"
python3 -c "import sys; sys.stdout.write(''.join('BigMarker$mark line %08d\n' % i for i in range(120000)))" >"$WORK/big"
cp "$WORK/big" "$A/SecretDir$mark/inner$mark/big.txt"
setfattr -n "user.attrname$mark" -v "attrvalue$mark" "$A/SecretDir$mark/secretname$mark.txt"
ln -s "linktarget$mark" "$A/link$mark"
ubq kv set "kvkey$mark" "kvvalue$mark" --mount "$A" >/dev/null
for m in "$B" "$C"; do
  wait_content "$m/SecretDir$mark/secretname$mark.txt" "ContentMarker$mark small" "the small file on $m"
  wait_for "the big file on $m" cmp -s "$WORK/big" "$m/SecretDir$mark/inner$mark/big.txt"
  wait_eq "attrvalue$mark" "the xattr on $m" xattr "$m/SecretDir$mark/secretname$mark.txt" "user.attrname$mark"
  wait_eq "linktarget$mark" "the symlink on $m" readlink "$m/link$mark"
  wait_eq "kvvalue$mark" "kv on $m" bash -c "'$UBIQUITY' kv get kvkey$mark --mount '$m' 2>/dev/null || true"
done
printf 'from beta %s\n' "$mark" >"$B/beta.txt"
wait_content "$A/beta.txt" "from beta $mark" "beta.txt on alpha"
sync_all

# scan_for_plaintext DIR: fails if any file under DIR holds a marker of this scenario.
scan_for_plaintext() {
  local found
  found=$(grep -r -a -l -F -e "$mark" -e "ContentMarker" -e "BigMarker" -e "secretname" -e "SecretDir" \
    -e "attrvalue" -e "kvvalue" -e "linktarget" "$1" || true)
  [[ -z $found ]] || fail "plaintext in the backing store: $found"
  log "scanned $(find "$1" -type f | wc -l) objects ($(du -sb "$1" | cut -f1) bytes): no plaintext"
}

step "a scan of the whole backing directory finds no plaintext (checkpoints and fossil markers too)"
for v in 1 2 3 4 5 6; do
  head -c 5000 /dev/urandom >"$A/versions$mark.bin"
  sync_dev "$A"
done
sleep 1.1
ubq prune --keep-within 1s "$A" >/dev/null
ubq gc "$A" --grace 1s >/dev/null
[[ -n $(find "$BACKING/devices" -path '*/checkpoint-*/end') ]] || fail "no checkpoint after prune and gc"
[[ -n $(find "$BACKING/fossils" -type f 2>/dev/null) ]] || fail "no fossil marker after prune and gc"
sync_all
scan_for_plaintext "$BACKING"

step "a wrong passphrase, or none, exits 2 and mounts nothing"
mkdir -p "$WORK/delta/mnt" "$WORK/delta/store"
rc=0
out=$(timeout 60 "$UBIQUITY" mount "$WORK/delta/mnt" --store "$WORK/delta/store" --backing "$BACKING" --password-file "$BAD" 2>&1) || rc=$?
_ubq_record_from_status "$WORK/delta/mnt"
assert_eq 2 "$rc" "exit status with a wrong passphrase"
assert_contains "$out" "wrong passphrase" "the message of a wrong passphrase"
assert_not_contains "$out" "not it" "the message of a wrong passphrase"
! is_mounted "$WORK/delta/mnt" || fail "mounted with a wrong passphrase"
rc=0
out=$(setsid timeout 60 "$UBIQUITY" mount "$WORK/delta/mnt" --store "$WORK/delta/store" --backing "$BACKING" </dev/null 2>&1) || rc=$?
_ubq_record_from_status "$WORK/delta/mnt"
assert_eq 2 "$rc" "exit status without a passphrase"
assert_contains "$out" "needs its passphrase" "the message without a passphrase"
! is_mounted "$WORK/delta/mnt" || fail "mounted without a passphrase"
assert_not_contains "$(tr '\0' ' ' </proc/"$DAEMON_PID"/cmdline)" "first passphrase" "the daemon's command line"
assert_not_contains "$(cat "$STORE/daemon.log")" "first passphrase" "the daemon log"

step "a changed pack is never served, and is fetched again once whole"
big_c="$C/SecretDir$mark/inner$mark/big.txt"
ubq evict "$big_c" >/dev/null
assert_eq not-downloaded "$(xattr "$big_c" user.ubiquity.downloaded)" "big.txt on gamma after evict"
cp -a "$BACKING/packs" "$WORK/packs-whole"
python3 - "$BACKING/packs" <<'EOF'
import os, sys
for d, _, files in os.walk(sys.argv[1]):
    for f in files:
        p = os.path.join(d, f)
        data = bytearray(open(p, "rb").read())
        for at in range(100, len(data), 65536 + 29):  # a byte in every sealed block
            data[at] ^= 0x20
        open(p, "wb").write(data)
EOF
# O_DIRECT: past the kernel's page cache, which may still hold what was read before.
if dd if="$big_c" of=/dev/null bs=1M iflag=direct status=none 2>"$WORK/err"; then fail "big.txt on gamma was read from changed packs"; fi
assert_contains "$(cat "$WORK/err")" "Input/output error" "reading big.txt from changed packs"
wait_for "the log of gamma names the failed authentication" grep -q "failed authentication" "$(dirname "$(mnt_of "gamma$mark")")/store/daemon.log"
rm -rf "$BACKING/packs"
cp -a "$WORK/packs-whole" "$BACKING/packs"
wait_for "big.txt on gamma once the packs are whole" dd if="$big_c" of=/dev/null bs=1M iflag=direct status=none
assert_same_file "$WORK/big" "$big_c" "big.txt on gamma"

step "a segment replayed in place of a newer one holds back only its device's records"
pause_dev "$C"
printf 'one\n' >"$A/replay1.txt"
sync_dev "$A"
printf 'two\n' >"$A/replay2.txt"
sync_dev "$A"
alpha_id=$(sync_status "$A" device-id)
mapfile -t segs < <(backing_segments "$BACKING" "$alpha_id")
newest=${segs[-1]} older=${segs[-2]}
cp "$BACKING/log/$newest" "$WORK/newest-segment"
cp "$BACKING/log/$older" "$BACKING/log/$newest"
printf 'from beta %s again\n' "$mark" >"$B/beta2.txt"
sync_dev "$B"
resume_dev "$C"
sync_dev "$C"
wait_content "$C/beta2.txt" "from beta $mark again" "beta's new file on gamma (another device's records go on)"
wait_content "$C/replay1.txt" one "replay1.txt on gamma (before the replayed segment)"
[[ ! -e $C/replay2.txt ]] || fail "replay2.txt reached gamma from a replayed segment"
wait_for "gamma's log names the replayed segment" grep -q "$newest failed authentication" "$(dirname "$C")/store/daemon.log"
cp "$WORK/newest-segment" "$BACKING/log/$newest"
ubq sync "$C" >/dev/null
wait_content "$C/replay2.txt" two "replay2.txt on gamma once the segment is whole (fetched again)"

step "fsck --backing names a damaged object of every kind"
check=$(ubq fsck --backing "$BACKING" --backing-only --full --password-file "$PW")
assert_contains "$check" ": OK" "fsck of the whole container"
cp -a "$BACKING" "$WORK/damaged"
damaged=()
# The newest of each kind (fsck reads each device's newest checkpoint and key-value file).
for kind in 'packs/*/*' 'log/*' 'devices/*/checkpoint-*/0*' 'devices/*/checkpoint-*/end' 'devices/*/keyvalue-*' 'fossils/*'; do
  # shellcheck disable=SC2206
  files=($WORK/damaged/$kind)
  [[ -f ${files[-1]} ]] || fail "no object of kind $kind to damage"
  printf '\x5a' | dd of="${files[-1]}" bs=1 seek=20 conv=notrunc status=none
  damaged+=("${files[-1]#"$WORK/damaged/"}")
done
rc=0
check=$(timeout 60 "$UBIQUITY" fsck --backing "$WORK/damaged" --backing-only --full --password-file "$PW" 2>&1) || rc=$?
assert_eq 1 "$rc" "fsck exit status with damaged objects"
for key in "${damaged[@]}"; do assert_contains "$check" "$key failed authentication" "fsck of the damaged copy"; done

step "a FORMAT replaced by a plain one stops a device that knew the container encrypted"
unmount_device "beta$mark"
cp "$BACKING/FORMAT" "$WORK/FORMAT"
echo "ubiquity-backing 5" >"$BACKING/FORMAT"
rc=0
out=$(timeout 60 "$UBIQUITY" mount "$B" --store "$(dirname "$B")/store" --backing "$BACKING" --password-file "$PW" 2>&1) || rc=$?
_ubq_record_from_status "$B"
assert_ne 0 "$rc" "exit status of a mount after FORMAT was replaced"
assert_contains "$out" "was an encrypted container" "the message after FORMAT was replaced"
! is_mounted "$B" || fail "beta mounted a container whose FORMAT was replaced"
cp "$WORK/FORMAT" "$BACKING/FORMAT"
mount_device "beta$mark" --poll 0.2 --password-file "$PW"

step "passphrases added, changed and removed while every device stays mounted"
first_id=$(ubq key list --backing "$BACKING" --password-file "$PW" | sed -n 's/^\* \([0-9a-f]\{16\}\) .*/\1/p')
[[ -n $first_id ]] || fail "key list marks no key as the one opened"
ubq key add --backing "$BACKING" --password-file "$PW" --new-password-file "$PW2" >/dev/null
assert_eq 2 "$(ubq key list --backing "$BACKING" --password-file "$PW2" | wc -l)" "keys after key add"
rc=0
timeout 60 "$UBIQUITY" key remove "$first_id" --backing "$BACKING" --password-file "$PW" >/dev/null 2>&1 || rc=$?
assert_ne 0 "$rc" "removing the key the passphrase opened"
ubq key remove "$first_id" --backing "$BACKING" --password-file "$PW2" >/dev/null
assert_eq 1 "$(ubq key list --backing "$BACKING" --password-file "$PW2" | wc -l)" "keys after key remove"
rc=0
timeout 60 "$UBIQUITY" key list --backing "$BACKING" --password-file "$PW" >/dev/null 2>&1 || rc=$?
assert_eq 2 "$rc" "key list with the removed passphrase"
printf 'after rotation\n' >"$A/rotated.txt"
for m in "$B" "$C"; do wait_content "$m/rotated.txt" "after rotation" "rotated.txt on $m (mounted devices keep syncing)"; done
unmount_device "beta$mark"
rc=0
out=$(timeout 60 "$UBIQUITY" mount "$B" --store "$(dirname "$B")/store" --backing "$BACKING" --password-file "$PW" 2>&1) || rc=$?
_ubq_record_from_status "$B"
assert_eq 2 "$rc" "mounting with the removed passphrase"
mount_device "beta$mark" --poll 0.2 --password-file "$PW2"
wait_content "$B/rotated.txt" "after rotation" "rotated.txt on beta after its remount with the new passphrase"
ubq key passwd --backing "$BACKING" --password-file "$PW2" --new-password-file "$PW" >/dev/null
assert_eq 1 "$(ubq key list --backing "$BACKING" --password-file "$PW" | wc -l)" "keys after key passwd"

step "key add and key remove killed with -9 at random moments leave every key whole"
seed=$RANDOM
log "seed $seed"
RANDOM=$seed
printf 'third passphrase %s\n' "$mark" >"$WORK/pw3"
for i in 1 2 3 4 5 6; do
  # The real, tuned cost (about 0.5 s of scrypt) gives the kill something to interrupt.
  env -u UBQ_TEST_SCRYPT "$UBIQUITY" key add --backing "$BACKING" --password-file "$PW" --new-password-file "$WORK/pw3" >/dev/null 2>&1 &
  pid=$!
  sleep "0.$((RANDOM % 10))$((RANDOM % 10))"
  kill -9 "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  listing=$(ubq key list --backing "$BACKING" --password-file "$PW")
  assert_not_contains "$listing" "!" "key list after a killed key add ($i)"
  victim=$(sed -n 's/^  \([0-9a-f]\{16\}\) .*/\1/p' <<<"$listing" | head -n1)
  if [[ -n $victim ]]; then
    "$UBIQUITY" key remove "$victim" --backing "$BACKING" --password-file "$PW" >/dev/null 2>&1 &
    pid=$!
    sleep "0.0$((RANDOM % 10))"
    kill -9 "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  fi
  ubq key list --backing "$BACKING" --password-file "$PW" >/dev/null
done
for id in $(ubq key list --backing "$BACKING" --password-file "$PW" | grep -o '[0-9a-f]\{16\}'); do
  [[ $(wc -c <"$BACKING/keys/$id") -gt 100 ]] || fail "key file $id is cut short"
done
left=$(find "$BACKING/keys" -name '.tmp-*' | wc -l)
log "$(find "$BACKING/keys" -type f ! -name '.tmp-*' | wc -l) key files, $left temp files left by kills (never listed)"
printf 'after the kills\n' >"$A/kills.txt"
wait_content "$C/kills.txt" "after the kills" "kills.txt on gamma"
for d in "alpha$mark" "beta$mark" "gamma$mark"; do assert_daemon_alive "$d"; done

step "the same through the S3 server: three devices, and no plaintext in the bucket"
for d in "beta$mark" "gamma$mark"; do unmount_device "$d"; done
unmount_it
s3_backing enc
S3_BACKING=$UBQ_BACKING
DEVICE=s3alpha$mark
mount_fresh s3 --poll 0.2 --encrypt --password-file "$PW"
mount_device s3beta$mark --poll 0.2 --password-file "$PW"
SB=$(mnt_of "s3beta$mark")
mount_device s3gamma$mark --poll 0.2 --password-command "cat '$PW'" --download on-demand
SC=$(mnt_of "s3gamma$mark")
mkdir -p "$MNT/SecretDir$mark"
cp "$WORK/big" "$MNT/SecretDir$mark/big.txt"
printf 'ContentMarker%s on s3\n' "$mark" >"$MNT/SecretDir$mark/secretname$mark.txt"
ubq kv set "kvkey$mark" "kvvalue$mark" --mount "$MNT" >/dev/null
wait_for "big.txt through S3 on beta" cmp -s "$WORK/big" "$SB/SecretDir$mark/big.txt"
wait_content "$SB/SecretDir$mark/secretname$mark.txt" "ContentMarker$mark on s3" "the small file through S3"
wait_for "big.txt through S3 on gamma (on demand)" cmp -s "$WORK/big" "$SC/SecretDir$mark/big.txt"
printf 'back from beta\n' >"$SB/back.txt"
wait_content "$MNT/back.txt" "back from beta" "back.txt through S3 on alpha"
wait_content "$SC/back.txt" "back from beta" "back.txt through S3 on gamma"
sync_all
count=$(python3 "$(dirname "$0")/s3-dump.py" "$S3_BACKING" "$WORK/s3dump")
log "copied $count objects from the bucket"
((count >= 4)) || fail "only $count objects in the bucket"
scan_for_plaintext "$WORK/s3dump"
rc=0
out=$(timeout 60 "$UBIQUITY" mount "$WORK/delta/mnt" --store "$WORK/delta/s3store" --backing "$S3_BACKING" --password-file "$BAD" 2>&1) || rc=$?
_ubq_record_from_status "$WORK/delta/mnt"
assert_eq 2 "$rc" "exit status with a wrong passphrase (S3)"
check=$(ubq fsck --backing "$S3_BACKING" --backing-only --full --password-file "$PW")
assert_contains "$check" ": OK" "fsck of the encrypted bucket"
pass
