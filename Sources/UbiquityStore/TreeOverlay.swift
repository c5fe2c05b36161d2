import Synchronization

/// The tree's changes that the operation log holds and the index (SQLite) does not yet:
/// LevelDB's memtable over its tables. A request changes rows here and in one log frame;
/// a fold writes them to SQLite later, in one transaction with the log's mark.
///
/// Two views of the same changes: `changes` in the order they were made (what the log
/// carries and the fold writes) and the rows as they are now (`inodes`, `entries`: what
/// reads look at first; a row here shadows SQLite's, nil meaning removed). A row not here
/// is as SQLite has it, which is why a read may go to SQLite for it without a fold.
///
/// Not thread-safe: the store's lock guards it.
struct TreeOverlay {
    /// Which overlay this is: every one made gets a new number, so a rest built from one
    /// overlay's changes elsewhere (`Rest`) is never taken into another.
    let generation = TreeOverlay.generations.add(1, ordering: .relaxed).newValue
    private static let generations = Atomic<UInt64>(0)
    private(set) var changes: [TreeChange] = []
    /// Changes before this index are in SQLite already (a group commit's parts): the rows
    /// still show them, as SQLite has them too, and a fold starts after them, so a part
    /// costs its own changes and not a rebuild of the rest (`markFolded`). They hold only
    /// while every write goes through the overlay: the gate drops them before anything
    /// writes SQLite past it (`Store.foldTree`).
    private(set) var folded = 0
    /// Changes from this index on are not in a log frame yet.
    private(set) var unlogged = 0
    /// Where each frame logged since this overlay began (or replayed at open) ends in
    /// `changes`, and its sequence: a fold may write a prefix of whole frames (`prefix`).
    /// Empty for an overlay rebuilt by a rollback (it is then folded whole).
    private(set) var frames: [(end: Int, sequence: LogSequence)] = []
    private(set) var inodes: [InodeNumber: TreeNode?] = [:]
    /// By directory, then name: the inode the entry names now, or nil when removed.
    private(set) var entries: [InodeNumber: [NameKey: InodeNumber]] = [:]
    private(set) var removedEntries: [InodeNumber: Set<NameKey>] = [:]
    /// Saves not folded, by row; tombstones' ids by row (their records are made at the
    /// fold).
    private(set) var saves: [Int64: SavedVersion] = [:]
    private(set) var tombstones: [Int64: (id: VersionID, fileID: FileID)] = [:]
    /// Tombstones whose record the fold may not write, by history, with the head row the
    /// file had: one of a file whose head is a local-only version, or not a save held
    /// here, may have no parent (`Store.writeTombstone`). The dead history the overlay
    /// shows for one is then to be checked before a new file continues it
    /// (`Store.deadHistory(at:)`), not at the delete (that would read SQLite on its
    /// request path).
    private(set) var tombstonesToCheck: [FileID: Int64?] = [:]
    /// The rows of `saves` that are local-only files' versions.
    private(set) var localRows: Set<Int64> = []
    /// Each history's versions here (saves and tombstones), by row.
    private var rowsOf: [FileID: Set<Int64>] = [:]
    /// Each history's newest version here (saves and tombstones), for a new file that
    /// continues it.
    private(set) var newest: [FileID: (row: Int64, committed: Nanos)] = [:]
    /// Where histories are shown now, and the histories shown at each path.
    private(set) var histories: [FileID: (path: String, live: Bool)] = [:]
    private(set) var historiesAt: [NameKey: Set<FileID>] = [:]
    /// User xattrs set (a value) or removed (nil) here, by inode and full name.
    private var xattrs: [InodeNumber: [String: [UInt8]?]] = [:]
    /// Inodes whose xattrs in SQLite do not count: dropped here, or made by this process
    /// (`noteFresh`; a number never given before has no rows there). Only what `xattrs`
    /// holds is theirs.
    private var xattrsCleared: Set<InodeNumber> = []
    /// Histories begun here (`noteFresh`) that SQLite has no version of: a version of one
    /// reaches SQLite only through a fold, which empties the overlay or, folding a part,
    /// forgets these.
    private var freshHistories: Set<FileID> = []

    init() {}

    /// An overlay holding `changes` (all of them logged but the last `unlogged`).
    init(replaying changes: [TreeChange], unlogged: Int = 0) {
        self.changes.reserveCapacity(changes.count)
        for change in changes { apply(change) }
        self.unlogged = self.changes.count - min(max(unlogged, 0), self.changes.count)
    }

