#!/usr/bin/env bash
# Two devices (alpha, beta) on one backing directory, polling every 0.2 s: what one
# saves shows up on the other with no command: files (new, edited, empty, several
# chunks, odd names), nested and empty directories, renames of files and directories,
# an editor-style save over a file, deletes, modes, mtimes, symlinks, user xattrs. An
# edit of a file received from the other device is no conflict. Local-only files stay
# home. pause/resume stop and restart syncing; user.ubiquity.uploaded is 1 once pushed;
# `ubiquity sync` pushes and pulls at once (checked on a third device that does not
# poll); a device that was unmounted catches up when mounted again; the backing
# directory follows docs/FORMAT.md, backing format 5 (every segment's lines check, each
# device's segments are contiguous, every chunk's place in a pack holds its bytes).
# A check right after `ubiquity sync` returns does not wait: by then the daemon has
# applied what it pulled and invalidated the kernel's caches of it (DESIGN 1.3).
# ubq-timeout: 180
set -euo pipefail
source "$(dirname "$0")/lib.sh"

DEVICE=alpha
mount_fresh sync --poll 0.2
A=$MNT
mount_device beta --poll 0.2
B=$(mnt_of beta)
on_failure dump_sync_state

# xattr_hex FILE NAME: the value of an xattr as 0x... ("" when absent).
xattr_hex() {
  getfattr --absolute-names -e hex -n "$2" -- "$1" 2>/dev/null | sed -n "s/^$2=//p"
}

step "a file written on alpha appears on beta, with no command"
echo hello >"$A/hello.txt"
wait_content "$B/hello.txt" hello "hello.txt on beta"
assert_eq alpha "$(xattr "$B/hello.txt" user.ubiquity.device)" "user.ubiquity.device of hello.txt on beta"
assert_eq "$(xattr "$A/hello.txt" user.ubiquity.version)" "$(xattr "$B/hello.txt" user.ubiquity.version)" \
  "user.ubiquity.version of hello.txt, beta vs alpha (one id on every device)"

step "and one written on beta appears on alpha"
echo from-beta >"$B/from-beta.txt"
wait_content "$A/from-beta.txt" from-beta "from-beta.txt on alpha"
assert_eq beta "$(xattr "$A/from-beta.txt" user.ubiquity.device)" "user.ubiquity.device of from-beta.txt on alpha"

step "an edit reaches beta, which had the old content cached; both list the same history"
cat "$B/hello.txt" >/dev/null
echo "hello again" >"$A/hello.txt"
wait_content "$B/hello.txt" "hello again" "hello.txt on beta after alpha's edit"
wait_eq 2 "versions of hello.txt on beta" version_count_at "$B" hello.txt
assert_eq "$(version_names_at "$A" hello.txt)" "$(version_names_at "$B" hello.txt)" \
  "version names of hello.txt, alpha vs beta"

step "beta edits what it received from alpha: a plain new version, no conflict"
echo "beta continues" >"$B/hello.txt"
wait_content "$A/hello.txt" "beta continues" "hello.txt on alpha after beta's edit"
wait_eq 3 "versions of hello.txt on alpha" version_count_at "$A" hello.txt
for m in "$A" "$B"; do
  assert_eq 0 "$(xattr "$m/hello.txt" user.ubiquity.conflicts)" "user.ubiquity.conflicts of hello.txt on $m"
  assert_eq 0 "$(conflict_count "$m" hello.txt)" "entries in $m/.conflicts/hello.txt/"
done
assert_eq "$(version_names_at "$A" hello.txt)" "$(version_names_at "$B" hello.txt)" \
  "version names of hello.txt after beta's edit, alpha vs beta"

step "nested directories, an empty directory, an empty file, odd names"
mkdir -p "$A/d1/d2/d3" "$A/empty-dir"
echo deep >"$A/d1/d2/d3/deep.txt"
: >"$A/d1/empty.txt"
printf 'no final newline' >"$A/d1/nonl.txt"
echo odd >"$A/d1/a b%20=c,d:e+f.txt"
echo accents >"$A/d1/café-ü-日本.txt"
wait_content "$B/d1/d2/d3/deep.txt" deep "d1/d2/d3/deep.txt on beta"
wait_content "$B/d1/a b%20=c,d:e+f.txt" odd "a name with a space, %, =, comma, colon, + on beta"
wait_content "$B/d1/café-ü-日本.txt" accents "a UTF-8 name on beta"
wait_exists "$B/d1/empty.txt" "an empty file on beta"
assert_eq 0 "$(stat -c %s "$B/d1/empty.txt")" "size of d1/empty.txt on beta"
wait_for "empty-dir on beta is a directory" test -d "$B/empty-dir"
wait_same_tree "$A" "$B" "trees after the nested directories"

