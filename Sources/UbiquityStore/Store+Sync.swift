import Glibc
import UbiquitySystem

/// What a sync pass changed in the local tree, for the filesystem to tell the kernel.
public struct TreeChanges: Sendable {
    /// Inodes whose content or attributes changed.
    public var inodes: Set<InodeNumber> = []
    /// Entries added or removed.
    public var entries: [EntryName] = []
    /// Inodes that lost their last name (forget them once nothing uses them).
    public var unlinked: [InodeNumber] = []
    /// Keys of the key-value store another device changed (for watchers).
    public var keyValues: [KVChange] = []
    /// Paths that gained a conflict version (for watchers).
    public var conflicts: [String] = []
    /// Files whose download state changed (content arrived or was evicted): their
    /// st_blocks and `user.ubiquity.downloaded`, for the kernel and watchers.
    public var downloads: Set<InodeNumber> = []
    /// Inodes whose attributes alone changed where the kernel keeps its own copy: set-id
    /// bits a write cleared (`FileSystem.dropSetID`), which the kernel does not refetch.
    public var attributes: Set<InodeNumber> = []
    /// A directory lost an execute bit: where the daemon checks permissions, the names the
    /// kernel keeps under it must expire, or it would still walk them (`FUSESession`).
    public var searchNarrowed = false
    public var isEmpty: Bool {
        inodes.isEmpty && entries.isEmpty && unlinked.isEmpty && keyValues.isEmpty && conflicts.isEmpty && downloads.isEmpty
            && attributes.isEmpty
    }
    public init() {}

    /// Whether a mode change takes an execute (search) bit away.
    public static func narrowsSearch(from old: UInt32, to new: UInt32) -> Bool { old & ~new & 0o111 != 0 }
}

/// What a pull slice (`Store.takeIn`: its records taken in, then reconciled, in one
/// transaction that a failure rolls back whole), or a fold (one savepoint:
/// `summingHistoryDirectories`), wrote and reads again: kept by the one
/// place that writes each, so a new file's record is not read back to show it, nor its
/// history to place it a second time, nor `.versions/` directory counts written per record.
struct TakeInMemo {
    /// What each file record inserted shows (by version row), from the record itself.
    var shown: [Int64: Store.ShownFile] = [:]
    /// Where each history is placed and whether it is live, as `placeHistory` left it
    /// (`retireHistory` and `dropHistory` forget it).
    var histories: [FileID: (path: String, live: Bool)] = [:]
    /// What histories placed or moved add to or take from the directories above them
    /// under `.versions/`, written once at the slice's end (`Index.writeHistoryDirectories`).
    var historyDirectories: [HistoryName: Int64] = [:]
    /// Other devices' numbers in `devices` (`Index.deviceNumber`), by id and name: a
    /// slice's records come from few devices. Gone with the slice's transaction.
    var devices: [NameKey: Int64] = [:]
    /// A savepoint rolled back inside the batch (its error caught): the sums may hold what
    /// it undid, so `writeHistoryDirectories` refuses to write them.
    var undone = false
}

/// A row of `history_dirs`: a name under `.versions/` and the directory it is in,
/// compared by bytes (two names that differ only in Unicode normalization are two rows).
struct HistoryName: Hashable {
    let parent: String
    let name: String

    static func == (a: HistoryName, b: HistoryName) -> Bool { NameKey(a.parent) == NameKey(b.parent) && NameKey(a.name) == NameKey(b.name) }
    func hash(into hasher: inout Hasher) {
        NameKey(parent).hash(into: &hasher)
        hasher.combine(0xFF as UInt8) // no name holds it: the parent ends here
        NameKey(name).hash(into: &hasher)
    }
}

public struct EntryName: Sendable, Equatable {
    public var parent: InodeNumber
    public var name: String
}

/// The local half of sync: turning local changes into records (`recordLocalChanges`),
/// taking in other devices' records (`addRemote`), and making the tree show the synced
/// view (`reconcile`). The caller runs them in that order under one lock, so the tree
/// never shows a view that forgot a local change. Backing-directory I/O is UbiquitySync's.
extension Store {
    // MARK: local changes -> records

    /// Records what changed locally since the last call and has no record yet: renames,
    /// chmod, utimens and xattrs of files (meta records), directories and symlinks made,
    /// changed or removed. Unsaved writes are not changes yet: they become records when
    /// committed. Works through the change set (`changed`, `vacated`): an idle call does
    /// nothing, and a change costs its own inodes and paths. The first call after opening
    /// looks at the whole tree once instead (`needsFullScan`).
    public func recordLocalChanges(busy: Set<InodeNumber>) throws(StoreError) {
        while try recordLocalChangesSlice(busy: busy) {}
    }

    /// How many changed inodes, and then orphaned histories, one slice takes.
    static let changesPerSlice = 64

    /// One slice of `recordLocalChanges`, its own transaction; returns whether more
    /// remains. The sync engine holds the store's lock for one slice at a time: in one
    /// step, a burst of saves (an editor's 1,000 temp-file renames) would hold it for
    /// hundreds of milliseconds while every request waits.
    public func recordLocalChangesSlice(busy: Set<InodeNumber>) throws(StoreError) -> Bool {
        guard !readOnly else { return false }
        try reloadSyncSetsIfStale()
        if needsFullScan {
            try syncStep { () throws(StoreError) in
                try recordAllLocalChanges()
                try db.query("DELETE FROM settings WHERE key = 'full_scan'")
            }
            needsFullScan = false
            return false
        }
        // What a directory's move left below it first: its inodes go into `changed`.
        if !moved.isEmpty {
            _ = try settleMoves()
            return true
        }
        // A save's inode is in `changed` until the slice that records it, after its fold
        // (the step's first act) and the view's catch-up: a record folded without a
        // change left (the rest of a catch-up) is looked for last.
        guard !changed.isEmpty || !vacated.isEmpty || !recheck.isEmpty || !orphaned.isEmpty || claimedIndex.mayHaveUnviewed else { return false }
        // The paths to look at again are mostly looked at in the same slice (`queueUnshownPaths`):
        // rows written for them would be deleted unseen, two statements a path (a file deleted).
        // The view takes in this device's records a slice at a time (a `tar -x` folds
        // thousands), and the changes are recorded once it has them all: which records
        // a change makes depends on what the view shows.
        return try syncStep(viewing: false) { () throws(StoreError) -> Bool in
            try recheck.holdingWrites { () throws(StoreError) -> Bool in
                if try claimedIndex.viewOwnRecords(limit: Self.recordsViewedPerSlice) { return true }
                return try recordChanges(limit: Self.changesPerSlice)
            }
        }
    }

