import Glibc
import UbiquityStore
import UbiquitySystem

/// The mount's door to the key-value store: `.kv/` at the root, one file per key. A file's
/// content is the value (`KeyValues.canonical`), its type the xattr `user.ubiquity.kv.type`.
/// Writes collect in the open handle and are applied, validated, when it is closed: a
/// value that fails the type or the limits is refused with close()'s error (EINVAL,
/// EFBIG, EDQUOT) and the old value stays. `ubiquity kv` goes through this same door.
///
/// Nothing here is cached by the kernel (zero timeouts, no page cache kept): a value
/// another device set shows at the next read.
struct KeyValueDoor {
    static let root = VirtualViews.base.advanced(by: 2)
    /// Key files are numbered from here, apart from the history views' nodes.
    static let keyBase = InodeNumber(rawValue: 1 << 57)
    static let typeAttribute = "user.ubiquity.kv.type"
    static let deviceAttribute = "user.ubiquity.kv.device"
    static let timeAttribute = "user.ubiquity.kv.time"
    /// On `.kv` itself: `keys=N bytes=N value=N key=N` (the limits) and `keys=N bytes=N`.
    static let limitsAttribute = "user.ubiquity.kv.limits"
    static let usageAttribute = "user.ubiquity.kv.usage"
    static let name = ".kv"

    static func owns(_ ino: InodeNumber) -> Bool { ino == root || ino >= keyBase }

    /// Key files' numbers (see NodeNumbering).
    private var files = NodeNumbering<String>(first: keyBase)

    mutating func number(_ key: String) -> InodeNumber { files.number(key) }

    func key(_ ino: InodeNumber) -> String? { files.key(ino) }

    /// The key's number if it has one (without giving it one).
    func existingNumber(_ key: String) -> InodeNumber? { files.existingNumber(key) }

    mutating func referenced(_ ino: InodeNumber) { files.referenced(ino) }

    mutating func forget(_ ino: InodeNumber, count: UInt64) { files.forget(ino, count: count) }

    /// Drops key numbers the kernel holds no reference to, once there are many (a listing
    /// numbers every key; keys come and go).
    mutating func pruneUnreferenced(pinned: () -> Set<InodeNumber>) {
        files.pruneUnreferenced(limit: 4096, pinned: pinned)
    }
}

/// An open key file: the bytes it will set at close, and the type the value will take
/// (set by `setxattr` of the type while open; else the key's current type, else string).
final class KeyValueOpen: @unchecked Sendable {
    let key: String
    let writable: Bool
    var buffer: [UInt8]
    var type: KVType?
    /// Changed since opened or last applied (a write, a truncation, a new key).
    var dirty = false
    /// A write() since the last apply: close() applies then (a flush of a descriptor that
    /// only truncated, as a shell's `>` dup'ed one, must not set an empty value).
    var wrote = false
    /// A write went past the value limit: what the handle holds is not the value its
    /// writer meant, so it is never applied (close() says EFBIG) unless truncated again.
    var tooBig = false

    init(key: String, writable: Bool, buffer: [UInt8], type: KVType?) {
        self.key = key
        self.writable = writable
        self.buffer = buffer
        self.type = type
    }
}

extension FileSystem {
    var kvLimits: KVLimits { options.kvLimits }

    /// The key-value store: requests on `.kv/` take its lock under the filesystem's, never
    /// the store's.
    var keyValues: KeyValueTable { store.keyValues }

    /// `.kv/` and its keys are the root's: its owner, and its time for `.kv/` itself. From
    /// the working set without the store's lock; from the store when it is not there.
    func kvOwner() -> KeyValueDoor.Owner { KeyValueDoor.Owner(try? rootInode()) }

    func kvGetattr(_ ino: InodeNumber) throws(Errno) -> Attributes {
        let owner = kvOwner()
        return try state.withLock { (m) throws(Errno) -> Attributes in try m.kvAttributes(ino, keyValues: keyValues, owner: owner) }
    }

    // MARK: nodes

    func kvLookup(parent: InodeNumber, name: String, counting: Bool = true) throws(Errno) -> Attributes {
        let owner = kvOwner()
        if parent == Store.rootInode { return FileSystem.Meta.kvAttributes(KeyValueDoor.root, entry: nil, owner: owner) }
        guard parent == KeyValueDoor.root else { throw .notFound }
        return try state.withLock { (m) throws(Errno) -> Attributes in
            guard let entry = try storeCall({ () throws(StoreError) in try keyValues.entry(name) }), !entry.isTombstone else {
                throw .notFound
            }
            let ino = m.kv.number(name)
            if counting { m.kv.referenced(ino) }
            return FileSystem.Meta.kvAttributes(ino, entry: entry, owner: owner)
        }
    }