step "a sparse 1 PiB file with a byte at its end and a name that is not UTF-8 travel as holes"
truncate -s 1P "$A/d1/sparse.img"
printf 'end' >>"$A/d1/sparse.img"
odd_name=$(printf 'bytes-\xff\xfe.bin')
echo not-utf8 >"$A/d1/$odd_name"
size_of() { stat -c %s -- "$1" 2>/dev/null || echo missing; }
wait_eq 1125899906842627 "size of d1/sparse.img on beta" size_of "$B/d1/sparse.img"
assert_eq end "$(tail -c 3 "$B/d1/sparse.img")" "the last bytes of the sparse file on beta"
assert_eq 0 "$(head -c 4096 "$B/d1/sparse.img" | tr -d '\0' | wc -c)" "the first 4 KiB of the sparse file on beta are zeros"
assert_eq 1 "$(stat -c %b "$B/d1/sparse.img")" "512-byte blocks of the sparse file on beta"
wait_content "$B/d1/$odd_name" not-utf8 "a file whose name is not UTF-8, on beta"
assert_contains "$(cat "$BACKING"/log/*)" "chunks=hole:1125899906842624," "a hole record in a segment of the log"
# The tree comparisons below read whole files: the petabyte goes (its deletion syncs too).
rm "$A/d1/sparse.img"
wait_missing "$B/d1/sparse.img" "d1/sparse.img on beta after alpha deleted it"

step "a 3 MiB file (several chunks), then a one-byte edit in its middle"
head -c 3M /dev/urandom >"$WORK/big.bin"
cp "$WORK/big.bin" "$A/d1/big.bin"
wait_for "d1/big.bin on beta equals the original" cmp -- "$WORK/big.bin" "$B/d1/big.bin"
printf X | dd of="$WORK/big.bin" bs=1 seek=1500000 conv=notrunc status=none
printf X | dd of="$A/d1/big.bin" bs=1 seek=1500000 conv=notrunc status=none
wait_for "d1/big.bin on beta after the one-byte edit" cmp -- "$WORK/big.bin" "$B/d1/big.bin"

step "renames: a file, a directory tree on alpha, a subtree on beta"
mv "$A/hello.txt" "$A/d1/renamed.txt"
wait_missing "$B/hello.txt" "hello.txt on beta after the rename"
wait_content "$B/d1/renamed.txt" "beta continues" "d1/renamed.txt on beta"
assert_eq 3 "$(version_count_at "$B" d1/renamed.txt)" "history of d1/renamed.txt on beta (follows the rename)"
mv "$A/d1" "$A/top"
# Right away, before the background has settled the move: .versions/ shows the history
# at the new path only (a read of .versions/ settles what the move left).
assert_eq 3 "$(version_count_at "$A" top/renamed.txt)" "history of top/renamed.txt on alpha right after the directory's move"
assert_eq 0 "$(version_count_at "$A" d1/renamed.txt)" "history left at d1/renamed.txt on alpha after the directory's move"
wait_missing "$B/d1" "d1 on beta after renaming it to top"
wait_content "$B/top/d2/d3/deep.txt" deep "top/d2/d3/deep.txt on beta"
wait_same_tree "$A" "$B" "trees after renaming d1 to top"
mv "$B/top/d2" "$B/moved-d2"
wait_missing "$A/top/d2" "top/d2 on alpha after beta moved it"
wait_content "$A/moved-d2/d3/deep.txt" deep "moved-d2/d3/deep.txt on alpha"

step "an editor-style save (temp file renamed over the target) continues the history"
echo "saved by an editor" >"$A/top/.renamed.txt.tmp"
mv "$A/top/.renamed.txt.tmp" "$A/top/renamed.txt"
wait_content "$B/top/renamed.txt" "saved by an editor" "top/renamed.txt on beta after the atomic save"
wait_eq 4 "versions of top/renamed.txt on beta" version_count_at "$B" top/renamed.txt
wait_missing "$B/top/.renamed.txt.tmp" "the editor's temp file on beta"