    /// How many of this device's records the view takes in per slice.
    static let recordsViewedPerSlice = 256

    /// Runs a step of sync as one transaction: what it consumes of the change set goes
    /// with what it records. If it fails, the sets are read again (the rollback put back
    /// what it had taken) and the tree cache starts over. `viewing`: the view first takes
    /// in every record of this device's it lacks, as whatever the step does reads it.
    /// What the records it takes in wrote of the view is remembered until the step's
    /// conflict counts are written, at its end (`Replica.remembering`): read back, it
    /// cost two statements per new file.
    func syncStep<T>(viewing: Bool = true, _ body: () throws(StoreError) -> T) throws(StoreError) -> T {
        try reloadSyncSetsIfStale()
        do {
            return try standaloneStep { () throws(StoreError) -> T in
                try replica.remembering { () throws(StoreError) -> T in
                    try replica.deferringConflicts { () throws(StoreError) -> T in
                        if viewing { _ = try claimedIndex.viewOwnRecords() }
                        return try body()
                    }
                }
            }
        } catch {
            forgetCachedTree()
            syncSetsStale = true
            try? reloadSyncSetsIfStale()
            throw error
        }
    }

    /// Reads the change sets again after a step rolled back. Until that read succeeds no
    /// step runs: a set that still lacks what the rollback put back in its table would
    /// leave a local change without a record, never synced.
    private func reloadSyncSetsIfStale() throws(StoreError) {
        guard syncSetsStale else { return }
        try changed.reload(parse: Self.changedInode)
        try moved.reload(parse: Self.changedInode)
        for set in [vacated, recheck, unreconciled] { try set.reload(parse: NameKey.init) }
        for set in [orphaned, held] { try set.reload(parse: { FileID(hex: $0) }) }
        syncSetsStale = false
    }

    /// Returns whether more remains (`limit` reached).
    private func recordChanges(limit: Int) throws(StoreError) -> Bool {
        for id in try changed.removeSome(limit) where id != Store.rootInode {
            guard let inode = try node(id)?.inode, inode.nlink > 0 else { continue }
            if case .file(let node) = try recordChange(of: inode) { try held.insert(node) }
        }
        if !changed.isEmpty { return true }
        // Histories no inode holds any more (an inode took another history: a rename over
        // a file, a move to a local-only name; the inode was a history's only holder, as
        // every history has one inode). Found by node, not by path: a hard-linked file's
        // path is its first name, which need not be the name that went (else such records
        // stay shown: t-differential seed 935078509).
        for node in try orphaned.removeSome(limit) where !held.contains(node) {
            guard let current = try replica.current(.file(node)), current.kind == .file else { continue }
            try recordRemoval(of: current)
        }
        if !orphaned.isEmpty { return true }
        try held.removeAll()
        // What was removed or moved away: the nodes the view showed there that the tree no
        // longer has. Directories and symlinks are nodes by path: gone. A file node of this
        // device's own is gone too (deleted, or orphaned: an editor's temp file renamed over
        // a file continues the target's history, not its own). Another device's file node
        // still there is one this tree never showed (a conflict loser that is now the
        // winner, a file made under a directory removed here): reconcile shows it, so
        // nothing another device made is lost (simulation seed 187).
        // Which records are shown is decided before any tombstone.
        var removed: [Replica.Record] = []
        var paths: [String] = []
        for key in vacated.members {
            for record in try replica.currentRecords(atOrBelow: key.name) {
                paths.append(record.path)
                guard record.kind != .file || record.device == deviceID else { continue }
                if try !presentLocally(record), try mustBeInTree(record) { removed.append(record) }
            }
        }
        for record in removed { try recordRemoval(of: record) }
        // The paths under what went are looked at again: those just read, unless tombstones
        // changed what is shown there (then read again, with what they revealed).
        if !removed.isEmpty {
            paths = []
            for key in vacated.members { paths += try replica.currentRecords(atOrBelow: key.name).map(\.path) }
        }
        for path in paths { try recheck.insert(NameKey(path)) }
        try queueUnshownPaths()
        if getenv("UBQ_VERIFY_SYNC_SCAN") != nil { try verifyIncrementalScan() }
        try vacated.removeAll()
        return false
    }

    /// Calls `body` with every named inode but the root, a page of ids at a time (the
    /// whole-tree scan after an upgrade, and the self-check).
    private func forEachNamedInode(_ body: (Inode) throws(StoreError) -> Void) throws(StoreError) {
        var last = Store.rootInode
        while true {
            let ids = try db.rows("SELECT id FROM inodes WHERE id > ? AND nlink > 0 ORDER BY id LIMIT 10000", [.inode(last)]) { $0.inode(0) }
            guard let end = ids.last else { return }
            for id in ids { if let inode = try node(id)?.inode { try body(inode) } }
            last = end
        }
    }

