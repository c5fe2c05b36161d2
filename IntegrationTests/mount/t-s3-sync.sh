#!/usr/bin/env bash
# Three devices (alpha, beta, gamma) syncing through the loopback S3 server
# (`--backing s3://BUCKET/PREFIX`, credentials and endpoint from AWS_* in the
# environment; scripts/test.sh starts the server): files of every size, edits, renames,
# deletes, a directory tree; a conflict made on two devices, seen and resolved the same
# on all three; the key-value store; gc across devices (`ubiquity gc`, fossil markers);
# `ubiquity status` shows the backing URL and request counts and never a secret; no
# secret in the daemon's command line or log; a device that joins a container of 10,000
# files sees all of them, with a handful of requests; `fsck --backing` finds the bucket
# whole; a wrong secret fails the mount at once. Fails (does not skip) without a server.
# ubq-timeout: 300
set -euo pipefail
source "$(dirname "$0")/lib.sh"

s3_backing sync
DEVICE=alpha
mount_fresh s3sync --poll 0.2
A=$MNT
mount_device beta --poll 0.2
B=$(mnt_of beta)
mount_device gamma --poll 0.2
C=$(mnt_of gamma)
on_failure dump_sync_state

# backing_count MNT KIND: a count from the device's status (requests, puts, gets, lists).
backing_count() { xattr "$1" user.ubiquity.sync | sed -n "s/^backing-$2=//p"; }

# kv_value MNT KEY: the key's value on that device ("" if none).
kv_value() { "$UBIQUITY" kv get "$2" --mount "$1" 2>/dev/null || true; }

step "a file written on alpha appears on beta and gamma, with no command"
echo hello >"$A/hello.txt"
wait_content "$B/hello.txt" hello "hello.txt on beta"
wait_content "$C/hello.txt" hello "hello.txt on gamma"
assert_eq alpha "$(xattr "$C/hello.txt" user.ubiquity.device)" "user.ubiquity.device of hello.txt on gamma"

step "sizes from empty to several chunks in packs, verified byte for byte on every device"
mkdir -p "$A/sizes"
: >"$A/sizes/empty"
head -c 1000 /dev/urandom >"$A/sizes/inline-1000"
head -c 5000 /dev/urandom >"$A/sizes/small-5000"
head -c 3000000 /dev/urandom >"$A/sizes/big-3M"
head -c 20000000 /dev/urandom >"$A/sizes/big-20M"
for f in empty inline-1000 small-5000 big-3M big-20M; do
  wait_for "sizes/$f on beta" cmp -s "$A/sizes/$f" "$B/sizes/$f"
  wait_for "sizes/$f on gamma" cmp -s "$A/sizes/$f" "$C/sizes/$f"
done

step "edits, renames of files and directories, deletes, from any device"
echo "beta edit" >"$B/hello.txt"
mkdir -p "$C/tree/a/b"
echo deep >"$C/tree/a/b/deep.txt"
wait_content "$A/tree/a/b/deep.txt" deep "deep.txt from gamma on alpha"
mv "$A/tree/a" "$A/tree/moved"
mv "$B/sizes/small-5000" "$B/sizes/renamed-5000"
rm "$C/sizes/inline-1000"
for m in "$A" "$B" "$C"; do
  wait_content "$m/hello.txt" "beta edit" "hello.txt on $m"
  wait_content "$m/tree/moved/b/deep.txt" deep "tree/moved/b/deep.txt on $m"
  wait_missing "$m/tree/a" "tree/a on $m"
  wait_missing "$m/sizes/inline-1000" "sizes/inline-1000 on $m"
  wait_for "sizes/renamed-5000 on $m" cmp -s "$A/sizes/renamed-5000" "$m/sizes/renamed-5000"
done
wait_same_tree "$A" "$B" "trees of alpha and beta"
wait_same_tree "$A" "$C" "trees of alpha and gamma"

step "a conflict: alpha and beta edit one file while beta is paused; all three agree"
echo base >"$A/doc.txt"
wait_content "$B/doc.txt" base "doc.txt on beta"
wait_content "$C/doc.txt" base "doc.txt on gamma"
pause_dev "$B"
echo "alpha's words" >"$A/doc.txt"
sync_dev "$A"
sleep 1.1
echo "beta's words" >"$B/doc.txt"
resume_dev "$B"
sync_all
sync_all
for m in "$A" "$B" "$C"; do
  wait_content "$m/doc.txt" "beta's words" "doc.txt on $m (the later mtime wins)"
  wait_eq 1 "conflicts of doc.txt on $m" conflict_count "$m" doc.txt
done
assert_eq "$(conflict_names "$A" doc.txt)" "$(conflict_names "$C" doc.txt)" "conflict names, alpha vs gamma"
rm "$C/.conflicts/doc.txt/$(conflict_names "$C" doc.txt)"
for m in "$A" "$B" "$C"; do wait_eq 0 "conflicts of doc.txt on $m after gamma resolved" conflict_count "$m" doc.txt; done

step "the key-value store through S3"
ubq kv set colour blue --mount "$A" >/dev/null
wait_eq blue "kv colour on gamma" kv_value "$C" colour
ubq kv set colour green --mount "$C" >/dev/null
wait_eq green "kv colour on alpha" kv_value "$A" colour
wait_eq green "kv colour on beta" kv_value "$B" colour

step "status: the backing URL, requests and bytes, no secret"
status=$(ubq status "$A")
assert_contains "$status" "backing=$BACKING" "ubiquity status"
assert_contains "$status" "backing-requests=" "ubiquity status"
assert_not_contains "$status" "$AWS_SECRET_ACCESS_KEY" "ubiquity status"
assert_not_contains "$(tr '\0' ' ' </proc/"$DAEMON_PID"/cmdline)" "$AWS_SECRET_ACCESS_KEY" "the daemon's command line"
assert_not_contains "$(cat "$STORE/daemon.log")" "$AWS_SECRET_ACCESS_KEY" "the daemon log"