step "deletes: a file, a directory tree (from beta), an empty directory"
rm "$A/from-beta.txt"
wait_missing "$B/from-beta.txt" "from-beta.txt on beta after alpha deleted it"
assert_ne 0 "$(version_count_at "$B" from-beta.txt)" "versions of the deleted from-beta.txt kept on beta"
rm -r "$B/moved-d2"
wait_missing "$A/moved-d2" "moved-d2 on alpha after beta deleted it"
rmdir "$A/empty-dir"
wait_missing "$B/empty-dir" "empty-dir on beta after alpha removed it"

step "modes, mtimes, symlinks and user xattrs"
f=top/renamed.txt
chmod 750 "$A/$f"
wait_eq 750 "mode of $f on beta" stat -c %a "$B/$f"
touch -d '2001-02-03 04:05:06.789012345' "$A/$f"
wait_eq "2001-02-03 04:05:06.789012345 +0000" "mtime of $f on beta" stat -c %y "$B/$f"
mkdir "$A/private"
chmod 700 "$A/private"
wait_eq 700 "mode of the directory private on beta" stat -c %a "$B/private"
ln -s ../some/where "$A/top/dangling"
ln -s renamed.txt "$A/top/rel-link"
wait_eq ../some/where "target of the symlink top/dangling on beta" readlink "$B/top/dangling"
wait_content "$B/top/rel-link" "saved by an editor" "reading through the symlink top/rel-link on beta"
setfattr -n user.color -v red "$A/$f"
wait_eq red "user.color of $f on beta" xattr "$B/$f" user.color
setfattr -n user.bin -v 0x00ff0a "$A/$f"
wait_eq 0x00ff0a "user.bin (binary value) of $f on beta" xattr_hex "$B/$f" user.bin
# Directories' xattrs are not synced (README, "Sync and conflicts").
wait_same_tree "$A" "$B" "trees after the metadata changes"
step "... and their changes: xattr removed, symlink deleted and retargeted, mode again"
setfattr -x user.color "$A/$f"
rm "$A/top/dangling"
ln -sfn empty.txt "$A/top/rel-link"
chmod 604 "$A/$f"
wait_missing "$B/top/dangling" "the deleted symlink on beta"
wait_eq empty.txt "target of top/rel-link on beta after ln -sfn" readlink "$B/top/rel-link"
wait_eq 604 "mode of $f on beta after the second chmod" stat -c %a "$B/$f"
wait_same_tree "$A" "$B" "trees after removing an xattr, a symlink, changing a mode"
assert_eq "" "$(xattr "$B/$f" user.color)" "user.color on beta after setfattr -x on alpha"
assert_eq "2001-02-03 04:05:06.789012345 +0000" "$(stat -c %y "$B/$f")" "mtime of $f on beta after chmod (unchanged)"

step "local-only files stay on the device that made them"
echo scratch >"$A/top/x.swp"
mkdir "$A/priv.nosync"
echo secret >"$A/priv.nosync/secret.txt"
echo marker >"$A/marker.txt"
sync_dev "$A" "$B"
wait_content "$B/marker.txt" marker "marker.txt on beta (saved after the local-only files)"
assert_missing "$B/top/x.swp" "a local-only *.swp file on beta"
assert_missing "$B/priv.nosync" "a *.nosync directory on beta"
assert_eq "" "$(grep -rlF -e priv.nosync -e x.swp "$BACKING/log" "$BACKING/devices" || true)" \
  "segments or checkpoints naming a local-only path"
rm -r "$A/top/x.swp" "$A/priv.nosync"

step "a paused device neither sends nor receives; after resume it catches up"
pause_dev "$B"
echo while-paused >"$A/while-paused.txt"
echo beta-paused >"$B/beta-paused.txt"
sync_dev "$A"
# A negative check needs a wait: 1.5 s is 7 poll periods of beta.
sleep 1.5
assert_missing "$B/while-paused.txt" "alpha's new file on paused beta"
assert_missing "$A/beta-paused.txt" "paused beta's new file on alpha"
assert_eq paused "$(sync_status "$B" state)" "state in user.ubiquity.sync of paused beta"
assert_eq 0 "$(xattr "$B/beta-paused.txt" user.ubiquity.uploaded)" "user.ubiquity.uploaded of a file saved while paused"
assert_eq 1 "$(xattr "$A/while-paused.txt" user.ubiquity.uploaded)" "user.ubiquity.uploaded on alpha after ubiquity sync"
resume_dev "$B"
sync_dev "$B"
assert_eq syncing "$(sync_status "$B" state)" "state in user.ubiquity.sync of beta after resume"
assert_eq 1 "$(xattr "$B/beta-paused.txt" user.ubiquity.uploaded)" "user.ubiquity.uploaded after resume and ubiquity sync"
wait_content "$B/while-paused.txt" while-paused "alpha's file on beta after resume"
wait_content "$A/beta-paused.txt" beta-paused "beta's file on alpha after beta resumed"

