/// One change to the tree's rows as the operation log carries it: the row as it is after
/// the change (an inode with its primary name, a directory entry), or its removal, or a
/// member added to one of the sync step's pending sets. Physical, not logical: folding a
/// change writes its row, so replay needs none of the checks that made it, and one seam
/// (the store's row writes) serves every writer: requests, reconcile, saves, adoption of
/// histories.
///
/// The cases with a large payload (an inode row is 168 bytes) keep it boxed: the overlay
/// holds every change of a burst in one array, whose growth then copies and faults in 48
/// bytes a change instead of 176.
enum TreeChange: Equatable {
    indirect case putInode(TreeNode)
    /// The inode, its xattrs and its reserved ranges go (no entry names it, nothing has it open).
    case dropInode(InodeNumber)
    case putEntry(parent: InodeNumber, name: String, inode: InodeNumber)
    case removeEntry(parent: InodeNumber, name: String)
    /// A member of the pending set `kind` (PendingSet.Kind), by its key text.
    case pending(kind: Int64, key: String)
    /// A new version of a file saved here, with the row it takes; its record enters the
    /// synced view when it is folded.
    indirect case save(SavedVersion)
    /// A file's last name went: its tombstone, with the row it takes. Its parents (the
    /// file's live heads) are worked out when it is folded, in order.
    indirect case tombstone(row: Int64, id: VersionID, fileID: FileID, head: Int64?, path: String, committed: Nanos)
    /// Where a history is shown under `.versions/`, and whether a file lives there.
    case history(FileID, path: String, live: Bool)
    /// A version of a local-only file saved here (never a record): the row it takes, the
    /// inode saved, and the local version it replaces, which goes when it is folded unless
    /// another inode shows it.
    indirect case localSave(SavedVersion, inode: InodeNumber, replaces: Int64?)
    /// A history whose one version is an unsent save (`row`, record `id`) goes altogether:
    /// an editor's temp file renamed over the file it saves (`Store.endHistoryRenamedOver`).
    case withdraw(row: Int64, id: VersionID, fileID: FileID)
    /// A user xattr (full name, `user.` included) set to `value`, or removed (nil).
    case xattr(InodeNumber, name: String, value: [UInt8]?)

    static func == (a: TreeChange, b: TreeChange) -> Bool {
        switch (a, b) {
        case (.putInode(let x), .putInode(let y)): return x.inode == y.inode && x.link == y.link
        case (.dropInode(let x), .dropInode(let y)): return x == y
        case (.putEntry(let p, let n, let i), .putEntry(let q, let m, let j)): return p == q && NameKey(n) == NameKey(m) && i == j
        case (.removeEntry(let p, let n), .removeEntry(let q, let m)): return p == q && NameKey(n) == NameKey(m)
        case (.pending(let k, let x), .pending(let l, let y)): return k == l && NameKey(x) == NameKey(y)
        case (.save(let x), .save(let y)): return x == y
        case (.localSave(let x, let i, let r), .localSave(let y, let j, let q)): return x == y && i == j && r == q
        case (.tombstone(let r, let i, let f, let h, let p, let c), .tombstone(let r2, let i2, let f2, let h2, let p2, let c2)):
            return r == r2 && i == i2 && f == f2 && h == h2 && NameKey(p) == NameKey(p2) && c == c2
        case (.history(let f, let p, let l), .history(let f2, let p2, let l2)): return f == f2 && NameKey(p) == NameKey(p2) && l == l2
        case (.withdraw(let r, let i, let f), .withdraw(let r2, let i2, let f2)): return r == r2 && i == i2 && f == f2
        case (.xattr(let i, let n, let v), .xattr(let j, let m, let w)): return i == j && n == m && v == w
        default: return false
        }
    }
}

/// A version saved on this device, as the operation log carries it until it is folded.
struct SavedVersion: Equatable {
    var row: Int64
    var id: VersionID
    var fileID: FileID
    var parents: [VersionID]
    var deviceName: String
    var committed: Nanos
    var mtime: Nanos
    var mode: UInt32
    var path: String
    var chunks: ChunkList
    var xattrs: [XattrEntry]
}