    /// The whole-tree form of `recordLocalChanges` (once, after an upgrade from a store
    /// before format 4, which kept its change set in memory only).
    private func recordAllLocalChanges() throws(StoreError) {
        var seen = SeenNodes()
        try forEachNamedInode { (inode) throws(StoreError) in
            if let node = try recordChange(of: inode) { seen.insert(node) }
        }
        // Nodes the view shows that the tree lacks: deleted here (tombstone), or not shown
        // yet (queue them for reconcile). Shown ones are chosen before any tombstone (see
        // `recordLocalChanges`).
        var shown: [Replica.Record] = []
        for record in try replica.allCurrent() where try mustBeInTree(record) { shown.append(record) }
        for record in shown {
            if seen.holds(record) { continue }
            // A path still queued for reconcile is not shown yet; a record of this device's
            // own that the tree lacks was deleted (an editor's temp file renamed over a
            // file, or a removal the crash kept from the change set); another device's is
            // shown by the next reconcile.
            if isVacated(record.path) || (record.device == deviceID && !unreconciled.contains(NameKey(record.path))) {
                try recordRemoval(of: record)
            } else {
                try unreconciled.insert(NameKey(record.path))
            }
        }
        try changed.removeAll()
        try vacated.removeAll()
        try orphaned.removeAll()
        try queueUnshownPaths()
    }

    /// Makes the tree and the view agree at the paths in `recheck`. Where the view shows
    /// another device's node, or a directory, that the tree does not show: queued for
    /// reconcile. Where it shows a node of this device's own that the tree does not have
    /// there, that node is gone (its inode moved on or took another history; a tombstone
    /// of the node shown before can reveal it: t-differential seed 1968428888): a
    /// tombstone, and the path is looked at again. Own nodes the tree has are never
    /// queued: the tree is the truth for them (a hard link's other name, a file being
    /// written that continues a history).
    private func queueUnshownPaths() throws(StoreError) {
        while let key = try recheck.popFirst() {
            if unreconciled.contains(key) { continue }
            switch try replica.state(at: key.name).shown {
            case .none: continue
            case .directory:
                if try find(key.name) != nil { continue }
            case .node(let record):
                if record.device == deviceID {
                    if try !presentLocally(record) { try recordRemoval(of: record) } // puts key back in recheck
                    continue
                }
                // The file must show the current version too, not just the same history:
                // its own new version may lose to another device's (simulation seed 338).
                // One that continues the history but has no version yet is being written.
                if try presentLocally(record) {
                    guard record.kind == .file, let (_, _, id) = try find(key.name), let head = try node(id)?.inode.head,
                          head != record.row else { continue }
                }
            }
            try unreconciled.insert(key)
        }
    }

    /// A self-check for tests (UBQ_VERIFY_SYNC_SCAN=1, which t-differential.py sets): after
    /// an incremental sync step, walks the whole tree as the first step after mounting
    /// does and logs a `sync-scan check:` line for anything that walk would still record.
    /// It costs a walk of the tree per step, so it is never on by default.
    private func verifyIncrementalScan() throws(StoreError) {
        var seen = SeenNodes()
        try forEachNamedInode { (inode) throws(StoreError) in
            guard let path = try treePath(of: inode.id), !LocalOnly.contains(path) else { return }
            switch inode.kind {
            case .file:
                guard let node = inode.fileID else { return }
                seen.insert(.file(node))
                if let row = inode.head, let head = try db.rows("SELECT path, local, file_id FROM versions WHERE row = ?", [.int(row)], { (path: $0.text(0), local: $0.int(1) != 0, node: $0.nodeID(2)) }).first,
                   !head.local, head.node == .file(node), !head.path.utf8.elementsEqual(path.utf8) {
                    log("sync-scan check: file \(path) (inode \(inode.id)) has head path \(head.path)")
                }
            case .directory:
                seen.insert(.directory(path))
                let shown = try replica.state(at: path).shown
                if case .directory = shown {} else { log("sync-scan check: dir \(path) not shown as dir: \(shown)") }
            case .symlink:
                seen.insert(.symlink(path))
            default: break
            }
        }
        for record in try replica.allCurrent() where try mustBeInTree(record) {
            if !seen.holds(record) {
                let holders = try db.rows("SELECT id FROM inodes WHERE file_id = ?", [.node(record.node)]) { $0.inode(0) }
                    .map { "inode \($0) nlink \(inode($0)?.nlink ?? 0) path \(path(of: $0) ?? "nil")" }
                log("sync-scan check: shown but missing: \(record.kind) \(record.path) node \(record.node.description.prefix(12)) device \(record.device == deviceID ? "own" : "other") holders \(holders)")
            }
        }
    }

    enum Seen { case file(FileID), directory(String), symlink(String) }

    /// What a walk of the tree found: files by history, directories and symlinks by path
    /// and kind (a symlink record where the tree has a directory is not there; the same
    /// rule as `presentLocally`).
    struct SeenNodes {
        private var files: Set<FileID> = []
        private var directories: Set<NameKey> = []
        private var symlinks: Set<NameKey> = []

        mutating func insert(_ seen: Seen) {
            switch seen {
            case .file(let node): files.insert(node)
            case .directory(let path): directories.insert(NameKey(path))
            case .symlink(let path): symlinks.insert(NameKey(path))
            }
        }

        func holds(_ record: Replica.Record) -> Bool {
            switch record.kind {
            case .file: return record.node.fileID.map(files.contains) == true
            case .directory: return directories.contains(NameKey(record.path))
            case .symlink: return symlinks.contains(NameKey(record.path))
            default: return false
            }
        }
    }