step "ubiquity sync pushes and pulls at once (gamma does not poll: --poll 3600)"
sync_all
mount_device gamma --poll 3600
C=$(mnt_of gamma)
sync_dev "$C"
assert_same_tree "$A" "$C" "gamma right after its first ubiquity sync"
# gamma looks the name up first: a cached negative lookup must not hide the new file.
assert_missing "$C/via-sync.txt" "via-sync.txt on gamma before alpha made it"
echo via-sync >"$A/via-sync.txt"
sync_dev "$A" "$C"
assert_file_content "$C/via-sync.txt" via-sync "via-sync.txt on gamma right after ubiquity sync of alpha, then gamma"
echo from-gamma >"$C/from-gamma.txt"
rm "$C/marker.txt"
sync_dev "$C" "$A"
assert_file_content "$A/from-gamma.txt" from-gamma "from-gamma.txt on alpha right after ubiquity sync of gamma, then alpha"
assert_missing "$A/marker.txt" "marker.txt on alpha right after gamma deleted it and both synced"

step "a device that was unmounted catches up when mounted again"
unmount_device beta
echo while-beta-down >"$A/while-down.txt"
mv "$A/via-sync.txt" "$A/top/via-sync.txt"
sync_dev "$A"
mount_device beta
wait_content "$B/while-down.txt" while-beta-down "while-down.txt on beta after its remount"
wait_same_tree "$A" "$B" "trees after beta's remount"

step "all three devices agree"
sync_all
assert_same_tree "$A" "$B" "alpha vs beta after sync_all"
assert_same_tree "$A" "$C" "alpha vs gamma after sync_all"
for n in alpha beta gamma; do assert_daemon_alive "$n"; done

