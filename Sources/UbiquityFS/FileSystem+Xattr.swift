import Glibc
import UbiquityStore

/// Extended attributes. `user.*` are the user's, stored with the file; `user.ubiquity.*`
/// are read-only status computed on demand (listed in the README). Other namespaces
/// are not supported.
///
/// listxattr returns only what setxattr takes back: the user's own attributes. Status
/// attributes are readable by name only (as CephFS's virtual `ceph.*`), so `cp -a`,
/// `rsync -aX` and `tar --xattrs` neither copy stale status out nor fail copying it back in.
extension FileSystem {
    static let statusPrefix = "user.ubiquity."

    /// Every status attribute a file, the mount root or a key file may answer, in the
    /// order `ubiquity status PATH` shows them: the CLI asks each by name, since none is
    /// listed. A node answers ENODATA for the ones that do not apply to it.
    public static let statusAttributeNames: [String] = [
        "version", "versions", "device", "uploaded", "dirty", "local", "downloaded", "conflicts", "tinypix", "raw",
    ].map { statusPrefix + $0 } + [syncStatusAttribute, pruneAttribute, gcAttribute, socketAttribute]
        + [KeyValueDoor.typeAttribute, KeyValueDoor.deviceAttribute, KeyValueDoor.timeAttribute,
           KeyValueDoor.limitsAttribute, KeyValueDoor.usageAttribute]

    /// A namespace prefix with nothing after it ("user.") is no name: EINVAL, as the
    /// kernel's own xattr handlers answer on ext4 (t-hostile.py checks it).
    static func checkXattrName(_ name: String) throws(Errno) {
        if name == "user." { throw .invalid }
    }

    public func getxattr(_ ino: InodeNumber, name: String) throws(Errno) -> [UInt8] {
        try Self.checkXattrName(name)
        if KeyValueDoor.owns(ino) { return try kvGetxattr(ino, name: name) }
        // Only user.* names have values, and the kernel asks for security.capability
        // before every write (to clear it): answered without the lock or the database.
        guard name.hasPrefix("user.") else { throw .noData }
        if let status = syncStatus(ino, name: name) ?? maintenanceReport(ino, name: name) ?? socketAttribute(ino, name: name) {
            return status
        }
        if let committed = try committedAttribute(ino, name: name) { return committed }
        var downloadChanged = TreeChanges()
        defer {
            // The look refreshed a stale download state (content another file's download
            // brought): watchers heard, the kernel forgets st_blocks (outside every lock).
            if !downloadChanged.isEmpty { hooks.withLock { $0.treeChanged }?(downloadChanged) }
        }
        var versionsOf: FileID?
        let value = try meta.withLock { (m, store) throws(Errno) -> [UInt8] in
            if VirtualViews.isVirtual(ino) { throw .noData }
            guard store.inode(ino) != nil else { throw .notFound }
            if name.hasPrefix(Self.statusPrefix) {
                let status = try m.status(ino, store: store)
                if status.downloadChanged {
                    downloadChanged.downloads.insert(ino)
                    publishSyncEvents(store, downloadChanged)
                }
                let key = String(name.dropFirst(Self.statusPrefix.count))
                if key == Self.versionCountKey, let fileID = status.versionsOf {
                    versionsOf = fileID
                    return []
                }
                guard let value = status.values[key] else { throw .noData }
                return Array(value.utf8)
            }
            guard let value = try storeCall({ () throws(StoreError) in try store.xattr(ino, name) }) else { throw .noData }
            return value
        }
        guard let versionsOf else { return value }
        // Counted by the versions' reader, without the locks (as `.versions/` lists them).
        let count = try storeCall { () throws(StoreError) -> Int in
            try store.prepareVersionReads()
            return try store.versions.versions(of: versionsOf).count
        }
        return Array(String(count).utf8)
    }

    /// The status attribute that counts a file's versions (`user.ubiquity.versions`).
    static let versionCountKey = "versions"

    public func listxattr(_ ino: InodeNumber) throws(Errno) -> [String] {
        if KeyValueDoor.owns(ino) { return try kvListxattr(ino) }
        return try meta.withLock { (_, store) throws(Errno) -> [String] in
            if VirtualViews.isVirtual(ino) { return [] }
            guard store.inode(ino) != nil else { throw .notFound }
            return try storeCall { () throws(StoreError) in try store.xattrNames(ino) }
        }
    }