    /// Records `inode`'s state if the view does not show it yet; returns how the tree
    /// shows it (nil: a node that does not sync).
    private func recordChange(of inode: Inode) throws(StoreError) -> Seen? {
        guard let path = try treePath(of: inode.id) else { return nil }
        if LocalOnly.contains(path) {
            // Moved to a local-only name: for the other devices the file is gone.
            if inode.kind == .file, let node = inode.fileID, let current = try replica.current(.file(node)), !LocalOnly.contains(current.path) {
                try recordRemoval(of: current)
            }
            return nil
        }
        switch inode.kind {
        case .file:
            guard let node = inode.fileID else { return nil }
            // Also for files open for writing: their committed content with today's
            // path, so the view never keeps a stale path (a stale implied directory could
            // replace a symlink: t-differential seed 889786859).
            try recordFileMetadata(inode, path: path)
            return .file(node)
        case .directory:
            // Only a directory record of its own keeps it shown: one implied by the nodes
            // below it goes when they go (else a directory whose files move out after the
            // scan has passed it is lost: t-differential seed 394416407).
            if try replica.current(.directory(path)) != nil, case .directory(let mode) = try replica.state(at: path).shown,
               mode == inode.mode & 0o7777 { return .directory(path) }
            try recordNode(.directory(path), kind: .directory, path: path, mode: inode.mode & 0o7777, mtime: inode.mtime)
            return .directory(path)
        case .symlink:
            let node = NodeID.symlink(path)
            if let current = try replica.current(node), current.target == inode.target,
               case .node(let shown) = try replica.state(at: path).shown, shown.id == current.id { return .symlink(path) }
            try recordNode(node, kind: .symlink, path: path, mode: 0o777, mtime: inode.mtime, target: inode.target)
            return .symlink(path)
        default:
            return nil // fifos, sockets and device nodes stay local
        }
    }

    /// Whether the tree has `record`'s node at its path: the same history for a file; a
    /// directory, or a symlink named there by its primary name, for those (as the
    /// whole-tree scan counts them: another name of a hard-linked symlink is local, and
    /// counting it would keep a removed directory's record alive: t-differential
    /// seed 308010073).
    private func presentLocally(_ record: Replica.Record) throws(StoreError) -> Bool {
        guard let (_, _, id) = try find(record.path), let inode = try lookUp(id), !LocalOnly.contains(record.path) else { return false }
        switch record.kind {
        case .file: return inode.kind == .file && inode.fileID.map { NodeID.file($0) } == record.node
        // By kind: a symlink record where the tree has a directory is not there. Counted as
        // there, it stayed current under the directory and came back when the directory
        // went (t-differential seed 1949766429).
        case .directory: return inode.kind == .directory
        case .symlink:
            guard inode.kind == .symlink, let primary = try treePath(of: id) else { return false }
            return primary.utf8.elementsEqual(record.path.utf8)
        default: return false
        }
    }

    /// Whether the tree must hold `record` (else it was removed here, or is not shown yet):
    /// every record the view shows, and a symlink of this device's own that only this
    /// device's records hide. That one was replaced here (a directory made where it was):
    /// kept, it was a false conflict under the directory and came back when the directory
    /// went (t-differential seed 1949766429). Hidden by another device's records it is a
    /// conflict version, kept.
    private func mustBeInTree(_ record: Replica.Record) throws(StoreError) -> Bool {
        if try isShown(record) { return true }
        guard record.kind == .symlink, record.device == deviceID else { return false }
        return try replica.currentRecords(atOrBelow: record.path).allSatisfy { $0.device == deviceID }
    }

    /// Whether the view shows `record` at its path (a conflict version never is).
    private func isShown(_ record: Replica.Record) throws(StoreError) -> Bool {
        switch try replica.state(at: record.path).shown {
        case .node(let shown): return shown.id == record.id
        case .directory: return record.kind == .directory
        case .none: return false
        }
    }

    /// A tombstone for a node the view showed but the tree lost.
    private func recordRemoval(of record: Replica.Record) throws(StoreError) {
        try recordNode(record.node, kind: record.kind, path: record.path, mode: 0, mtime: clock(), tombstone: true)
    }

    /// A meta record when a file's path, mode, mtime or xattrs differ from its head's.
    private func recordFileMetadata(_ inode: Inode, path: String) throws(StoreError) {
        guard let row = inode.head,
              let head = try db.rows("SELECT id, file_id, path, mode, mtime, xattrs, local FROM versions WHERE row = ?", [.int(row)], {
                  (id: $0.versionID(0), node: $0.nodeID(1), path: $0.text(2), mode: UInt32($0.int(3)), mtime: $0.int(4),
                   xattrs: $0.isNull(5) ? [] : $0.blob(5), local: $0.int(6) != 0)
              }).first,
              !head.local, let fileID = inode.fileID, head.node == .file(fileID) else { return }
        let xattrs = try currentXattrs(inode.id)
        if head.path.utf8.elementsEqual(path.utf8) && head.mode == inode.mode && head.mtime == inode.mtime
            && head.xattrs == XattrCodec.encode(xattrs) { return }
        let record = SyncRecord(id: .new(), node: head.node, kind: .file, parents: [head.id],
                                deviceID: deviceID, deviceName: deviceName, committed: clock(), mtime: inode.mtime,
                                mode: inode.mode, isTombstone: false, isMeta: true, path: path,
                                chunks: try chunkList(row: row), xattrs: xattrs)
        let newRow = try insert(record, from: .here)
        var updated = inode
        updated.head = newRow
        try save(updated)
        try setHistory(fileID, path: path, live: true)
    }