    /// An overlay holding the frames an open replayed, in order, so that the group
    /// commit folds them a part at a time like any other.
    init(replayingFrames replayed: [(sequence: LogSequence, changes: [TreeChange])]) {
        changes.reserveCapacity(replayed.reduce(0) { $0 + $1.changes.count })
        frames.reserveCapacity(replayed.count)
        for frame in replayed {
            for change in frame.changes { apply(change) }
            frames.append((end: changes.count, sequence: frame.sequence))
        }
        unlogged = changes.count
    }

    /// The highest version row a change here takes (0: none): rows are given before the
    /// fold, so the next one given must be past these as well as past SQLite's.
    var highestVersionRow: Int64 {
        var highest: Int64 = 0
        for change in changes {
            switch change {
            case .save(let v), .localSave(let v, _, _): highest = max(highest, v.row)
            case .tombstone(let row, _, _, _, _, _), .withdraw(let row, _, _): highest = max(highest, row)
            default: break
            }
        }
        return highest
    }

    /// The highest inode number a row here names (0: none).
    var highestInode: UInt64 { inodes.keys.map(\.rawValue).max() ?? 0 }

    /// Nothing to fold (an overlay whose every change is folded is replaced by an empty
    /// one, `Store.foldTree`).
    var isEmpty: Bool { changes.count == folded }
    var hasUnlogged: Bool { unlogged < changes.count }
    /// Whether a change not logged yet must be in a frame before the lock goes (before a
    /// reply). A drop of an inode need not: only an inode no entry names is dropped, and
    /// the next open drops every such inode, so a crash that loses the drop loses nothing
    /// (an `rm -rf` is then one frame a file, the unlink's, not two).
    var unloggedNeedFrame: Bool {
        changes[unlogged...].contains { if case .dropInode = $0 { return false } else { return true } }
    }

    mutating func apply(_ change: TreeChange) {
        changes.append(change)
        switch change {
        case .putInode(let node): inodes[node.inode.id] = .some(node)
        case .dropInode(let id):
            inodes[id] = .some(nil)
            xattrs[id] = nil
            xattrsCleared.insert(id)
        case .putEntry(let parent, let name, let inode):
            let key = NameKey(name)
            entries[parent, default: [:]][key] = inode
            removedEntries[parent]?.remove(key)
        case .removeEntry(let parent, let name):
            let key = NameKey(name)
            entries[parent]?[key] = nil
            removedEntries[parent, default: []].insert(key)
        case .pending: break
        case .save(let version):
            saves[version.row] = version
            rowsOf[version.fileID, default: []].insert(version.row)
            noteNewest(version.fileID, row: version.row, committed: version.committed)
        // Not a history's newest: a local version is never one a new file continues.
        case .localSave(let version, _, _):
            saves[version.row] = version
            localRows.insert(version.row)
            rowsOf[version.fileID, default: []].insert(version.row)
        case .tombstone(let row, let id, let fileID, let head, let path, let committed):
            tombstones[row] = (id, fileID)
            if let head, saves[head] != nil, !localRows.contains(head) {
                tombstonesToCheck[fileID] = nil
            } else {
                tombstonesToCheck[fileID] = .some(head)
            }
            rowsOf[fileID, default: []].insert(row)
            noteNewest(fileID, row: row, committed: committed)
            placeHistory(fileID, path: path, live: false)
        case .history(let fileID, let path, let live):
            placeHistory(fileID, path: path, live: live)
        case .withdraw(let row, _, let fileID):
            saves[row] = nil
            localRows.remove(row)
            rowsOf[fileID]?.remove(row)
            if rowsOf[fileID]?.isEmpty == true { rowsOf[fileID] = nil }
            if newest[fileID]?.row == row { newest[fileID] = nil }
            newestMarks[fileID] = nil
            if let old = histories.removeValue(forKey: fileID) { historiesAt[NameKey(old.path)]?.remove(fileID) }
        case .xattr(let id, let name, let value):
            xattrs[id, default: [:]][name] = .some(value)
        }
    }

    /// The tombstone of history `fileID` is written by the fold after all (its file's head
    /// is a version that no local-only file has: `Store.deadHistory(at:)` looked).
    mutating func noteTombstoneChecked(_ fileID: FileID) { tombstonesToCheck[fileID] = nil }