step "the backing directory follows docs/FORMAT.md"
assert_eq "ubiquity-backing 5" "$(cat "$BACKING/FORMAT")" "content of BACKING/FORMAT"
format_report=$(python3 - "$BACKING" <<'PY'
import hashlib, os, re, sys, urllib.parse
b = sys.argv[1]
errors, records, chunks, inlined, placed = [], 0, {}, 0, 0
# Format 4 lines: every record this program writes carries its dot (its context is left
# out when it is the device's own previous dot); kind (file), tomb (0), meta (0) and
# device (the segment's) are left out at their defaults.
required = {b"id", b"parents", b"name", b"committed", b"mtime", b"mode", b"path", b"dot"}
# FORMAT.md also lists meta (file) and xattrs (file, dir); the writer leaves them out
# when 0 / empty and the reader does not require them, so they are not checked here.
per_kind = {b"file": {b"node", b"size", b"chunks"}, b"dir": set(), b"link": {b"target"}}

def check_lines(data, dev, what):
    """The record lines of a segment or checkpoint part of device dev."""
    global records, inlined, placed
    if data and not data.endswith(b"\n"):
        errors.append(f"{what}: does not end with a newline")
    for n, line in enumerate(data.split(b"\n")[:-1], 1):
        where = f"{what} line {n}"
        m = re.fullmatch(rb"U2 ([0-9a-f]{32}) (.+)", line)
        if not m:
            errors.append(f"{where}: not 'U2 <128 bits of sha256> ...': {line[:80]!r}")
            continue
        if hashlib.sha256(m.group(2)).hexdigest().encode()[:32] != m.group(1):
            errors.append(f"{where}: checksum does not match")
        kv = {}
        for item in m.group(2).split(b" "):
            k, sep, v = item.partition(b"=")
            if not sep or k in kv:
                errors.append(f"{where}: bad or repeated key in {item[:40]!r}")
            kv[k] = v
        records += 1
        kind = kv.get(b"kind", b"file")
        missing = (required | per_kind.get(kind, set())) - kv.keys()
        if kind not in per_kind:
            errors.append(f"{where}: kind {kind!r}")
        if missing:
            errors.append(f"{where}: missing keys {sorted(missing)}")
        if (not re.fullmatch(rb"[1-9][0-9]{0,18}", kv.get(b"dot", b"")) or
                not re.fullmatch(rb"([0-9a-f]{16}:[1-9][0-9]*(:[1-9][0-9]*-[1-9][0-9]*)*(,|$))*", kv.get(b"context", b""))):
            errors.append(f"{where}: dot {kv.get(b'dot')!r} / context {kv.get(b'context')!r}")
        if kv.get(b"device", dev.encode()) != dev.encode():
            errors.append(f"{where}: device {kv.get(b'device')!r} is not the author's {dev}")
        path = urllib.parse.unquote_to_bytes(kv.get(b"path", b""))
        if not path or path.startswith(b"/") or b".." in path.split(b"/") or b".nosync" in path:
            errors.append(f"{where}: path {path!r}")
        if kind == b"file" and kv.get(b"tomb", b"0") == b"0":
            total, seen = 0, set()
            for i, c in enumerate(filter(None, urllib.parse.unquote_to_bytes(kv.get(b"chunks", b"")).split(b","))):
                if c.startswith(b"="):  # a small chunk as its bytes (format 4)
                    data = bytes.fromhex(c[1:].decode())
                    if not 0 < len(data) <= 1024:
                        errors.append(f"{where}: inline chunk {i} of {len(data)} bytes")
                    total += len(data)
                    inlined += 1
                    seen.add(hashlib.sha256(data).hexdigest().encode())
                    continue
                c, at, place = c.partition(b"@")
                sha, _, size = c.partition(b":")
                total += int(size)
                if sha == b"hole":  # a run of zeros (format 2): no chunk
                    continue
                if int(size) <= 1024 and sha not in seen:
                    errors.append(f"{where}: chunk {i} of {int(size)} bytes is not inline")
                if at:
                    # Format 5: <sha256>:<size>@<pack>:<offset>, on the chunk's first occurrence.
                    pm = re.fullmatch(rb"([0-9a-f]{32}):([0-9]+)", place)
                    if not pm or sha in seen or not 8 <= int(pm.group(2)) <= 1 << 42:
                        errors.append(f"{where}: chunk {i}: place {place[:60]!r} (bad, or not the first occurrence)")
                    else:
                        chunks.setdefault((sha.decode(), int(size), pm.group(1).decode(), int(pm.group(2))), where)
                        placed += 1
                elif sha not in seen:
                    errors.append(f"{where}: chunk {i} ({sha[:16].decode()}..., {int(size)} bytes) has no place at its first occurrence")
                seen.add(sha)
            if total != int(kv.get(b"size", b"-1")):
                errors.append(f"{where}: size {kv.get(b'size')!r} is not the sum of the chunk sizes {total}")

# Nothing of format 4: no objects/, no journals, no gc.lock.
for stale in ("objects", "gc.lock"):
    if os.path.exists(f"{b}/{stale}"):
        errors.append(f"{stale}: written by a format-5 device")
# The log: log/<13-digit ms>-<device>-<seq>, seqs of each device 1, 2, ... with no hole from
# the first one present (collected segments go from the start only).
seqs = {}
for name in sorted(os.listdir(f"{b}/log")):
    m = re.fullmatch(r"([0-9]{13})-([0-9a-f]{16})-([0-9a-f]{16})", name)
    if not m:
        errors.append(f"log/{name}: not a segment name")
        continue
    dev, seq = m.group(2), int(m.group(3), 16)
    if seq in seqs.setdefault(dev, {}):
        errors.append(f"log/{name}: seq {seq} of {dev} twice")
    seqs[dev][seq] = name
    check_lines(open(f"{b}/log/{name}", "rb").read(), dev, f"log/{name}")
for dev, s in sorted(seqs.items()):
    have = sorted(s)
    if have != list(range(have[0], have[0] + len(have))):
        errors.append(f"segments of {dev}: seqs {have} are not contiguous")
    if have[0] != 1 and not os.path.isdir(f"{b}/devices/{dev}"):
        errors.append(f"segments of {dev}: start at {have[0]} with no checkpoint")
# Checkpoints (the upgrade or a gc writes them): complete ones (with end) check like segments.
devices = sorted(os.listdir(f"{b}/devices")) if os.path.isdir(f"{b}/devices") else []
checkpoints = 0
for dev in devices:
    if not re.fullmatch(r"[0-9a-f]{16}", dev):
        errors.append(f"devices/{dev}: not a 16-hex-digit device id")
        continue
    for name in sorted(os.listdir(f"{b}/devices/{dev}")):
        if name.startswith("journal"):
            errors.append(f"devices/{dev}/{name}: a format-4 journal written by a format-5 device")
        elif re.fullmatch(r"checkpoint-[0-9a-f]{16}", name):
            parts = sorted(os.listdir(f"{b}/devices/{dev}/{name}"))
            if "end" not in parts:
                continue
            checkpoints += 1
            parts.remove("end")
            end = open(f"{b}/devices/{dev}/{name}/end").read()
            if not re.fullmatch(rf"parts={len(parts)} records=[0-9]+\n", end) or parts != [f"{i:08d}" for i in range(len(parts))]:
                errors.append(f"devices/{dev}/{name}: end {end!r} does not match parts {parts}")
            for part in parts:
                check_lines(open(f"{b}/devices/{dev}/{name}/{part}", "rb").read(), dev, f"devices/{dev}/{name}/{part}")
        elif not re.fullmatch(r"keyvalue-[0-9a-f]{16}", name):
            errors.append(f"devices/{dev}/{name}: unknown")
# Packs: "UBQPACK1", chunks, an index of (id, 4-byte LE length), count, "UBQPIDX1"; every
# chunk a record places there is in the index at that offset and hashes to its id.
packs = {}
for xx in sorted(os.listdir(f"{b}/packs")) if os.path.isdir(f"{b}/packs") else []:
    for name in sorted(os.listdir(f"{b}/packs/{xx}")):
        where = f"packs/{xx}/{name}"
        if not re.fullmatch(r"[0-9a-f]{32}", name) or name[:2] != xx:
            errors.append(f"{where}: not a pack name")
            continue
        data = open(f"{b}/{where}", "rb").read()
        count = int.from_bytes(data[-12:-8], "little")
        index = data[len(data) - 12 - 36 * count:-12]
        if not data.startswith(b"UBQPACK1") or not data.endswith(b"UBQPIDX1") or len(data) < 20 + 36 * count:
            errors.append(f"{where}: not a pack (header, trailer or count)")
            continue
        entries, off = {}, 8
        for i in range(count):
            sha, n = index[36 * i:36 * i + 32].hex(), int.from_bytes(index[36 * i + 32:36 * i + 36], "little")
            if hashlib.sha256(data[off:off + n]).hexdigest() != sha:
                errors.append(f"{where}: chunk {i} of its index does not hash to its id")
            entries[off] = (sha, n)
            off += n
        if off != len(data) - 12 - 36 * count:
            errors.append(f"{where}: the index covers {off} bytes of {len(data) - 12 - 36 * count}")
        packs[name] = (data, entries)
for (sha, size, pack, off), where in sorted(chunks.items()):
    if pack not in packs:
        errors.append(f"{where}: chunk {sha[:16]}... is in pack {pack}, which is not there")
        continue
    data, entries = packs[pack]
    if off + size > len(data) or hashlib.sha256(data[off:off + size]).hexdigest() != sha:
        errors.append(f"{where}: the bytes at {off}+{size} of pack {pack} are not chunk {sha[:16]}...")
    if entries.get(off) != (sha, size):
        errors.append(f"{where}: pack {pack}'s index has no chunk {sha[:16]}... at {off}")
print(f"{len(seqs)} devices, {sum(map(len, seqs.values()))} segments, {checkpoints} checkpoints, {records} records, "
      f"{len(packs)} packs, {placed} chunk places ({len(chunks)} distinct), {inlined} inline chunks")
for e in errors[:30]:
    print("ERROR", e)
PY
)
log "    $(head -n1 <<<"$format_report")"
assert_not_contains "$format_report" ERROR "checks of the backing directory against docs/FORMAT.md"
assert_contains "$format_report" "3 devices," "devices writing segments in the backing directory"
# The 3 MiB file's chunks and its edit travelled in packs (a report of 0 would mean the
# check found nothing to check).
[[ $format_report =~ ,\ ([0-9]+)\ packs,\ ([0-9]+)\ chunk\ places ]] || fail "no pack count in [$format_report]"
((BASH_REMATCH[1] >= 1 && BASH_REMATCH[2] >= 4)) ||
  fail "packs and chunk places checked: expected at least 1 pack and 4 places (big.bin), got [$format_report]"

unmount_device gamma
unmount_device beta
unmount_it
pass