    /// A record of a directory or symlink node, or a tombstone of any node, descending
    /// from all its heads.
    private func recordNode(_ node: NodeID, kind: NodeKind, path: String, mode: UInt32, mtime: Nanos,
                            target: String? = nil, tombstone: Bool = false) throws(StoreError) {
        let parents = try replica.heads(node).map(\.id).sorted()
        if tombstone, try replica.liveHeads(node).isEmpty { return }
        let record = SyncRecord(id: .new(), node: node, kind: kind, parents: parents, deviceID: deviceID,
                                deviceName: deviceName, committed: clock(), mtime: mtime, mode: mode,
                                isTombstone: tombstone, isMeta: false, path: path, target: tombstone ? nil : target)
        _ = try insert(record, from: .here)
        if tombstone, let fileID = node.fileID {
            try retireHistory(fileID)
        }
    }

    private func isVacated(_ path: String) -> Bool {
        if vacated.isEmpty { return false }
        return ([path] + PathBytes.ancestors(path)).contains { vacated.contains(NameKey($0)) }
    }

    // MARK: remote records

    /// Takes in records from other devices (their chunks are already in the chunk store).
    /// Returns how many were new.
    /// `checked`: the caller found none of `records` held or pruned here just before
    /// (`knownRecords`, in the same cycle: only the sync engine adds other devices'
    /// records), so they are not looked up again one by one.
    @discardableResult
    public func addRemote(_ records: [SyncRecord], checked: Bool = false) throws(StoreError) -> Int {
        var added = 0
        var seen: Set<VersionID> = []
        try standaloneStep { () throws(StoreError) in
            try replica.deferringConflicts { () throws(StoreError) in
            _ = try claimedIndex.viewOwnRecords()
            for record in records where record.deviceID != deviceID && seen.insert(record.id).inserted {
                if !checked {
                    if try replica.record(id: record.id) != nil { continue }
                    if try isPrunedRecord(record.id) { continue }
                }
                _ = try insert(record, from: .otherDevice)
                added += 1
            }
            }
        }
        return added
    }

    /// A pull slice: other devices' records (checked as `addRemote` says), then the tree
    /// made to show them, in one transaction (one commit), with what the view shows at
    /// each path worked out once for both.
    public func takeIn(_ records: [SyncRecord], busy: Set<InodeNumber>) throws(StoreError) -> TreeChanges {
        // The batch first, and its fold, outside the slice's memo: the fold commits on its
        // own, so what it sums must not wait for the slice's end, which a failure skips
        // (`TakeInFailureTests`).
        // Moved files' histories at their paths, and their inodes in `changed`, before
        // anything another device made is placed among them.
        try settleAllMoves()
        try commitBatch()
        takingIn = TakeInMemo()
        defer { takingIn = nil }
        return try replica.remembering { () throws(StoreError) -> TreeChanges in
            try syncStep { () throws(StoreError) -> TreeChanges in
                try unreconciled.holdingWrites { () throws(StoreError) -> TreeChanges in
                    if !records.isEmpty {
                        try replica.rememberNewNodes(Set(records.map(\.node)))
                        let (fresh, rest) = try freshRecords(records)
                        try takeInFresh(fresh)
                        _ = try addRemote(rest, checked: true)
                    }
                    let changes = try reconcile(busy: busy)
                    try claimedIndex.writeHistoryDirectories()
                    return changes
                }
            }
        }
    }

    // MARK: uploads

    /// This device's records not yet in the backing directory, oldest first.
    public func pendingUploads(limit: Int) throws(StoreError) -> [SyncRecord] {
        let batch = try ownRecords("uploaded = 0", after: 0, limit: limit).map(\.record)
        // The engine uploads them without the lock; until `markUploaded` they must stay.
        uploadsInFlight = Set(batch.map(\.id))
        return batch
    }

    /// This device's records matching `condition` after row `after`, in row order.
    func ownRecords(_ condition: String, after: Int64, limit: Int) throws(StoreError) -> [(row: Int64, record: SyncRecord)] {
        try db.rows("""
            SELECT id, file_id, kind, parents, device_id, device_name, committed, mtime, mode, tombstone, meta, path,
                   chunks, target, xattrs, row, lineage
            FROM \(Store.versionsWithDevices) WHERE \(condition) AND local = 0 AND device_id = ? AND row > ? ORDER BY row LIMIT ?
            """, [.device(deviceID), .int(after), .int(Int64(limit))]) { r in
            var record = SyncRecord(id: r.versionID(0), node: r.nodeID(1), kind: NodeKind(rawValue: r.int(2)) ?? .file,
                        parents: r.versionIDs(3), deviceID: r.deviceID(4), deviceName: r.text(5), committed: r.int(6),
                        mtime: r.int(7), mode: UInt32(r.int(8)), isTombstone: r.int(9) != 0, isMeta: r.int(10) != 0,
                        path: r.text(11), chunks: ChunkList(encoded: r.blob(12)) ?? ChunkList(),
                        target: r.isNull(13) ? nil : r.text(13), xattrs: r.isNull(14) ? [] : XattrCodec.decode(r.blob(14)))
            record.lineage = Lineage.column(r.isNull(16) ? nil : r.text(16), device: r.deviceID(4))
            return (r.int(15), record)
        }
    }

    public var pendingUploadCount: Int {
        (try? db.rows("SELECT count(*) FROM \(Store.versionsWithDevices) WHERE uploaded = 0 AND local = 0 AND device_id = ?", [.device(deviceID)]) { Int($0.int(0)) }.first) ?? 0
    }

    public func markUploaded(_ ids: [VersionID]) throws(StoreError) {
        // Around the gate: the records pushed were read from SQLite (`pendingUploads`
        // folds), and no change the overlay holds rewrites a folded version's row; through
        // it, every segment pushed would fold what a running burst left, under the lock. A
        // write: the connection is claimed first, or a loan would send it to the reader.
        db.claim()
        try db.aroundGate { () throws(StoreError) in
            try db.transaction { () throws(StoreError) in
                for id in ids { try db.query("UPDATE versions SET uploaded = 1 WHERE id = ?", [.id(id)]) }
                try addToSetting(Self.journalRecordsKey, Int64(ids.count))
            }
        }
        // Committed here: the next hold that changes the tree would commit a batch left
        // open, and fold the overlay on a request's path (`logTreeChanges`).
        try commitBatchWithoutFold()
        uploadsInFlight.subtract(ids)
    }