    // MARK: files

    func kvCreate(parent: InodeNumber, name: String, flags: OpenFlags) throws(Errno) -> (Attributes, HandleID) {
        guard parent == KeyValueDoor.root else { throw .readOnly }
        do throws(KVError) { try KeyValues.check(key: name, limits: kvLimits) } catch { throw StoreError.keyValue(error).errno }
        let owner = kvOwner()
        return try state.withLock { (m) throws(Errno) -> (Attributes, HandleID) in
            let current = try storeCall { () throws(StoreError) in try keyValues.entry(name) }.flatMap { $0.isTombstone ? nil : $0 }
            if current != nil && flags.raw & O_EXCL != 0 { throw .exists }
            let open = KeyValueOpen(key: name, writable: true, buffer: [], type: current?.type)
            open.dirty = true
            let ino = m.kv.number(name)
            m.kv.referenced(ino)
            let handle = m.register(.keyValue(open))
            var a = FileSystem.Meta.kvAttributes(ino, entry: current, owner: owner)
            a.size = 0
            a.allocated = 0
            return (a, handle)
        }
    }

    func kvOpen(_ ino: InodeNumber, flags: OpenFlags) throws(Errno) -> HandleID {
        try state.withLock { (m) throws(Errno) -> HandleID in
            if ino == KeyValueDoor.root { throw .isDirectory }
            guard let key = m.kv.key(ino) else { throw .notFound }
            let current = try storeCall { () throws(StoreError) in try keyValues.entry(key) }.flatMap { $0.isTombstone ? nil : $0 }
            let truncate = flags.writable && flags.truncates
            guard current != nil || truncate || flags.raw & O_CREAT != 0 else { throw .notFound }
            let open = KeyValueOpen(key: key, writable: flags.writable, buffer: truncate ? [] : current?.value ?? [], type: current?.type)
            open.dirty = truncate || current == nil
            return m.register(.keyValue(open))
        }
    }

    func kvRead(_ open: KeyValueOpen, offset: Int64, count: Int) -> [UInt8] {
        state.withLock { _ in
            guard offset >= 0, offset < Int64(open.buffer.count), count > 0 else { return [] }
            let start = Int(offset)
            return Array(open.buffer[start..<min(open.buffer.count, start + min(count, open.buffer.count - start))])
        }
    }

    /// Bytes beyond the per-value limit are refused at once (EFBIG), so an open key file
    /// never holds more memory than a value may have.
    func kvWrite(_ open: KeyValueOpen, offset: Int64, data: UnsafeRawBufferPointer) throws(Errno) -> Int {
        guard open.writable else { throw .badHandle }
        guard offset >= 0 else { throw .invalid }
        let (end, overflow) = offset.addingReportingOverflow(Int64(data.count))
        guard !overflow, end <= Int64(kvLimits.maxValueBytes) else {
            state.withLock { _ in open.tooBig = true }
            throw .fileTooBig
        }
        state.withLock { _ in
            let start = Int(offset)
            if open.buffer.count < start + data.count { open.buffer += [UInt8](repeating: 0, count: start + data.count - open.buffer.count) }
            open.buffer.replaceSubrange(start..<start + data.count, with: data)
            open.dirty = true
            open.wrote = true
        }
        return data.count
    }

    /// close(2): applies what was written since the last apply; its error is close()'s.
    func kvFlush(_ open: KeyValueOpen) throws(Errno) {
        guard state.withLock({ _ in open.wrote }) else { return }
        try kvApply(open)
    }

    /// The last close: applies a truncation or a new empty key no write followed.
    func kvRelease(_ open: KeyValueOpen) {
        do { try kvApply(open) } catch { log("ubiquity: key \(String(reflecting: open.key)) not set at close: \(error)") }
    }

    private func kvApply(_ open: KeyValueOpen) throws(Errno) {
        try state.withLock { (_) throws(Errno) in
            guard open.dirty else { return }
            open.dirty = false
            open.wrote = false
            if open.tooBig { throw .fileTooBig } // the old value stays
            // A set value survives a crash once close() returns (its own commit); one that
            // fails is not set. The type a handle did not set is the key's as it is then.
            let entry = try storeCall { () throws(StoreError) -> KVEntry? in
                try keyValues.update(open.key, limits: kvLimits) { current in
                    (open.type ?? KeyValues.defaultType(current: current?.type), open.buffer)
                }
            }
            if let entry { open.buffer = entry.value }
        }
        requestSyncSoon()
    }

