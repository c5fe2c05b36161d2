#!/usr/bin/env bash
# Files on demand through a backing directory (issue 24). alpha writes 10,000 files of
# 2 KiB (chunks in packs, not in records) and a few big ones; beta joins with
# `--download on-demand`: every file is listed and stat'ed with its size before any
# content comes (no pack read), `du` shows what is local and `du --apparent-size` the
# sizes; reading one file fetches only its bytes (requests and bytes counted from
# beta's status); a ranged read of a big file fetches around the range (partial);
# user.ubiquity.downloaded says not-downloaded / partial / current; a .tinypix shows
# its grid. The backing directory cut: a read fails with EIO after --fetch-timeout,
# `ls` still answers, the status says why, and the same read works once it is back.
# `ubiquity download` makes a directory local; `ubiquity evict` drops a file's local
# copies (also while a reader holds it open, which reads on right) and refuses a file
# open for writing, one not uploaded and a pinned one; a pinned file's new version comes
# by itself on demand; after unpin it can be evicted.
# SIGKILL while a big file is being fetched, and during an eviction: after the remount
# every file reads right and fsck finds no damage. gamma joins with the default (`--download all`): files show first,
# then every byte arrives in the background. delta joins with `--cache-size 6M`: the
# background download stops at the limit, a pinned file twice its size stays while the
# limit evicts the rest (a query watch hears "download" events, `ubiquity status` shows
# the limit), and once unpinned it goes before a file read after it.
# ubq-timeout: 420
set -euo pipefail
source "$(dirname "$0")/lib.sh"

DEVICE=alpha
mount_fresh ondemand --poll 0.2
A=$MNT
on_failure dump_sync_state

status_count() { xattr "$1" user.ubiquity.sync | sed -n "s/^backing-$2=//p"; }

step "alpha writes 10,000 files of 2 KiB, three big files and a picture"
python3 - "$A" <<'EOF'
import os, sys
root = sys.argv[1]
for d in range(100):
    os.makedirs(f"{root}/many/d{d:02}", exist_ok=True)
    for i in range(100):
        n = d * 100 + i
        with open(f"{root}/many/d{d:02}/f{n:05}.txt", "w") as f:
            f.write((f"file {n:05} " * 200)[:2048])
EOF
head -c $((3 << 20)) /dev/urandom >"$ROOT/one.bin"
head -c $((24 << 20)) /dev/urandom >"$ROOT/big.bin"
head -c $((12 << 20)) /dev/urandom >"$ROOT/kill.bin"
head -c $((1 << 20)) /dev/urandom >"$ROOT/two.bin"
head -c $((4 << 20)) /dev/urandom >"$ROOT/three.bin"
cp "$ROOT/one.bin" "$ROOT/big.bin" "$ROOT/kill.bin" "$ROOT/two.bin" "$ROOT/three.bin" "$A/"
printf '#.#.#.#.\n.#.#.#.#\n#.#.#.#.\n.#.#.#.#\n#.#.#.#.\n.#.#.#.#\n#.#.#.#.\n.#.#.#.#\n' >"$A/pic.tinypix"
ubq sync "$A" >/dev/null
assert_eq 0 "$(sync_status "$A" pending)" "records alpha has not uploaded"