    public func isUploaded(row: Int64) throws(StoreError) -> Bool {
        try db.rows("SELECT uploaded FROM versions WHERE row = ?", [.int(row)]) { $0.int(0) != 0 }.first ?? false
    }

    // MARK: records -> tree

    /// Makes the tree show the synced view at every path queued since the last call.
    /// A path whose local file is `busy` (or new, or not ours to remove), or that a local
    /// change not recorded yet touched, waits for a later call. Removing a local entry
    /// here never records a tombstone: the view already says it is gone.
    public func reconcile(busy: Set<InodeNumber>) throws(StoreError) -> TreeChanges {
        var changes = TreeChanges()
        guard !unreconciled.isEmpty, !readOnly else { return changes }
        try syncStep { () throws(StoreError) in changes = try reconcileQueued(busy: busy) }
        return changes
    }

    private func reconcileQueued(busy: Set<InodeNumber>) throws(StoreError) -> TreeChanges {
        tracksChanges = false
        defer { tracksChanges = true }
        return try creatingInBulk { () throws(StoreError) in try reconcilePlans(busy: busy) }
    }

    private func reconcilePlans(busy: Set<InodeNumber>) throws(StoreError) -> TreeChanges {
        var changes = TreeChanges()
        var plans: [(String, Replica.Shown)] = []
        // Directories looked up once per call (the paths of a slice share a few parents),
        // and so is their absence (a joining device's new directory is looked for by each
        // of its files before it is made); dropped whenever an entry goes (a directory
        // removed or replaced below), set when reconcile makes one. By bytes (`NameKey`).
        var directories: [NameKey: InodeNumber?] = [:]
        func directory(_ path: String) throws(StoreError) -> InodeNumber? {
            if let known = directories[NameKey(path)] { return known }
            let found = try findDirectory(path)
            directories[NameKey(path)] = .some(found)
            return found
        }
        func entry(_ path: String) throws(StoreError) -> (InodeNumber, String, InodeNumber)? {
            guard let (parentPath, name) = splitPath(path), let parent = try directory(parentPath), let id = try childID(parent, name) else { return nil }
            return (parent, name, id)
        }
        var deferred: Set<NameKey> = []
        for key in try unreconciled.removeAll() {
            // Removed or moved away here since local changes were last recorded (a pull
            // slice's reconcile runs without recording them first: SyncEngine+Pull): the
            // view still shows what was there, and making it again would undo the rename.
            // The next sync step records the change, then reconciles the path.
            if isVacated(key.name) { deferred.insert(key); continue }
            plans.append((key.name, try replica.state(at: key.name).shown))
        }
        // Deepest first (removals), shallowest first (creations); counted once per path,
        // not in the sort's comparisons.
        let byDepth = plans.map { (depth: $0.0.utf8.reduce(0) { $0 + ($1 == UInt8(ascii: "/") ? 1 : 0) }, plan: $0) }
            .sorted { $0.depth < $1.depth }.map(\.plan)
        // The entries at the queued paths, looked up together per directory (one statement
        // per path would be one per record of a join): good for each path's first look, which
        // comes before anything at it or above it changes (deepest paths go first).
        var firstLook: [NameKey: InodeNumber?] = [:]
        var byParent: [NameKey: [(name: String, path: String)]] = [:]
        for (path, _) in plans {
            if let (parentPath, name) = splitPath(path) { byParent[NameKey(parentPath), default: []].append((name, path)) }
        }
        for (parentPath, names) in byParent {
            guard let parent = try directory(parentPath.name) else { continue }
            let found = try children(parent, named: names.map(\.name))
            for (name, path) in names { firstLook[NameKey(path)] = .some(found[NameKey(name)]) }
        }
        func firstEntry(_ path: String) throws(StoreError) -> (InodeNumber, String, InodeNumber)? {
            guard let looked = firstLook.removeValue(forKey: NameKey(path)) else { return try entry(path) }
            guard let id = looked, let (parentPath, name) = splitPath(path), let parent = try directory(parentPath) else { return nil }
            return (parent, name, id)
        }

        // Paths with no entry now (most of a device's first sync): not looked up again.
        var absent: Set<NameKey> = []
        // Directories that gained entries, with how many of those are directories.
        var touched: [InodeNumber: Int] = [:]
        func touch(_ parent: InodeNumber, directory: Bool) { touched[parent, default: 0] += directory ? 1 : 0 }
        for (path, shown) in byDepth.reversed() {
            guard let (parent, name, id) = try firstEntry(path) else { absent.insert(NameKey(path)); continue }
            guard let inode = try node(id)?.inode else { continue }
            if matches(inode, shown) { continue }
            guard removable(inode, busy: busy), try !isUnrecordedMove(inode, to: path) else {
                deferred.insert(NameKey(path)); continue
            }
            try removeEntry(parent: parent, name: name)
            directories = [:]
            try vacated.remove(NameKey(path))
            changes.entries.append(EntryName(parent: parent, name: name))
            if try node(id)?.inode.nlink == 0 { changes.unlinked.append(id) }
            if inode.kind == .file, let node = inode.fileID, try replica.current(.file(node)) == nil {
                try retireHistory(node)
            }
        }
        for (path, shown) in byDepth where !deferred.contains(NameKey(path)) {
            if case .none = shown { continue }
            if !absent.contains(NameKey(path)), let (_, _, id) = try entry(path) {
                guard var inode = try node(id)?.inode, matches(inode, shown) else { deferred.insert(NameKey(path)); continue }
                switch shown {
                case .directory(let mode) where inode.mode & 0o7777 != mode:
                    if TreeChanges.narrowsSearch(from: inode.mode, to: mode) { changes.searchNarrowed = true }
                    inode.mode = mode
                    try update(inode)
                    changes.inodes.insert(id)
                case .node(let record) where record.kind == .file && inode.head != record.row:
                    if busy.contains(id) { deferred.insert(NameKey(path)); continue }
                    try show(record, on: id)
                    changes.inodes.insert(id)
                default: break
                }
            } else {
                guard let (parentPath, name) = splitPath(path), let parent = try directory(parentPath) else {
                    deferred.insert(NameKey(path)); continue
                }
                switch shown {
                case .none: continue
                case .directory(let mode):
                    directories[NameKey(path)] = try create(parent: parent, name: name, kind: .directory, mode: mode, uid: getuid(), gid: getgid(),
                                                   touchingParent: false).id
                    touch(parent, directory: true)
                case .node(let record) where record.kind == .file:
                    guard let file = try shownFile(record) else { deferred.insert(NameKey(path)); continue }
                    let id = try create(parent: parent, name: name, kind: .file, mode: 0o644, uid: getuid(), gid: getgid(),
                                        fileID: record.node.fileID, touchingParent: false) { apply(file, of: record, to: &$0) }.id
                    try finishShowing(file, of: record, on: id)
                    touch(parent, directory: false)
                case .node(let record):
                    _ = try create(parent: parent, name: name, kind: record.kind, mode: record.kind == .symlink ? 0o777 : 0o644,
                                   uid: getuid(), gid: getgid(), target: record.target, touchingParent: false)
                    touch(parent, directory: false)
                }
                changes.entries.append(EntryName(parent: parent, name: name))
                changes.inodes.insert(parent)
            }
        }
        // Each parent's times and link count once, however many entries it gained.
        for (parent, subdirectories) in touched { try touchDirectory(parent, subdirectories: subdirectories) }
        try unreconciled.formUnion(deferred)
        return changes
    }