step "gc across devices (checkpoints, the collector through S3): nothing live is lost"
rm "$A/sizes/big-20M"
sync_all
for m in "$A" "$B"; do
  gc_out=$(ubq gc "$m" --grace 1s)
  assert_contains "$gc_out" "backing store: " "ubiquity gc on $m"
done
for m in "$A" "$B" "$C"; do
  wait_for "big-3M still whole on $m" cmp -s "$A/sizes/big-3M" "$m/sizes/big-3M"
done

step "a fourth device joins a container of 10,000 small files on demand: all there, few requests"
sync_dev "$A"
puts_before=$(backing_count "$A" puts)
# Written while alpha is paused, so what is measured is the upload of 10,000 pending
# records (full segments), not how the writer's pace met the push's burst detection.
pause_dev "$A"
mkdir "$A/many"
python3 - "$A/many" <<'EOF'
import os, sys
d = sys.argv[1]
for i in range(10000):
    sub = os.path.join(d, "d%02d" % (i % 50))
    os.makedirs(sub, exist_ok=True)
    with open(os.path.join(sub, "f%05d" % i), "w") as f:
        f.write("file %d\n" % i)
EOF
resume_dev "$A"
sync_dev "$A"
puts=$(($(backing_count "$A" puts) - puts_before))
log "alpha uploaded 10,000 new files of 10 bytes with $puts PUTs"
((puts <= 15)) || fail "alpha made $puts PUTs for 10,000 small files (at most 15 expected: a segment holds 1,000 records)"
start=$EPOCHREALTIME
mount_device delta --poll 0.2 --download on-demand
D=$(mnt_of delta)
sync_dev "$D"
wait_eq 10000 "files under many/ on delta" bash -c "find '$D/many' -type f | wc -l"
assert_eq "file 9999" "$(cat "$D/many/d49/f09999")" "many/d49/f09999 on delta"
requests=$(backing_count "$D" requests)
log "delta joined (all 10,000 files listed) in $(awk -v a="$start" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }') s with $requests requests"
((requests < 200)) || fail "delta made $requests requests to join 10,000 files (expected a few dozen)"
for d in alpha beta gamma delta; do assert_daemon_alive "$d"; done

step "on demand through S3: sizes first, a ranged read fetches around its range, a whole read the rest"
assert_eq 3000000 "$(stat -c %s "$D/sizes/big-3M")" "size of sizes/big-3M on delta"
blocks=$(stat -c %b "$D/sizes/big-3M")
((blocks <= 2)) || fail "st_blocks of sizes/big-3M on delta: $blocks (not downloaded: at most a tail of 1 KiB that came in its record)"
assert_eq not-downloaded "$(xattr "$D/sizes/big-3M" user.ubiquity.downloaded)" "downloaded state of big-3M on delta"
down0=$(backing_count "$D" bytes-down)
python3 - "$D/sizes/big-3M" "$A/sizes/big-3M" <<'EOF2'
import os, sys
fd, ref = os.open(sys.argv[1], os.O_RDONLY), open(sys.argv[2], "rb")
ref.seek(1 << 20)
if os.pread(fd, 4096, 1 << 20) != ref.read(4096):
    sys.exit("4 KiB at 1 MiB of big-3M read wrong on delta")
EOF2
down1=$(backing_count "$D" bytes-down)
log "4 KiB of a 3 MB file through S3: $((down1 - down0)) bytes fetched"
((down1 - down0 <= 1 << 20)) || fail "a 4 KiB read of big-3M fetched $((down1 - down0)) bytes"
assert_eq partial "$(xattr "$D/sizes/big-3M" user.ubiquity.downloaded)" "downloaded state of big-3M after a ranged read"
assert_same_file "$A/sizes/big-3M" "$D/sizes/big-3M" "sizes/big-3M read whole on delta"
assert_eq current "$(xattr "$D/sizes/big-3M" user.ubiquity.downloaded)" "downloaded state of big-3M after the whole read"
down2=$(backing_count "$D" bytes-down)
log "the whole 3 MB file through S3: $((down2 - down0)) bytes fetched in all"
((down2 - down0 <= 3600000)) || fail "reading big-3M on delta (and its polls of the log) fetched $((down2 - down0)) bytes"

step "fsck --backing checks the bucket: packs, segments, checkpoints, every chunk place"
check=$(ubq fsck --backing "$BACKING" --backing-only --full)
assert_contains "$check" ": OK" "ubiquity fsck --backing $BACKING --backing-only --full"

step "a wrong secret fails the mount at once, says what to fix, shows no secret, mounts nothing"
mkdir -p "${TEST_PREFIX}wrong/mnt" "${TEST_PREFIX}wrong/store"
rc=0
out=$(AWS_SECRET_ACCESS_KEY=not-the-secret-$$ timeout 60 "$UBIQUITY" mount "${TEST_PREFIX}wrong/mnt" \
  --store "${TEST_PREFIX}wrong/store" --backing "$BACKING" 2>&1) || rc=$?
_ubq_record_from_status "${TEST_PREFIX}wrong/mnt"
assert_ne 0 "$rc" "exit status of a mount with a wrong secret"
assert_contains "$out" "SignatureDoesNotMatch" "the error of a mount with a wrong secret"
assert_not_contains "$out" "not-the-secret-$$" "the error of a mount with a wrong secret"
is_mounted "${TEST_PREFIX}wrong/mnt" && fail "a mount with a wrong secret is mounted"
pass