/// A frame's payload: a version byte, a u32 count, then the changes, each a tag byte and
/// its fields in order; integers little-endian, strings as a u32 length and the bytes, an
/// optional as a flag byte and the value. Decoding checks every length against what is
/// left and against the field's limit, and every kind against the kinds there are, so a
/// frame's bytes cannot make it trap or allocate without bound.
extension TreeChange {
    /// Names, symlink targets, paths and pending keys: a path may be thousands of names
    /// deep, so as long as a payload may be (every read is also bounded by what is left).
    static let maxString = OperationLog.maxPayload
    static let frameVersion: UInt8 = 1

    private enum Tag: UInt8 { case putInode = 1, dropInode, putEntry, removeEntry, pending, save, tombstone, history, withdraw, localSave, xattr }
    /// A chunk list or the xattrs of one save.
    static let maxBlob = OperationLog.maxPayload
    /// One xattr's value: setxattr takes at most 64 KiB.
    static let maxXattr = 65_536

    static func encode(_ changes: some Collection<TreeChange>) -> [UInt8] {
        var w = PayloadWriter()
        // About what a request's changes take (an inode row is 100-odd bytes, a save with a
        // short chunk list twice that): growing from empty copied the frame several times.
        w.out.reserveCapacity(16 + 192 * changes.count)
        w.byte(frameVersion)
        w.u32(UInt32(changes.count))
        for change in changes { change.write(to: &w) }
        return w.out
    }

    /// Nil for anything that is not exactly one well-formed frame.
    static func decode(_ payload: some Collection<UInt8>) -> [TreeChange]? {
        var r = PayloadReader(Array(payload))
        guard r.byte() == frameVersion, let count = r.u32() else { return nil }
        var changes: [TreeChange] = []
        // Each change takes at least 9 bytes: a count beyond that is damage, not a reason
        // to reserve memory.
        changes.reserveCapacity(min(Int(count), r.remaining / 9))
        for _ in 0..<count {
            guard let change = read(&r) else { return nil }
            changes.append(change)
        }
        return r.atEnd ? changes : nil
    }

    private func write(to w: inout PayloadWriter) {
        switch self {
        case .putInode(let node):
            let i = node.inode
            w.byte(Tag.putInode.rawValue)
            w.inode(i.id); w.i64(i.kind.rawValue); w.u32(i.mode); w.u32(i.uid); w.u32(i.gid)
            w.i64(i.size); w.i64(i.allocated); w.i64(i.absent); w.i64(i.keep.rawValue)
            w.i64(i.atime); w.i64(i.mtime); w.i64(i.ctime); w.u64(i.rdev)
            w.optional(i.target) { $0.string($1) }
            w.optional(i.fileID) { $0.u64($1.value.high); $0.u64($1.value.low) }
            w.optional(i.head) { $0.i64($1) }
            w.u32(i.nlink)
            w.optional(node.link) { $0.inode($1.parent); $0.string($1.name) }
        case .dropInode(let id):
            w.byte(Tag.dropInode.rawValue); w.inode(id)
        case .putEntry(let parent, let name, let inode):
            w.byte(Tag.putEntry.rawValue); w.inode(parent); w.string(name); w.inode(inode)
        case .removeEntry(let parent, let name):
            w.byte(Tag.removeEntry.rawValue); w.inode(parent); w.string(name)
        case .pending(let kind, let key):
            w.byte(Tag.pending.rawValue); w.i64(kind); w.string(key)
        case .save(let v):
            w.byte(Tag.save.rawValue); v.write(to: &w)
        case .localSave(let v, let inode, let replaces):
            w.byte(Tag.localSave.rawValue); v.write(to: &w); w.inode(inode); w.optional(replaces) { $0.i64($1) }
        case .tombstone(let row, let id, let fileID, let head, let path, let committed):
            w.byte(Tag.tombstone.rawValue); w.i64(row); w.id(id.value); w.id(fileID.value); w.optional(head) { $0.i64($1) }
            w.string(path); w.i64(committed)
        case .history(let fileID, let path, let live):
            w.byte(Tag.history.rawValue); w.id(fileID.value); w.string(path); w.byte(live ? 1 : 0)
        case .withdraw(let row, let id, let fileID):
            w.byte(Tag.withdraw.rawValue); w.i64(row); w.id(id.value); w.id(fileID.value)
        case .xattr(let inode, let name, let value):
            w.byte(Tag.xattr.rawValue); w.inode(inode); w.string(name); w.optional(value) { $0.bytes($1) }
        }
    }

