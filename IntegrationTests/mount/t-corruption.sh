#!/usr/bin/env bash
# Damaged chunks in the local packs are detected, never served: for a chunk with flipped
# bytes, a chunk whose bytes half read back as zeros, and a chunk lost from its pack whose
# copy in the backing store is damaged too, reading the file fails with EIO (cat exits
# non-zero with "Input/output error") and what was read before the error is an exact
# prefix of the original that stops before the damaged chunk; `ubiquity fsck` exits 1
# and names each damaged chunk; undamaged files in the same store read fine. A lost
# chunk whose copy in the backing store is good is not damage (files on demand: not
# here, fetched when read): the read returns the right bytes and fsck counts it as not
# local. `fsck --repair` while mounted fetches the damaged ones, and the mount serves
# the repaired copies at once.
# ubq-timeout: 120
set -euo pipefail
source "$(dirname "$0")/lib.sh"

PACKS="$(dirname "$0")/local-packs.py"
mount_fresh corrupt

chunk_set() { python3 "$PACKS" records "$STORE" | LC_ALL=C sort; }

# locate REF NEWRECORDS_FILE: among the pack records that appeared with REF, pick one
# that is neither the first nor the last of the file (so there is a readable prefix and
# a readable tail). Prints "sha256 offset-in-REF length". Records carry the sha256 of
# their bytes; the offset is found by searching the bytes in REF.
locate() {
  python3 - "$1" "$2" "$STORE/chunks/packs" <<'EOF'
import hashlib, os, sys
ref = open(sys.argv[1], "rb").read()
found = []
for line in open(sys.argv[2]).read().splitlines():
    sha, pack, at, n = line.split()
    with open(os.path.join(sys.argv[3], pack), "rb") as f:
        f.seek(int(at))
        data = f.read(int(n))
    if hashlib.sha256(data).hexdigest() != sha:
        sys.exit("record %s: its bytes do not hash to its id" % sha)
    off = ref.find(data)
    if off < 0:
        sys.exit("record %s: bytes not found in the reference file (not stored raw?)" % sha)
    found.append((off, len(data), sha))
found.sort()
if len(found) < 3:
    sys.exit("expected a ~1 MiB random file to make at least 3 chunks, got %d" % len(found))
# A last chunk of at most 2 KiB is a row of small.sqlite, not a record (store format 5):
# the records then add up to all but that tail (seen in CI: about 1 run in 10).
covered = sum(n for _, n, _ in found)
if covered != len(ref) and not (0 < len(ref) - covered <= 2048 and found[-1][0] + found[-1][1] == covered):
    sys.exit("the new chunks do not add up to the file size")
off, n, sha = found[len(found) // 2]
print(sha, off, n)
EOF
}

# write_tracked NAME: 1 MiB of random bytes as NAME (reference in WORK); records the
# pack records that this write added. Sets CHUNK OFFSET LENGTH for the picked chunk.
write_tracked() {
  local name=$1 before after
  head -c $((1 << 20)) /dev/urandom >"$WORK/$name"
  before=$(chunk_set)
  cp "$WORK/$name" "$MNT/$name"
  # The close committed the version (dirty=0), so its chunks are in the store now.
  assert_eq 0 "$(xattr "$MNT/$name" user.ubiquity.dirty)" "user.ubiquity.dirty of $name after cp"
  after=$(chunk_set)
  comm -13 <(echo "$before") <(echo "$after") >"$WORK/$name.chunks"
  read -r CHUNK OFFSET LENGTH < <(locate "$WORK/$name" "$WORK/$name.chunks") ||
    fail "could not find the chunks of $name"
  log "$name: damaging chunk $CHUNK at offset $OFFSET, $LENGTH bytes"
}

step "write three 1 MiB random files and two undamaged ones"
echo "small and fine" >"$MNT/ok.txt"
head -c $((700 << 10)) /dev/urandom >"$WORK/ok.bin"
cp "$WORK/ok.bin" "$MNT/ok.bin"
write_tracked flip.bin
flip_chunk=$CHUNK flip_off=$OFFSET flip_len=$LENGTH
write_tracked zero.bin
zero_chunk=$CHUNK zero_off=$OFFSET zero_len=$LENGTH
write_tracked gone.bin
gone_chunk=$CHUNK gone_off=$OFFSET gone_len=$LENGTH
write_tracked healed.bin
healed_chunk=$CHUNK
"$UBIQUITY" sync "$MNT" >/dev/null # the backing directory gets every chunk (fsck --repair below)
unmount_it

step "the unmount gave every pack its index; fsck of the intact store exits 0"
python3 "$PACKS" sealed "$STORE" || fail "a pack without its index after a clean unmount"
out=$("$UBIQUITY" fsck --store "$STORE" 2>&1) || fail "fsck of an intact store failed: $out"

step "damage: flip bytes, zero half a record, lose two records from their pack"
python3 "$PACKS" damage "$STORE" flip "$flip_chunk"
python3 "$PACKS" damage "$STORE" zero "$zero_chunk"
python3 "$PACKS" damage "$STORE" lose "$gone_chunk"
python3 "$PACKS" damage "$STORE" lose "$healed_chunk"
hex=$gone_chunk
# This one the backing directory lost too: its bytes in the pack that holds it are damaged
# (the pack also holds the other files' chunks, which must still be repaired from it).
pack=$(backing_packs_holding "$BACKING" "$hex")
[[ $pack =~ ^[0-9a-f]{32}$ ]] || fail "the packs holding chunk $hex: expected one, got [$pack]"
python3 - "$BACKING/packs/${pack:0:2}/$pack" "$hex" <<'EOF'
import sys
p, want = sys.argv[1], sys.argv[2]
data = bytearray(open(p, "rb").read())
count = int.from_bytes(data[-12:-8], "little")
index, off = data[len(data) - 12 - 36 * count:-12], 8
for i in range(count):
    sha, n = index[36 * i:36 * i + 32].hex(), int.from_bytes(index[36 * i + 32:36 * i + 36], "little")
    if sha == want:
        for j in (off, off + n // 2, off + n - 1):
            data[j] ^= 0xFF
        open(p, "wb").write(data)
        sys.exit(0)
    off += n
sys.exit(f"chunk {want} is not in the index of {p}")
EOF
[[ -z $(backing_packs_holding "$BACKING" "$hex") ]] || fail "chunk $hex still reads right from pack $pack after damaging it"

_ubq_mount

# check_damaged NAME OFFSET LENGTH: the whole-file read fails with EIO, its output is
# an exact prefix of the reference ending at or before OFFSET; a read inside the
# damaged chunk fails; reads before and after it return the right bytes.
check_damaged() {
  local name=$1 off=$2 len=$3 rc=0 err
  cat "$MNT/$name" >"$WORK/$name.out" 2>"$WORK/$name.err" || rc=$?
  err=$(cat "$WORK/$name.err")
  ((rc != 0)) || fail "$name: cat of a file with a damaged chunk exited 0"
  assert_contains "$err" "Input/output error" "$name: cat's error message"
  python3 - "$WORK/$name" "$WORK/$name.out" "$off" "$len" "$MNT/$name" <<'EOF' || fail "$name: partial read check failed"
import errno, os, sys
ref = open(sys.argv[1], "rb").read()
out = open(sys.argv[2], "rb").read()
off, n = int(sys.argv[3]), int(sys.argv[4])
if not ref.startswith(out):
    sys.exit("bytes read before the error differ from the original (%d bytes read)" % len(out))
if len(out) > off:
    sys.exit("%d bytes were returned, past the damaged chunk's start %d" % (len(out), off))
fd = os.open(sys.argv[5], os.O_RDONLY)
# Entirely inside the damaged chunk: must be EIO, never bytes.
try:
    got = os.pread(fd, 4096, off + n // 2 - 2048)
    sys.exit("read inside the damaged chunk returned %d bytes instead of EIO" % len(got))
except OSError as e:
    if e.errno != errno.EIO:
        sys.exit("read inside the damaged chunk: %s instead of EIO" % errno.errorcode[e.errno])
# Entirely before it (the file's first 4 KiB): fine and right.
if os.pread(fd, 4096, 0) != ref[:4096]:
    sys.exit("the first 4 KiB (an intact chunk) read wrong")
# Well after it, in an intact chunk: fine and right.
after = ((off + n) // 4096 + 16) * 4096
if after + 4096 <= len(ref) and os.pread(fd, 4096, after) != ref[after:after + 4096]:
    sys.exit("4 KiB at %d (after the damaged chunk) read wrong" % after)
EOF
}

step "flipped bytes: EIO, never wrong bytes"
check_damaged flip.bin "$flip_off" "$flip_len"
step "half a chunk read back as zeros: EIO"
check_damaged zero.bin "$zero_off" "$zero_len"
step "deleted chunk whose backing copy is damaged too: EIO"
check_damaged gone.bin "$gone_off" "$gone_len"

step "deleted chunk whose backing copy is good: fetched, the right bytes"
assert_same_file "$WORK/healed.bin" "$MNT/healed.bin" "healed.bin (its chunk fetched from the backing store)"
assert_eq current "$(xattr "$MNT/healed.bin" user.ubiquity.downloaded)" "user.ubiquity.downloaded of healed.bin"

step "the version view of a damaged file fails the same way"
v=$(version_names flip.bin | head -n1)
assert_fails "cat of .versions/flip.bin/$v" cat "$MNT/.versions/flip.bin/$v"
assert_contains "$LAST_ERR" "Input/output error" "error reading the damaged version"

step "undamaged files in the same store read fine"
assert_file_content "$MNT/ok.txt" "small and fine" "ok.txt"
assert_same_file "$WORK/ok.bin" "$MNT/ok.bin" "ok.bin"

step "fsck (safe while mounted) exits 1 and names every damaged chunk"
rc=0
out=$("$UBIQUITY" fsck --store "$STORE" 2>&1) || rc=$?
assert_eq 1 "$rc" "exit status of fsck on a damaged store"
for c in "$flip_chunk" "$zero_chunk"; do
  assert_contains "$out" "$c" "fsck report naming chunk $c"
done
# The deleted chunk is in the backing store's pack as far as this store knows: not local.
assert_contains "$out" "not local: 1 chunk(s)" "fsck report of the chunk not here"
# The intact files' chunks must not be reported.
while read -r c _; do
  case $c in "$flip_chunk" | "$zero_chunk" | "$gone_chunk") continue ;; esac
  assert_not_contains "$out" "$c" "fsck report (intact chunk $c named)"
done < <(cat "$WORK/flip.bin.chunks" "$WORK/zero.bin.chunks" "$WORK/gone.bin.chunks" "$WORK/healed.bin.chunks")

step "fsck --repair (live) fetches damaged chunks from the backing directory's packs, not what is only not local"
rc=0
out=$("$UBIQUITY" fsck --repair --store "$STORE" 2>&1) || rc=$?
assert_eq 0 "$rc" "exit status of fsck --repair [$out]"
assert_contains "$out" "repaired 2 chunk(s)" "fsck --repair report"
assert_contains "$out" "not local: 1 chunk(s)" "fsck --repair report"
assert_same_file "$WORK/flip.bin" "$MNT/flip.bin" "flip.bin after the repair"
assert_same_file "$WORK/zero.bin" "$MNT/zero.bin" "zero.bin after the repair"
check_damaged gone.bin "$gone_off" "$gone_len"
rc=0
out=$("$UBIQUITY" fsck --store "$STORE" 2>&1) || rc=$?
assert_eq 0 "$rc" "fsck after the repair: gone.bin's chunk is not local (its backing copy is damaged: fsck --backing finds that)"
assert_not_contains "$out" "$flip_chunk" "fsck after the repair (flip.bin's chunk)"

pass