    /// truncate(2) of a key file: the open handles' pending values, or the stored value at once.
    func kvTruncate(_ ino: InodeNumber, to size: Int64) throws(Errno) {
        guard size >= 0 else { throw .invalid }
        guard size <= Int64(kvLimits.maxValueBytes) else { throw .fileTooBig }
        let open: [KeyValueOpen] = try state.withLock { (m) throws(Errno) -> [KeyValueOpen] in
            guard let key = m.kv.key(ino) else { throw ino == KeyValueDoor.root ? .isDirectory : .notFound }
            return m.handles.values.compactMap { h in
                if case .keyValue(let o) = h, o.key == key, o.writable { return o }
                return nil
            }
        }
        if !open.isEmpty {
            state.withLock { _ in
                for o in open {
                    o.buffer = Array(o.buffer.prefix(Int(size))) + [UInt8](repeating: 0, count: max(0, Int(size) - o.buffer.count))
                    o.dirty = true
                    if size == 0 { o.tooBig = false } // a writer starting over
                }
            }
            return
        }
        try state.withLock { (m) throws(Errno) in
            guard let key = m.kv.key(ino) else { throw .notFound }
            // Read and set in one hold of the key-value store's lock: a peer's value merged
            // meanwhile is what is cut, not overwritten by a cut of the value before it.
            let cut = try storeCall { () throws(StoreError) in
                try keyValues.update(key, limits: kvLimits) { current in
                    current.map { ($0.type, Array($0.value.prefix(Int(size))) + [UInt8](repeating: 0, count: max(0, Int(size) - $0.value.count))) }
                }
            }
            if cut == nil { throw .notFound }
        }
        requestSyncSoon()
    }

    func kvUnlink(parent: InodeNumber, name: String) throws(Errno) {
        guard parent == KeyValueDoor.root else { throw .readOnly }
        // Under the filesystem's lock, as every other change to keys (a close's apply
        // reads, checks and sets in one hold).
        try state.withLock { (_) throws(Errno) in
            let removed = try storeCall { () throws(StoreError) -> Bool in try keyValues.remove(name) }
            if !removed { throw .notFound }
        }
        requestSyncSoon()
    }

    // MARK: xattrs

    func kvGetxattr(_ ino: InodeNumber, name: String) throws(Errno) -> [UInt8] {
        try state.withLock { (m) throws(Errno) -> [UInt8] in
            if ino == KeyValueDoor.root {
                let l = kvLimits
                switch name {
                case KeyValueDoor.limitsAttribute:
                    return Array("keys=\(l.maxKeys) bytes=\(l.maxTotalBytes) value=\(l.maxValueBytes) key=\(l.maxKeyBytes)".utf8)
                case KeyValueDoor.usageAttribute:
                    let usage = try storeCall { () throws(StoreError) in try keyValues.usage() }
                    return Array("keys=\(usage.keys) bytes=\(usage.bytes)".utf8)
                default: throw .noData
                }
            }
            guard let key = m.kv.key(ino) else { throw ino == KeyValueDoor.root ? .noData : .notFound }
            let pending = m.handles.values.lazy.compactMap { h -> KVType? in
                if case .keyValue(let o) = h, o.key == key, o.dirty { return o.type }
                return nil
            }.first
            let current = try storeCall { () throws(StoreError) in try keyValues.entry(key) }.flatMap { $0.isTombstone ? nil : $0 }
            switch name {
            case KeyValueDoor.typeAttribute:
                guard let type = pending ?? current?.type else { throw .noData }
                return Array(type.name.utf8)
            case KeyValueDoor.deviceAttribute:
                guard let current else { throw .noData }
                return Array(current.stamp.device.hex.utf8)
            case KeyValueDoor.timeAttribute:
                guard let current else { throw .noData }
                return Array(ISODate.format(millis: current.stamp.time / 1_000_000).utf8)
            default: throw .noData
            }
        }
    }

    /// Only the type is listed (it is the one a copy can set back); the key's device and
    /// time and the door's limits and usage are status, readable by name.
    func kvListxattr(_ ino: InodeNumber) throws(Errno) -> [String] {
        ino == KeyValueDoor.root ? [] : [KeyValueDoor.typeAttribute]
    }