step "beta joins on demand: all 10,000 files listed and stat'ed, no pack read"
mount_device beta --poll 0.2 --download on-demand --fetch-timeout 3
B=$(mnt_of beta)
wait_eq -t 60 10000 "files under many/ on beta" bash -c "find '$B/many' -type f | wc -l"
ubq sync "$B" >/dev/null
apparent=$(du -s --apparent-size --block-size=1 "$B/many" | cut -f1)
((apparent >= 10000 * 2048)) || fail "du --apparent-size of many/ on beta: $apparent bytes, expected at least 20,480,000"
disk=$(du -s --block-size=1 "$B/many" | cut -f1)
((disk < 1000000)) || fail "du of many/ on beta: $disk bytes on disk for content that is not here (expected almost nothing)"
assert_eq $((24 << 20)) "$(stat -c %s "$B/big.bin")" "size of big.bin on beta"
blocks=$(stat -c %b "$B/big.bin")
((blocks <= 2)) || fail "st_blocks of big.bin on beta: $blocks (not downloaded: at most a tail of 1 KiB that came in its record)"
assert_eq not-downloaded "$(xattr "$B/many/d42/f04242.txt" user.ubiquity.downloaded)" "downloaded state of f04242.txt"
assert_eq 0 "$(xattr "$B" user.ubiquity.sync | grep -c '^backing-bytes-down=[1-9][0-9]\{7,\}')" "no bulk download on beta"
gets0=$(status_count "$B" gets) down0=$(status_count "$B" bytes-down)

step "reading one file fetches only its bytes"
assert_eq "$(cat "$A/many/d42/f04242.txt")" "$(cat "$B/many/d42/f04242.txt")" "f04242.txt on beta"
gets1=$(status_count "$B" gets) down1=$(status_count "$B" bytes-down)
log "one 2 KiB file: $((gets1 - gets0)) GET(s), $((down1 - down0)) bytes"
((gets1 - gets0 <= 2)) || fail "reading one 2 KiB file made $((gets1 - gets0)) GETs"
((down1 - down0 <= 4096)) || fail "reading one 2 KiB file fetched $((down1 - down0)) bytes"
assert_eq current "$(xattr "$B/many/d42/f04242.txt" user.ubiquity.downloaded)" "downloaded state of f04242.txt after the read"
assert_same_file "$ROOT/one.bin" "$B/one.bin" "one.bin on beta"
assert_eq current "$(xattr "$B/one.bin" user.ubiquity.downloaded)" "downloaded state of one.bin after the read"

step "a ranged read of a big file fetches around the range, not the file"
down1=$(status_count "$B" bytes-down)
python3 - "$B/big.bin" "$ROOT/big.bin" <<'EOF'
import os, sys
fd, ref = os.open(sys.argv[1], os.O_RDONLY), open(sys.argv[2], "rb")
off = 10 << 20
ref.seek(off)
if os.pread(fd, 4096, off) != ref.read(4096):
    sys.exit("4 KiB at 10 MiB of big.bin read wrong")
EOF
down2=$(status_count "$B" bytes-down)
log "4 KiB of a 24 MiB file: $((down2 - down1)) bytes fetched"
((down2 - down1 <= 1 << 20)) || fail "a 4 KiB read of big.bin fetched $((down2 - down1)) bytes"
assert_eq partial "$(xattr "$B/big.bin" user.ubiquity.downloaded)" "downloaded state of big.bin after a ranged read"

step "a .tinypix not read before shows its grid"
assert_eq "$(cat "$A/pic.tinypix")" "$(cat "$B/pic.tinypix")" "pic.tinypix on beta"

step "the backing directory cut: EIO after the timeout, the mount answers, then it works again"
mv "$BACKING" "$BACKING.away"
python3 - "$B/many/d07/f00707.txt" <<'EOF'
import errno, os, sys, time
t = time.monotonic()
try:
    open(sys.argv[1], "rb").read()
    sys.exit("a read of content that is not here, with the backing directory gone, succeeded")
except OSError as e:
    if e.errno != errno.EIO:
        sys.exit(f"the read failed with {errno.errorcode[e.errno]}, not EIO")
took = time.monotonic() - t
if took > 8:
    sys.exit(f"the read failed after {took:.1f} s (fetch timeout 3 s)")
EOF
bounded 2 "ls of a directory while the backing directory is gone" ls "$B/many/d07" >/dev/null
state=$(xattr "$B/many/d07/f00707.txt" user.ubiquity.downloaded)
assert_contains "$state" "not-downloaded (last fetch failed: " "downloaded state while the backing directory is gone"
assert_daemon_alive beta
mv "$BACKING.away" "$BACKING"
assert_eq "$(cat "$A/many/d07/f00707.txt")" "$(cat "$B/many/d07/f00707.txt")" "f00707.txt on beta once the backing directory is back"