    /// What a file shows of a version: its content, mode, mtime and xattrs.
    struct ShownFile {
        let content: ChunkList
        let mode: UInt32
        let mtime: Nanos
        let xattrs: [UInt8]
    }

    private func shownFile(_ record: Replica.Record) throws(StoreError) -> ShownFile? {
        if let known = takingIn?.shown[record.row] { return known }
        guard let row = try db.rows("SELECT mode, mtime, xattrs, chunks FROM versions WHERE row = ?", [.int(record.row)], {
            (mode: UInt32($0.int(0)), mtime: $0.int(1), xattrs: $0.isNull(2) ? [] : $0.blob(2), chunks: $0.blob(3))
        }).first else { return nil }
        guard let content = ChunkList(encoded: row.chunks) else { throw .database("version row \(record.row) has a malformed chunk list") }
        return ShownFile(content: content, mode: row.mode, mtime: row.mtime, xattrs: row.xattrs)
    }

    private func apply(_ file: ShownFile, of record: Replica.Record, to inode: inout Inode) {
        inode.fileID = record.node.fileID
        inode.head = record.row
        inode.size = file.content.totalSize
        inode.allocated = file.content.storedBytes
        inode.absent = absentBytes(file.content)
        inode.mode = file.mode
        inode.mtime = file.mtime
        inode.ctime = clock()
    }

    /// Shows file record `record` as inode `id`'s current version.
    private func show(_ record: Replica.Record, on id: InodeNumber) throws(StoreError) {
        guard var inode = try node(id)?.inode, let file = try shownFile(record) else { return }
        apply(file, of: record, to: &inode)
        continuedParents[id] = nil
        try update(inode)
        try dropXattrs(id)
        try dropReservedRanges(id) // another device's content replaced what they reserved
        try finishShowing(file, of: record, on: id)
    }

    /// The xattrs and the history of a file just shown.
    private func finishShowing(_ file: ShownFile, of record: Replica.Record, on id: InodeNumber) throws(StoreError) {
        for entry in XattrCodec.decode(file.xattrs) { try setXattr(id, "user." + entry.name, entry.value) }
        if let fileID = record.node.fileID { try setHistory(fileID, path: record.path, live: true) }
    }

    private func matches(_ inode: Inode, _ shown: Replica.Shown) -> Bool {
        switch shown {
        case .none: return false
        case .directory: return inode.kind == .directory
        case .node(let record):
            if record.kind == .file { return inode.kind == .file && inode.fileID.map { NodeID.file($0) } == record.node }
            return inode.kind == .symlink && inode.target == record.target
        }
    }

    /// Whether sync may take this entry away: never a file with unsaved writes, without a
    /// saved version or with other names, a non-empty directory, a fifo or socket.
    private func removable(_ inode: Inode, busy: Set<InodeNumber>) -> Bool {
        switch inode.kind {
        case .file:
            // A hard link's other names are local (a node has one path): never taken away
            // (else they are lost when a remount changes which name comes first:
            // t-differential seed 889786859).
            return !busy.contains(inode.id) && inode.head != nil && inode.nlink <= 1
        case .directory: return isEmptyDirectory(inode.id)
        case .symlink: return true
        default: return false
        }
    }

    /// Whether file `inode` came to `path` by a local rename not recorded yet (its head
    /// record names another path; the next sync step records the move,
    /// `recordFileMetadata`). Taken away for another device's node now, its own record
    /// would be tombstoned as deleted; recorded first, it loses by the conflict rules.
    private func isUnrecordedMove(_ inode: Inode, to path: String) throws(StoreError) -> Bool {
        guard inode.kind == .file, let row = inode.head, let node = inode.fileID else { return false }
        let recorded = try db.rows("SELECT path FROM versions WHERE row = ? AND local = 0 AND file_id = ?",
                                   [.int(row), .id(node)]) { $0.text(0) }.first
        return recorded.map { !$0.utf8.elementsEqual(path.utf8) } ?? false
    }