    /// Setting the type: while the key is open for writing, the type its value takes at
    /// close; otherwise the stored value is converted now (EINVAL if it does not parse).
    func kvSetxattr(_ ino: InodeNumber, name: String, value: [UInt8]) throws(Errno) {
        guard name == KeyValueDoor.typeAttribute else { throw .notSupported }
        guard let text = String(validating: value, as: UTF8.self), let type = KVType(name: text.trimmingWhitespace) else {
            throw .invalid
        }
        let applied = try state.withLock { (m) throws(Errno) -> Bool in
            guard let key = m.kv.key(ino) else { throw ino == KeyValueDoor.root ? .notSupported : .notFound }
            // The handles with content to apply take the type (the CLI's open, fsetxattr,
            // write, close); a handle that changed nothing is left alone.
            var pending = false
            for case .keyValue(let o) in m.handles.values where o.key == key && o.writable && o.dirty {
                o.type = type
                pending = true
            }
            if pending { return false }
            // Read and converted in one hold of the key-value store's lock (as a truncation).
            var found = false
            let converted = try storeCall { () throws(StoreError) in
                try keyValues.update(key, limits: kvLimits) { current in
                    found = current != nil
                    guard let current, current.type != type else { return nil }
                    return (type, current.value)
                }
            }
            if !found { throw .notFound }
            return converted != nil
        }
        if applied { requestSyncSoon() }
    }

    /// A local change to publish: the sync engine's next cycle (at most the poll interval).
    func requestSyncSoon() {
        if let sync = hooks.withLock({ $0.sync }) { try? sync.requestSync() }
    }
}

extension KeyValueDoor {
    /// Whose `.kv/` and its keys are (the root's owner), and `.kv/`'s own time.
    struct Owner {
        var uid: UInt32, gid: UInt32, time: Nanos

        init(uid: UInt32, gid: UInt32, time: Nanos) {
            self.uid = uid
            self.gid = gid
            self.time = time
        }

        /// No root inode (a damaged store): uid and gid 0, and the epoch.
        init(_ root: Inode?) { self.init(uid: root?.uid ?? 0, gid: root?.gid ?? 0, time: root?.mtime ?? 0) }
    }
}

extension FileSystem.Meta {
    /// `.kv/`'s entries, with attributes. Open key files and open listings of `.kv/` keep
    /// their keys' numbers.
    mutating func kvListing(keyValues: KeyValueTable, owner: KeyValueDoor.Owner) throws(Errno) -> [DirectoryEntry] {
        var pinned: Set<InodeNumber> = []
        for handle in handles.values {
            switch handle {
            case .directory(KeyValueDoor.root, let entries?): pinned.formUnion(entries.map(\.attributes.ino))
            case .keyValue(let open): if let n = kv.existingNumber(open.key) { pinned.insert(n) }
            default: break
            }
        }
        kv.pruneUnreferenced { pinned }
        return try storeCall { () throws(StoreError) in try keyValues.entries() }.map { entry in
            DirectoryEntry(name: entry.key, attributes: Self.kvAttributes(kv.number(entry.key), entry: entry, owner: owner))
        }
    }

    /// A key file's attributes from the key-value store (the size an open handle will set
    /// shows only after its close).
    func kvAttributes(_ ino: InodeNumber, keyValues: KeyValueTable, owner: KeyValueDoor.Owner) throws(Errno) -> Attributes {
        if ino == KeyValueDoor.root { return Self.kvAttributes(ino, entry: nil, owner: owner) }
        guard let key = kv.key(ino) else { throw .notFound }
        let entry = try storeCall { () throws(StoreError) in try keyValues.entry(key) }
        let open = handles.values.contains { h in
            if case .keyValue(let o) = h { return o.key == key }
            return false
        }
        guard let entry, !entry.isTombstone else {
            if open { return Self.kvAttributes(ino, entry: nil, owner: owner) }
            throw .notFound
        }
        return Self.kvAttributes(ino, entry: entry, owner: owner)
    }

    static func kvAttributes(_ ino: InodeNumber, entry: KVEntry?, owner: KeyValueDoor.Owner) -> Attributes {
        if ino == KeyValueDoor.root {
            var a = Attributes(virtual: ino, directory: true, size: 0, time: owner.time, uid: owner.uid, gid: owner.gid)
            a.mode = UInt32(S_IFDIR) | 0o755
            return a
        }
        var a = Attributes(virtual: ino, directory: false, size: Int64(entry?.value.count ?? 0), time: entry?.stamp.time ?? 0,
                           uid: owner.uid, gid: owner.gid)
        a.mode = UInt32(S_IFREG) | 0o644
        return a
    }
}