    /// Inode `id` was just given out, with a new history if it is a file: SQLite has no
    /// xattrs of it and no version of that history. Not a change (a rebuilt overlay
    /// forgets it, and a read then asks SQLite).
    mutating func noteFresh(_ id: InodeNumber, history: FileID?) {
        xattrsCleared.insert(id)
        if let history { freshHistories.insert(history) }
    }

    /// Whether history `fileID` surely has no version in SQLite (see `noteFresh`).
    func isFresh(_ fileID: FileID) -> Bool { freshHistories.contains(fileID) }

    /// Of the histories `changes` save versions of, those that are fresh.
    func freshHistories(in changes: [TreeChange]) -> Set<FileID> {
        var found: Set<FileID> = []
        for case .save(let v) in changes where freshHistories.contains(v.fileID) { found.insert(v.fileID) }
        return found
    }

    /// A fold failed partway: what it wrote may stay in a transaction that goes on, so
    /// no history is sure to have nothing in SQLite any more.
    mutating func forgetFresh() { freshHistories = [] }

    /// The inode's xattrs as the overlay has them: the values set or removed here, and
    /// whether SQLite's rows are to be ignored.
    func xattrs(of id: InodeNumber) -> (changed: [String: [UInt8]?], cleared: Bool) {
        (xattrs[id] ?? [:], xattrsCleared.contains(id))
    }

    /// The one version of history `fileID` here when it is a save (a tombstone or a second
    /// version: nil).
    func onlySave(of fileID: FileID) -> SavedVersion? {
        guard let rows = rowsOf[fileID], rows.count == 1, let row = rows.first else { return nil }
        return saves[row]
    }

    /// History `fileID`'s versions here (saves and tombstones, folded or not), by row.
    func versions(of fileID: FileID) -> [Int64: VersionID] {
        var found: [Int64: VersionID] = [:]
        for row in rowsOf[fileID] ?? [] {
            if let id = saves[row]?.id ?? tombstones[row]?.id { found[row] = id }
        }
        return found
    }

    private mutating func noteNewest(_ fileID: FileID, row: Int64, committed: Nanos) {
        newestMarks[fileID] = nil
        if let known = newest[fileID], (known.committed, known.row) > (committed, row) { return }
        newest[fileID] = (row, committed)
    }

    /// The index's count of version rows written from elsewhere (`Index.versionsWrittenAside`)
    /// when `fileID`'s newest version here was made: while the count is the same, SQLite
    /// holds no version of the history made since, so its newest is not newer than this
    /// one (`Store.deadHistory`). Today such a write goes through the gate, which folds
    /// the overlay first; the count keeps the rule true without that. Set by the store
    /// after the change; none for a replayed overlay, or once another change to the
    /// history came.
    private(set) var newestMarks: [FileID: UInt64] = [:]

    mutating func noteNewestMark(_ fileID: FileID, _ mark: UInt64) {
        if newest[fileID] != nil { newestMarks[fileID] = mark }
    }

    /// Every newest version's history read from SQLite again at its next look.
    mutating func forgetNewestMarks() { newestMarks = [:] }

    private mutating func placeHistory(_ fileID: FileID, path: String, live: Bool) {
        if let old = histories[fileID] { historiesAt[NameKey(old.path)]?.remove(fileID) }
        histories[fileID] = (path, live)
        historiesAt[NameKey(path), default: []].insert(fileID)
    }

    /// Takes back the changes after the first `count` (a tree change that failed
    /// halfway; none of them is logged yet). Rebuilds the rows: failures are rare.
    mutating func rollBack(to count: Int) {
        guard count < changes.count else { return }
        let logged = unlogged, known = frames, done = folded
        self = TreeOverlay(replaying: Array(changes.prefix(count)))
        unlogged = min(logged, count)
        folded = min(done, count)
        frames = known.filter { $0.end <= count }
    }

    /// The changes not in SQLite yet.
    var unfolded: ArraySlice<TreeChange> { changes[folded...] }

    /// The changes not logged yet, now counted as logged.
    mutating func takeUnlogged() -> ArraySlice<TreeChange> {
        defer { unlogged = changes.count }
        return changes[unlogged...]
    }