    /// (parent, name, inode) of the entry at `path`.
    public func locate(_ path: String) -> (InodeNumber, String, InodeNumber)? {
        logged("look up \(path)") { () throws(StoreError) in try find(path) }
    }

    /// `locate` with a failed read thrown, for sync, which decides from the answer: a
    /// read that failed must not pass for an absent entry (a tombstone of a file that is there).
    func find(_ path: String) throws(StoreError) -> (InodeNumber, String, InodeNumber)? {
        guard let (parentPath, name) = splitPath(path), let parent = try findDirectory(parentPath),
              let id = try childID(parent, name) else { return nil }
        return (parent, name, id)
    }

    /// The directory at `path` ("" is the root).
    func findDirectory(_ path: String) throws(StoreError) -> InodeNumber? {
        var current = Store.rootInode
        for component in PathBytes.components(path) {
            guard let next = try childID(current, component), try lookUp(next)?.kind == .directory else { return nil }
            current = next
        }
        return current
    }

    // MARK: conflicts

    /// Conflict versions of the file at `path`, newest first.
    public func conflicts(at path: String) throws(StoreError) -> [Version] {
        var result: [Version] = []
        for record in try replica.state(at: path).conflicts {
            if let v = try version(row: record.row) { result.append(v) }
        }
        return result
    }

    public func conflictCount(at path: String) throws(StoreError) -> Int { try replica.conflictCount(at: path) }

    public func conflictedPaths() throws(StoreError) -> [String] { try replica.conflictedPaths() }

    public func totalConflicts() throws(StoreError) -> Int { try replica.totalConflicts() }

    /// The view takes in this device's records a fold wrote since the last sync step:
    /// what a conflict request reads and makes depends on what it shows.
    func viewOwnRecords() throws(StoreError) {
        guard claimedIndex.mayHaveUnviewed else { return }
        try db.transaction { () throws(StoreError) in
            try replica.deferringConflicts { () throws(StoreError) in _ = try claimedIndex.viewOwnRecords() }
        }
    }

    /// `rm` of a conflict version: a tombstone that descends from it (it stays in history).
    public func discardConflict(_ id: VersionID) throws(StoreError) {
        try viewOwnRecords()
        guard let record = try replica.record(id: id) else { throw .noSuchVersion(id.hex) }
        let now = clock()
        let tombstone = SyncRecord(id: .new(), node: record.node, kind: record.kind, parents: [id],
                                   deviceID: deviceID, deviceName: deviceName, committed: now, mtime: now, mode: 0,
                                   isTombstone: true, isMeta: false, path: record.path)
        try db.transaction { () throws(StoreError) in _ = try insert(tombstone, from: .here) }
    }

    /// `mv` of a conflict version onto its file: the file's next version gets its content
    /// (descending from both), and the conflict is resolved.
    public func takeConflict(_ id: VersionID, path: String) throws(StoreError) {
        try viewOwnRecords()
        guard let taken = try replica.record(id: id), let conflict = try version(row: taken.row) else { throw .noSuchVersion(id.hex) }
        guard case .node(let current) = try replica.state(at: path).shown, current.kind == .file,
              let (_, _, ino) = try find(path), let inode = try lookUp(ino), inode.fileID.map({ NodeID.file($0) }) == current.node else {
            throw .noSuchVersion("no file at \(path) to take \(id) into")
        }
        let now = clock()
        let record = SyncRecord(id: .new(), node: current.node, kind: .file,
                                parents: taken.node == current.node ? [current.id, taken.id] : [current.id],
                                deviceID: deviceID, deviceName: deviceName, committed: now, mtime: now,
                                mode: conflict.mode, isTombstone: false, isMeta: false, path: path,
                                chunks: try chunkList(row: taken.row), xattrs: try currentXattrs(ino))
        try db.transaction { () throws(StoreError) in
            let row = try insert(record, from: .here)
            var updated = inode
            updated.head = row
            updated.size = record.chunks.totalSize
            updated.allocated = record.chunks.storedBytes
            updated.absent = absentBytes(record.chunks)
            updated.mode = conflict.mode
            updated.mtime = now
            updated.ctime = now
            try update(updated)
            if taken.node != current.node { try discardConflict(id) }
        }
    }
}

/// "a/b/c" -> ("a/b", "c"); "c" -> ("", "c").

/// What the filesystem asks of the sync engine (xattr control on the mount root).
public protocol SyncControl: AnyObject, Sendable {
    /// Asks for one full push and pull now and returns at once: the control write that
    /// asks is answered while the kernel holds the mount root's inode lock, so waiting for
    /// the cycle there would stall every lookup through the root. The status's `requests`
    /// and `requests-done` say when the cycle that covers this request has ended.
    func requestSync() throws(StoreError)
    func pause()
    func resume()
    /// `key=value` lines (README: status attributes), from the engine's own state.
    func statusText() -> String
    /// The backing directory's gc (after the local one): rewrites this device's journal if
    /// pruning made that worth it and collects unused objects. `now` in seconds since the
    /// epoch. Returns a report line.
    func collectBacking(now: Int64, progress: ((String, Int, Int) -> Void)?) throws(StoreError) -> String
    /// Of `packs`, those the backing store holds and does not mean to delete (no fossil
    /// marker): what `ubiquity evict` may rely on. Requests, outside every lock.
    func packsPresent(_ packs: Set<String>) throws(StoreError) -> Set<String>
}