    private static func read(_ r: inout PayloadReader) -> TreeChange? {
        guard let tag = r.byte().flatMap(Tag.init(rawValue:)) else { return nil }
        switch tag {
        case .putInode:
            guard let id = r.inode(), let kind = r.i64().flatMap(NodeKind.init(rawValue:)), let mode = r.u32(),
                  let uid = r.u32(), let gid = r.u32(), let size = r.i64(), let allocated = r.i64(), let absent = r.i64(),
                  let keep = r.i64().flatMap(KeepPolicy.init(rawValue:)), let atime = r.i64(), let mtime = r.i64(),
                  let ctime = r.i64(), let rdev = r.u64(), let target = r.optional({ $0.string() }),
                  let fileID = r.optional({ r -> FileID? in
                      guard let high = r.u64(), let low = r.u64() else { return nil }
                      return FileID(ID128(high: high, low: low))
                  }),
                  let head = r.optional({ $0.i64() }), let nlink = r.u32(),
                  let link = r.optional({ r -> EntryRef? in
                      guard let parent = r.inode(), let name = r.string() else { return nil }
                      return EntryRef(parent: parent, name: name)
                  })
            else { return nil }
            // Sizes as the index keeps them: within 0...maxFileSize, so no later sum overflows.
            var inode = Inode(id: id, kind: kind, mode: mode, uid: uid, gid: gid, size: Store.checkedSize(size), time: 0,
                              rdev: rdev, target: target, fileID: fileID)
            inode.allocated = Store.checkedSize(allocated)
            inode.absent = min(Store.checkedSize(absent), inode.allocated)
            inode.keep = keep
            inode.atime = atime; inode.mtime = mtime; inode.ctime = ctime
            inode.head = head
            inode.nlink = nlink
            return .putInode(TreeNode(inode: inode, link: link))
        case .dropInode:
            return r.inode().map { .dropInode($0) }
        case .putEntry:
            guard let parent = r.inode(), let name = r.string(), let inode = r.inode() else { return nil }
            return .putEntry(parent: parent, name: name, inode: inode)
        case .removeEntry:
            guard let parent = r.inode(), let name = r.string() else { return nil }
            return .removeEntry(parent: parent, name: name)
        case .pending:
            guard let kind = r.i64(), PendingKind(rawValue: kind) != nil, let key = r.string() else { return nil }
            return .pending(kind: kind, key: key)
        case .save:
            return SavedVersion.read(&r).map { .save($0) }
        case .localSave:
            guard let v = SavedVersion.read(&r), let inode = r.inode(), let replaces = r.optional({ $0.i64() }) else { return nil }
            return .localSave(v, inode: inode, replaces: replaces)
        case .tombstone:
            guard let row = r.i64(), let id = r.id(), let fileID = r.id(), let head = r.optional({ $0.i64() }),
                  let path = r.string(), let committed = r.i64() else { return nil }
            return .tombstone(row: row, id: VersionID(id), fileID: FileID(fileID), head: head, path: path, committed: committed)
        case .history:
            guard let fileID = r.id(), let path = r.string(), let live = r.byte(), live <= 1 else { return nil }
            return .history(FileID(fileID), path: path, live: live == 1)
        case .withdraw:
            guard let row = r.i64(), let id = r.id(), let fileID = r.id() else { return nil }
            return .withdraw(row: row, id: VersionID(id), fileID: FileID(fileID))
        case .xattr:
            guard let inode = r.inode(), let name = r.string(), let value = r.optional({ $0.bytes(limit: TreeChange.maxXattr) })
            else { return nil }
            return .xattr(inode, name: name, value: value)
        }
    }
}