    /// The changes `takeUnlogged` took are in frame `sequence`.
    mutating func noteFrame(_ sequence: LogSequence) {
        guard frames.last.map({ $0.end < unlogged }) ?? true else { return }
        frames.append((end: unlogged, sequence: sequence))
    }

    /// After the folded changes, the longest run of whole frames of at most `limit`
    /// changes (at least one frame): where it ends, and its last frame's sequence; nil
    /// when that is every change (or the frames are not known).
    func prefix(upTo limit: Int) -> (end: Int, through: LogSequence)? {
        let after = frames.drop { $0.end <= folded }
        guard let first = after.first else { return nil }
        var chosen = first
        for frame in after.dropFirst() where frame.end - folded <= limit { chosen = frame }
        guard chosen.end < changes.count else { return nil }
        return (chosen.end, chosen.sequence)
    }

    /// The rows of an overlay's changes from `from` to `through`, built from a copy of them
    /// without the store's lock (the folder, while it writes the changes before `from`):
    /// the rebuild that `markFolded` would otherwise do under the lock, a replay of tens
    /// of thousands of changes after a burst.
    struct Rest {
        let generation: UInt64
        let from: Int
        let through: Int
        let overlay: TreeOverlay

        /// - Parameter changes: the overlay's changes from `from` on, copied (a copy of
        ///   the whole array shared with the folder would be copied again at the next
        ///   request's append, on its path).
        init(of changes: [TreeChange], generation: UInt64, from: Int) {
            self.generation = generation
            self.from = from
            through = from + changes.count
            overlay = TreeOverlay(replaying: changes)
        }
    }

    /// The changes before `end` (whole frames, from `prefix`) are in SQLite now. Once they
    /// are half of what is held, the rows are rebuilt from the rest (so a stream of
    /// bursts does not keep them for ever, and the rebuilds cost each change once).
    /// - Parameter compacting: whether the rows may be rebuilt now (not while a caller
    ///   holds positions in `changes`: a request that a claim interrupted).
    /// - Parameter prebuilt: the rest's rows built from this overlay's changes, if any:
    ///   only the changes made since are applied to it. Taken (nil after), so that it is
    ///   not copied when they are.
    mutating func markFolded(through end: Int, compacting: Bool = true, prebuilt: inout Rest?) {
        let start = folded
        folded = max(folded, min(end, changes.count))
        freshHistories = []
        guard compacting, folded >= changes.count - folded else {
            // The rows stay: the saves among them read as SQLite has them, as the fold
            // amended them.
            if !saves.isEmpty {
                for (row, save) in Index.amendedSaves(changes[start..<folded]) where saves[row] != nil { saves[row] = save }
            }
            return
        }
        var rest: TreeOverlay
        if let through = prebuilt?.through, prebuilt?.generation == generation, prebuilt?.from == folded,
           through <= changes.count, let built = prebuilt.take()?.overlay {
            rest = consume built
            for change in changes[through...] { rest.apply(change) }
        } else {
            rest = TreeOverlay(replaying: Array(changes[folded...]))
        }
        rest.unlogged = max(unlogged - folded, 0)
        rest.frames = frames.filter { $0.end > folded }.map { (end: $0.end - folded, sequence: $0.sequence) }
        self = rest
    }

    mutating func markFolded(through end: Int, compacting: Bool = true) {
        var none: Rest?
        markFolded(through: end, compacting: compacting, prebuilt: &none)
    }

    /// `.some(node)` or `.some(nil)` (dropped) when the overlay has the inode's row; nil
    /// when SQLite's row is current.
    func inode(_ id: InodeNumber) -> TreeNode?? { inodes[id] }

    /// `.some(id)` or `.some(nil)` (removed) when the overlay has the entry; nil when
    /// SQLite's row is current.
    func entry(_ parent: InodeNumber, _ name: NameKey) -> InodeNumber?? {
        if let id = entries[parent]?[name] { return .some(id) }
        if removedEntries[parent]?.contains(name) == true { return .some(nil) }
        return nil
    }

    /// Entries the overlay added to `parent` (and has not removed since).
    func addedEntries(_ parent: InodeNumber) -> [NameKey: InodeNumber] { entries[parent] ?? [:] }

    /// Names the overlay removed from `parent` (and has not added again).
    func removedNames(_ parent: InodeNumber) -> Set<NameKey> { removedEntries[parent] ?? [] }
}