    /// flags: XATTR_CREATE (1) fails if it exists, XATTR_REPLACE (2) if it does not.
    public func setxattr(_ ino: InodeNumber, name: String, value: [UInt8], flags: Int32) throws(Errno) {
        try Self.checkXattrName(name)
        if try control(ino, name: name, value: value) { return }
        if KeyValueDoor.owns(ino) { return try kvSetxattr(ino, name: name, value: value) }
        try meta.withLock { (m, store) throws(Errno) in
            if VirtualViews.isVirtual(ino) { throw .readOnly }
            guard store.inode(ino) != nil else { throw .notFound }
            if name.hasPrefix(Self.statusPrefix) { throw .notPermitted }
            guard name.hasPrefix("user."), name.count > 5 else { throw .notSupported }
            guard NameCodec.byteCount(name) <= 255 else { throw .range }
            guard value.count <= 65536 else { throw Errno(E2BIG) }
            // Only XATTR_CREATE (1) and XATTR_REPLACE (2) ask whether it exists.
            if flags & 3 != 0 {
                let exists = try storeCall { () throws(StoreError) in try store.xattr(ino, name) != nil }
                if flags & 1 != 0 && exists { throw .exists }
                if flags & 2 != 0 && !exists { throw .noData }
            }
            try storeCall { () throws(StoreError) in
                try store.setXattr(ino, name, value)
                try m.touchCtime(ino, store: store)
            }
        }
    }

    public func removexattr(_ ino: InodeNumber, name: String) throws(Errno) {
        try Self.checkXattrName(name)
        try meta.withLock { (m, store) throws(Errno) in
            if VirtualViews.isVirtual(ino) { throw .readOnly }
            if name.hasPrefix(Self.statusPrefix) { throw .notPermitted }
            guard name.hasPrefix("user.") else { throw .noData }
            // ENODATA is an answer, not a fault: thrown outside storeCall, which logs faults.
            let removed = try storeCall { () throws(StoreError) -> Bool in
                guard try store.removeXattr(ino, name) else { return false }
                try m.touchCtime(ino, store: store)
                return true
            }
            if !removed { throw .noData }
        }
    }
}

extension FileSystem.Meta {
    /// A change of a node's metadata (an attribute set or removed): ctime is now.
    func touchCtime(_ ino: InodeNumber, store: any FileSystemStore) throws(StoreError) {
        guard var inode = store.inode(ino) else { return }
        inode.ctime = store.clock()
        try store.update(inode)
    }

    /// Status attributes of a node (names without the `user.ubiquity.` prefix), whether
    /// looking changed its recorded download state (see `downloadState`), and the history
    /// whose versions `versions` counts (read outside the locks: `getxattr`).
    func status(_ ino: InodeNumber, store: any FileSystemStore) throws(Errno)
        -> (values: [String: String], downloadChanged: Bool, versionsOf: FileID?) {
        guard let inode = store.inode(ino), inode.kind == .file else { return ([:], false, nil) }
        let path = store.path(of: ino) ?? ""
        var result: [String: String] = [
            "local": LocalOnly.contains(path) ? "1" : "0",
            "dirty": openFiles[ino]?.content.isChanged == true ? "1" : "0",
            "conflicts": String(try storeCall { () throws(StoreError) in try store.conflictCount(at: path) }),
        ]
        let download = try downloadState(inode, store: store)
        result["downloaded"] = download.state
        if let name = store.name(of: ino), TinyPixView.applies(to: name) {
            try TinyPixView.addStatus(&result, inode: inode, store: store)
        }
        var versionsOf: FileID?
        if let row = inode.head, let head = try storeCall({ () throws(StoreError) in try store.version(row: row) }) {
            if !head.isLocal {
                result["version"] = head.id.hex
                result["device"] = head.deviceName
                result["uploaded"] = try storeCall { () throws(StoreError) in try store.isUploaded(row: row) } ? "1" : "0"
                versionsOf = inode.fileID
            }
        }
        return (result, download.changed, versionsOf)
    }

    /// `current` (every byte of the current version is here), `partial` or
    /// `not-downloaded` (Apple's Current / Downloaded / NotDownloaded); with the last
    /// fetch's failure when one failed since. `changed`: the state recorded was stale
    /// (chunks that came for other files sharing them count too, looked at again here).
    func downloadState(_ inode: Inode, store: any FileSystemStore) throws(Errno) -> (state: String, changed: Bool) {
        guard inode.absent > 0 else { return ("current", false) }
        let refreshed = try storeCall { () throws(StoreError) in try store.refreshAbsent(inode.id) }
        let state = DownloadState(allocated: inode.allocated, absent: refreshed.absent).rawValue
        if refreshed.absent == 0 { return (state, refreshed.stateChanged) }
        guard let why = store.chunks.fetchStatistics.lastFailure else { return (state, refreshed.stateChanged) }
        return ("\(state) (last fetch failed: \(why))", refreshed.stateChanged)
    }
}