extension SavedVersion {
    fileprivate func write(to w: inout PayloadWriter) {
        w.i64(row); w.id(id.value); w.id(fileID.value)
        w.u32(UInt32(parents.count)); for parent in parents { w.id(parent.value) }
        w.string(deviceName); w.i64(committed); w.i64(mtime); w.u32(mode); w.string(path)
        w.bytes(chunks.encoded); w.bytes(XattrCodec.encode(xattrs))
    }

    fileprivate static func read(_ r: inout PayloadReader) -> SavedVersion? {
        guard let row = r.i64(), let id = r.id(), let fileID = r.id(), let count = r.u32(),
              Int(count) <= r.remaining / 16 else { return nil }
        var parents: [VersionID] = []
        for _ in 0..<count {
            guard let parent = r.id() else { return nil }
            parents.append(VersionID(parent))
        }
        guard let deviceName = r.string(), let committed = r.i64(), let mtime = r.i64(), let mode = r.u32(),
              let path = r.string(), let list = r.bytes(limit: TreeChange.maxBlob), let chunks = ChunkList(encoded: list),
              let xattrs = r.bytes(limit: TreeChange.maxBlob) else { return nil }
        return SavedVersion(row: row, id: VersionID(id), fileID: FileID(fileID), parents: parents,
                            deviceName: deviceName, committed: committed, mtime: mtime, mode: mode & 0o7777,
                            path: path, chunks: chunks, xattrs: XattrCodec.decode(xattrs))
    }
}

private struct PayloadWriter {
    var out: [UInt8] = []
    mutating func byte(_ v: UInt8) { out.append(v) }
    mutating func u32(_ v: UInt32) { withUnsafeBytes(of: v.littleEndian) { out += $0 } }
    mutating func u64(_ v: UInt64) { withUnsafeBytes(of: v.littleEndian) { out += $0 } }
    mutating func i64(_ v: Int64) { u64(UInt64(bitPattern: v)) }
    mutating func inode(_ v: InodeNumber) { u64(v.rawValue) }
    mutating func bytes(_ v: [UInt8]) { u32(UInt32(v.count)); out += v }
    mutating func string(_ v: String) { bytes(Array(v.utf8)) }
    mutating func id(_ v: ID128) { u64(v.high); u64(v.low) }
    mutating func optional<T>(_ v: T?, _ body: (inout PayloadWriter, T) -> Void) {
        if let v { byte(1); body(&self, v) } else { byte(0) }
    }
}

private struct PayloadReader {
    let b: [UInt8]
    var at = 0
    init(_ b: [UInt8]) { self.b = b }
    var atEnd: Bool { at == b.count }
    var remaining: Int { b.count - at }

    mutating func take(_ n: Int) -> ArraySlice<UInt8>? {
        guard n >= 0, b.count - at >= n else { return nil }
        defer { at += n }
        return b[at..<at + n]
    }
    mutating func byte() -> UInt8? { take(1)?.first }
    mutating func u32() -> UInt32? { take(4).map { $0.reversed().reduce(UInt32(0)) { $0 << 8 | UInt32($1) } } }
    mutating func u64() -> UInt64? { take(8).map { $0.reversed().reduce(UInt64(0)) { $0 << 8 | UInt64($1) } } }
    mutating func i64() -> Int64? { u64().map { Int64(bitPattern: $0) } }
    mutating func inode() -> InodeNumber? { u64().map { InodeNumber(rawValue: $0) } }
    mutating func id() -> ID128? {
        guard let high = u64(), let low = u64() else { return nil }
        return ID128(high: high, low: low)
    }
    mutating func bytes(limit: Int) -> [UInt8]? {
        guard let n = u32(), n <= UInt32(limit), let slice = take(Int(n)) else { return nil }
        return Array(slice)
    }
    mutating func string() -> String? {
        guard let raw = bytes(limit: TreeChange.maxString) else { return nil }
        return String(validating: raw, as: UTF8.self)
    }
    /// `.some(nil)` for an absent value, nil for a malformed one.
    mutating func optional<T>(_ body: (inout PayloadReader) -> T?) -> T?? {
        switch byte() {
        case 0: return .some(nil)
        case 1: return body(&self).map { .some($0) } ?? nil
        default: return nil
        }
    }
}
