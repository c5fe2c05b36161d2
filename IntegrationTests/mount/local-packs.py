#!/usr/bin/env python3
"""A store's local packs (docs/FORMAT.md, "Local packs"), read and damaged the way a disk
fault would, for the mount tests. Written from the format's description, not the code.

  local-packs.py records STORE         every record: sha256 pack offset-of-bytes length
  local-packs.py damage STORE flip SHA   three bytes of the chunk's record changed
  local-packs.py damage STORE zero SHA   the second half of its bytes read back as zeros
  local-packs.py damage STORE lose SHA   the record gone: header zeroed, out of the index
  local-packs.py sealed STORE          exit 1 unless every pack has a whole index
  local-packs.py to-files STORE        the store as format 17 kept it: every live record
                                       a chunk file chunks/xx/<sha256>, no packs
"""
import hashlib, os, struct, sys

def fnv1a(data):
    h = 0xcbf29ce484222325
    for b in data:
        h = ((h ^ b) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return h

def packs_dir(store):
    return os.path.join(store, "chunks", "packs")

def pack_names(store):
    d = packs_dir(store)
    return sorted(n for n in os.listdir(d) if n.endswith(".pack")) if os.path.isdir(d) else []

def records(store):
    """(sha, pack, offset of bytes, length) of every whole record, in the order they lie."""
    out = []
    for name in pack_names(store):
        data = open(os.path.join(packs_dir(store), name), "rb").read()
        if data[:8] != b"UBQLPCK1":
            continue
        at = 16
        while at + 48 <= len(data):
            head = data[at:at + 48]
            n = struct.unpack_from("<I", head, 4)[0]
            if head[:4] != b"UPUR" or struct.unpack_from("<Q", head, 40)[0] != fnv1a(head[:40]) or at + 48 + n > len(data):
                # Not a record (one this script damaged): on to the next header.
                at = data.find(b"UPUR", at + 1)
                if at < 0:
                    break
                continue
            out.append((head[8:40].hex(), name, at + 48, n))
            at += 48 + n
    return out

def read_index(path):
    data = open(path, "rb").read()
    if len(data) < 32 or data[:8] != b"UBQLIDX1" or struct.unpack_from("<Q", data, len(data) - 8)[0] != fnv1a(data[:-8]):
        return None
    size, count = struct.unpack_from("<QQ", data, 8)
    entries = [(data[24 + 48 * i:56 + 48 * i], *struct.unpack_from("<QQ", data, 56 + 48 * i)) for i in range(count)]
    return size, entries

def write_index(path, size, entries):
    body = b"UBQLIDX1" + struct.pack("<QQ", size, len(entries))
    for sha, off, n in entries:
        body += sha + struct.pack("<QQ", off, n)
    open(path, "wb").write(body + struct.pack("<Q", fnv1a(body)))

def damage(store, mode, want):
    found = [r for r in records(store) if r[0] == want]
    if not found:
        sys.exit(f"chunk {want} is not a record of any local pack")
    _, name, off, n = found[-1]
    path = os.path.join(packs_dir(store), name)
    with open(path, "r+b") as f:
        if mode == "flip":
            for j in (off + n // 2, off + n // 2 + 1, off + n - 1):
                f.seek(j)
                b = f.read(1)[0]
                f.seek(j)
                f.write(bytes([b ^ 0xFF]))
        elif mode == "zero":
            f.seek(off + n // 2)
            f.write(bytes(n - n // 2))
        elif mode == "lose":
            f.seek(off - 48)
            f.write(bytes(48))
        else:
            sys.exit(f"unknown damage {mode}")
    if mode == "lose":
        index = path[:-len(".pack")] + ".idx"
        if os.path.exists(index):
            parsed = read_index(index)
            if parsed is None:
                sys.exit(f"{index} is not a whole index")
            size, entries = parsed
            write_index(index, size, [e for e in entries if e[0].hex() != want])

def to_files(store):
    chunks = os.path.join(store, "chunks")
    for i in range(256):
        os.makedirs(os.path.join(chunks, "%02x" % i), exist_ok=True)
    live = set()
    for name in pack_names(store):
        index = os.path.join(packs_dir(store), name[:-len(".pack")] + ".idx")
        parsed = read_index(index) if os.path.exists(index) else None
        if parsed is None:
            sys.exit(f"pack {name} has no whole index (unmount first)")
        live |= {(sha.hex(), name, off, n) for sha, off, n in parsed[1]}
    for sha, name, off, n in sorted(live):
        with open(os.path.join(packs_dir(store), name), "rb") as f:
            f.seek(off)
            data = f.read(n)
        if hashlib.sha256(data).hexdigest() != sha:
            sys.exit(f"record {sha} in {name} is damaged")
        path = os.path.join(chunks, sha[:2], sha)
        with open(path, "wb") as out:
            out.write(data)
        os.chmod(path, 0o444)
    for name in os.listdir(packs_dir(store)):
        os.unlink(os.path.join(packs_dir(store), name))
    os.rmdir(packs_dir(store))
    print(len(live))

def main():
    if len(sys.argv) == 3 and sys.argv[1] == "records":
        for sha, name, off, n in records(sys.argv[2]):
            print(sha, name, off, n)
    elif len(sys.argv) == 5 and sys.argv[1] == "damage":
        damage(sys.argv[2], sys.argv[3], sys.argv[4])
    elif len(sys.argv) == 3 and sys.argv[1] == "to-files":
        to_files(sys.argv[2])
    elif len(sys.argv) == 3 and sys.argv[1] == "sealed":
        for name in pack_names(sys.argv[2]):
            index = os.path.join(packs_dir(sys.argv[2]), name[:-len(".pack")] + ".idx")
            if not os.path.exists(index) or read_index(index) is None:
                sys.exit(f"pack {name} has no whole index")
    else:
        sys.exit(__doc__)

main()