step "ubiquity download: a directory made local, the command returns when it is"
out=$(ubq download "$B/many/d01")
assert_contains "$out" "many/d01: 100 file(s)" "ubiquity download's summary"
for f in "$B"/many/d01/*; do
  [[ $(xattr "$f" user.ubiquity.downloaded) == current ]] || fail "$f is not current after ubiquity download"
done

step "ubiquity evict: local copies dropped, the file still listed and read again on demand"
assert_eq current "$(xattr "$B/one.bin" user.ubiquity.downloaded)" "one.bin before evict"
out=$(ubq evict "$B/one.bin")
assert_contains "$out" "evicted $B/one.bin" "ubiquity evict's report"
assert_eq not-downloaded "$(xattr "$B/one.bin" user.ubiquity.downloaded)" "one.bin after evict"
blocks=$(stat -c %b "$B/one.bin")
((blocks <= 2)) || fail "st_blocks of one.bin after evict: $blocks"
assert_same_file "$ROOT/one.bin" "$B/one.bin" "one.bin read again after evict"

step "an eviction gives its disk space back at once, though its pack holds other files' chunks"
# two.bin's 1 MiB, then three.bin's 4 MiB, fetched into beta's pack being written: the
# pack stays mostly live after two.bin goes (no compaction would rewrite it), so only
# holes give two.bin's space back.
assert_same_file "$ROOT/two.bin" "$B/two.bin" "two.bin on beta"
assert_same_file "$ROOT/three.bin" "$B/three.bin" "three.bin on beta"
packs_before=$(du -s --block-size=1 "$STORE_beta/chunks/packs" | cut -f1)
ubq evict "$B/two.bin" >/dev/null
packs_after=$(du -s --block-size=1 "$STORE_beta/chunks/packs" | cut -f1)
((packs_before - packs_after >= (1 << 20) * 9 / 10)) || fail "the packs' disk use went from $packs_before to $packs_after bytes after evicting two.bin: its 1 MiB not given back"
assert_same_file "$ROOT/three.bin" "$B/three.bin" "three.bin on beta after two.bin's holes"
assert_same_file "$ROOT/two.bin" "$B/two.bin" "two.bin read again after its eviction"

step "evict while a reader holds the file open: the reader reads on, right"
python3 - "$B/one.bin" "$ROOT/one.bin" "$UBIQUITY" <<'PYEOF'
import os, subprocess, sys
path, ref, ubq = sys.argv[1], open(sys.argv[2], "rb").read(), sys.argv[3]
fd = os.open(path, os.O_RDONLY)
head = os.read(fd, 1 << 20)
out = subprocess.run([ubq, "evict", path], capture_output=True, text=True)
if out.returncode != 0:
    sys.exit(f"evict of a file open for reading failed: {out.stdout} {out.stderr}")
rest = b""
while True:
    piece = os.read(fd, 1 << 20)
    if not piece:
        break
    rest += piece
if head + rest != ref:
    sys.exit("the reader read wrong bytes across the eviction")
PYEOF

step "evict refuses a file open for writing, one not uploaded, and a pinned one, and says why"
python3 - "$B/many/d01/f00100.txt" "$UBIQUITY" <<'PYEOF'
import os, subprocess, sys
path, ubq = sys.argv[1], sys.argv[2]
fd = os.open(path, os.O_RDWR)
os.pwrite(fd, b"X", 0)
out = subprocess.run([ubq, "evict", path], capture_output=True, text=True)
os.close(fd)
if out.returncode == 0 or "open for writing" not in out.stderr:
    sys.exit(f"evict of a file open for writing: exit {out.returncode}, [{out.stdout}] [{out.stderr}]")
PYEOF
pause_dev "$B"
head -c 5000 /dev/urandom >"$B/fresh.bin"
rc=0
err=$("$UBIQUITY" evict "$B/fresh.bin" 2>&1 >/dev/null) || rc=$?
assert_eq 1 "$rc" "exit status of evict of a file not uploaded"
assert_contains "$err" "not uploaded yet" "evict of a file not uploaded"
resume_dev "$B"
ubq pin "$B/big.bin" >/dev/null
assert_eq current "$(xattr "$B/big.bin" user.ubiquity.downloaded)" "big.bin after pin (downloaded)"
rc=0
err=$("$UBIQUITY" evict "$B/big.bin" 2>&1 >/dev/null) || rc=$?
assert_eq 1 "$rc" "exit status of evict of a pinned file"
assert_contains "$err" "pinned" "evict of a pinned file"

step "a pinned file's new version comes by itself, even on demand; unpin, then evict works"
head -c $((2 << 20)) /dev/urandom >"$ROOT/big2.bin"
cp "$ROOT/big2.bin" "$A/big.bin"
wait_eq -t 30 $((2 << 20)) "size of alpha's new big.bin on beta" stat -c %s "$B/big.bin"
wait_eq -t 30 current "the new version of pinned big.bin downloaded on beta" xattr "$B/big.bin" user.ubiquity.downloaded
assert_same_file "$ROOT/big2.bin" "$B/big.bin" "big.bin's new version on beta"
ubq unpin "$B/big.bin" >/dev/null
ubq evict "$B/big.bin" >/dev/null
assert_eq not-downloaded "$(xattr "$B/big.bin" user.ubiquity.downloaded)" "big.bin after unpin and evict"

step "SIGKILL while a big file is being fetched; after the remount it reads right"
cat "$B/kill.bin" >/dev/null 2>&1 &
reader=$!
sleep 0.05
kill -9 "$(pid_of beta)"
wait "$reader" 2>/dev/null || true
for i in $(seq 100); do _process_alive "$(pid_of beta)" || break; sleep 0.1; done
! _process_alive "$(pid_of beta)" || fail "beta's daemon still alive 10 s after SIGKILL"
mount_device beta
assert_same_file "$ROOT/kill.bin" "$B/kill.bin" "kill.bin on beta after SIGKILL during its fetch"
out=$("$UBIQUITY" fsck --store "$STORE_beta" 2>&1) || fail "fsck of beta's store after SIGKILL: $out"
assert_contains "$out" "not local:" "fsck of beta's store (what was never fetched is not local, not damage)"

step "SIGKILL during an eviction: after the remount every file reads right, fsck finds no damage"
ubq download "$B/many/d02" "$B/many/d03" "$B/many/d04" >/dev/null
"$UBIQUITY" evict "$B/many" >/dev/null 2>&1 &
evictor=$!
sleep 0.2
kill -9 "$(pid_of beta)"
wait "$evictor" 2>/dev/null || true
# A daemon killed in the middle of an eviction's disk work may take a while to exit (its
# threads finish the system calls they are in); its mount is dead only once it has.
for i in $(seq 300); do _process_alive "$(pid_of beta)" || break; sleep 0.1; done
! _process_alive "$(pid_of beta)" || fail "beta's daemon still alive 30 s after SIGKILL during an eviction: $(ps -o stat=,wchan= -L -p "$(pid_of beta)" | sort | uniq -c | tr '\n' ';')"
mount_device beta
for d in d01 d02 d03 d04; do
  for f in "$A/many/$d"/*; do
    cmp -s "$f" "$B/many/$d/${f##*/}" || fail "many/$d/${f##*/} on beta after SIGKILL during an eviction"
  done
done
out=$("$UBIQUITY" fsck --store "$STORE_beta" 2>&1) || fail "fsck of beta's store after SIGKILL during an eviction: $out"

step "gamma joins with the default (--download all): files first, then every byte"
mount_device gamma --poll 0.2
C=$(mnt_of gamma)
wait_eq -t 60 10000 "files under many/ on gamma" bash -c "find '$C/many' -type f | wc -l"
wait_eq -t 60 current "downloaded state of big.bin on gamma" xattr "$C/big.bin" user.ubiquity.downloaded
wait_eq -t 60 current "downloaded state of the last small file on gamma" xattr "$C/many/d99/f09999.txt" user.ubiquity.downloaded
gets=$(status_count "$C" gets)
log "gamma downloaded everything with $gets GETs"
assert_same_file "$ROOT/big2.bin" "$C/big.bin" "big.bin (its second version) on gamma"
assert_eq "$(cat "$A/many/d00/f00001.txt")" "$(cat "$C/many/d00/f00001.txt")" "f00001.txt on gamma"

step "a cache limit: delta downloads up to --cache-size, a pin survives cache pressure, reads evict the least recently used"
mount_device delta --poll 0.2 --cache-size 6M
D=$(mnt_of delta)
here_bytes() { du -s --block-size=1 "$D" | cut -f1; }
wait_eq -t 60 10000 "files under many/ on delta" bash -c "find '$D/many' -type f | wc -l"
wait_for -t 60 "delta's background download reaching its cache limit" bash -c "(( \$(du -s --block-size=1 '$D' | cut -f1) >= 5800000 ))"
sleep 3
here=$(here_bytes)
((here <= 7000000)) || fail "delta downloaded past its 6 MiB cache limit: $here bytes here"
assert_contains "$(ubq status)" "cache-size 6.0 MiB" "ubiquity status shows the cache limit"
watch_out="$ROOT/delta-watch.out"
"$UBIQUITY" query --mount "$D" --watch --json >"$watch_out" 2>&1 &
watcher=$!
on_exit kill "$watcher"
wait_eq yes "delta's watch's gathered line" json_has "$watch_out" '{"event":"gathered"}'
# kill.bin (12 MiB) pinned: twice the limit. The cache limit evicts everything else it
# may (within one maintenance pass, 10 s), never the pinned file.
ubq pin "$D/kill.bin" >/dev/null
assert_eq current "$(xattr "$D/kill.bin" user.ubiquity.downloaded)" "pinned kill.bin on delta"
wait_for -t 30 "delta's cache limit evicting all but the pinned file" bash -c "(( \$(du -s --block-size=1 '$D' | cut -f1) <= 13500000 ))"
assert_eq current "$(xattr "$D/kill.bin" user.ubiquity.downloaded)" "pinned kill.bin on delta under cache pressure"
assert_eq not-downloaded "$(xattr "$D/many/d00/f00001.txt" user.ubiquity.downloaded)" "a small file evicted by the cache limit"
wait_eq yes "a download event in delta's watch" json_has "$watch_out" '{"event":"download"}'
assert_same_file "$ROOT/kill.bin" "$D/kill.bin" "pinned kill.bin on delta"
# Unpinned, it is the least recently used: a read of one.bin (3 MiB) stays, kill.bin goes.
ubq unpin "$D/kill.bin" >/dev/null
assert_same_file "$ROOT/one.bin" "$D/one.bin" "one.bin read on delta"
wait_for -t 30 "delta back under its cache limit once kill.bin is unpinned" bash -c "(( \$(du -s --block-size=1 '$D' | cut -f1) <= 6400000 ))"
assert_eq not-downloaded "$(xattr "$D/kill.bin" user.ubiquity.downloaded)" "kill.bin on delta after unpin"
assert_eq current "$(xattr "$D/one.bin" user.ubiquity.downloaded)" "one.bin (read last) on delta"
assert_same_file "$ROOT/kill.bin" "$D/kill.bin" "kill.bin read again on delta"
kill "$watcher" 2>/dev/null || true

pass
