/// Which names of a directory SQLite shows a history at (`history_dirs` rows with
/// leaves), so that a file created at a name that never had one does not look for a dead
/// history to continue (`Store.deadHistory`): most creates then run no statement.
///
/// Kept by the directory's path, as histories are (a renamed directory's histories stay
/// at their old paths), and read at the first create in a directory. A directory's read
/// also tells which of its names have histories below them (`total` above `leaves`), so
/// a directory below one whose names are known, and that is not among them, is known to
/// have none without a read: `tar -x` or `git clone` into a new directory reads the
/// names once, not once per directory it makes. What a fold or a sync step places later
/// is not added to the sets: its path goes into `placed`, which every answer checks too
/// (so a directory known empty from its parent's rows still finds what was placed in it
/// since). Whatever is unsure answers "may
/// have", which costs the old query and never a wrong answer. Memory is bounded: a
/// directory of more than `perDirectory` rows is only marked (each create there asks
/// SQLite), and past `budget` names and paths placed, everything is forgotten and read
/// again when asked.
///
/// Not thread-safe: the store's lock guards it.
struct HistoryNames {
    /// What a directory's rows say: the names a history is shown at, and the names with
    /// histories below them.
    private struct Known {
        var leaves: Set<NameKey> = []
        var below: Set<NameKey> = []
        var size: Int { 1 + leaves.count + below.count }
    }
    /// nil: too many to keep.
    private var names: [NameKey: Known?] = [:]
    private var held = 0
    private var placed: Set<NameKey> = []
    let budget: Int
    var perDirectory: Int { budget / 8 }
    private var used: Int { held + placed.count }

    init(budget: Int = 131_072) { self.budget = budget }

    /// Whether no directory's names are kept (a path placed need not be noted).
    var isEmpty: Bool { names.isEmpty }

    /// Whether SQLite may show a history at `name` in the directory at `directory` (a
    /// path as `histories` keeps them; "" is the root); nil when that directory's names
    /// are not known. A directory known to have no history below it from the rows of the
    /// nearest directory above it whose names are known is kept as known from then on,
    /// with the directories between.
    mutating func mayHave(_ directory: String, _ name: String) -> Bool? {
        let key = NameKey(directory)
        if names[key] == nil {
            guard let between = emptyUpTo(directory), used + between.count <= budget else { return nil }
            for path in between { names[path] = .some(Known()) }
            held += between.count
        }
        guard let known = names[key]! else { return true }
        if known.leaves.contains(NameKey(name)) { return true }
        return placed.contains(NameKey(directory.isEmpty ? name : directory + "/" + name))
    }

    /// When SQLite showed no history below the directory at `directory` as the nearest
    /// directory above it whose names are known read them (they do not name the way
    /// down), the directories from it up to that one; else nil. What was placed since is
    /// in `placed`, which every answer checks.
    private func emptyUpTo(_ directory: String) -> [NameKey]? {
        var between: [NameKey] = []
        var path = directory
        while !path.isEmpty {
            between.append(NameKey(path))
            let (parent, last) = Store.splitHistoryPath(path)
            if let entry = names[NameKey(parent)] {
                guard let known = entry, !known.below.contains(NameKey(last)) else { return nil }
                return between
            }
            path = parent
        }
        return nil
    }

    /// The directories whose names are to be read, top down, to answer for `directory`:
    /// those below the nearest one above it whose names are known (the root first when
    /// none is), down to `directory` itself. Read in that order, the first that does not
    /// name the way down answers for everything below it.
    func unknownWayDown(to directory: String) -> [String] {
        var way = [directory]
        var path = directory
        while !path.isEmpty {
            path = Store.splitHistoryPath(path).directory
            if names[NameKey(path)] != nil { break }
            way.append(path)
        }
        return way.reversed()
    }

    /// The rows of the directory at `directory` as SQLite has them now: each name, whether
    /// a history is shown at it (leaves) and whether any is below it (total above leaves).
    /// More than `perDirectory` rows: the directory is marked as too big to keep.
    mutating func load(_ directory: String, _ rows: [(name: String, leaf: Bool, below: Bool)]) {
        var kept: Known?
        if rows.count <= perDirectory {
            var known = Known()
            for row in rows {
                if row.leaf { known.leaves.insert(NameKey(row.name)) }
                if row.below { known.below.insert(NameKey(row.name)) }
            }
            kept = known
        }
        let size = kept?.size ?? 1
        if used + size > budget { removeAll() }
        if let old = names[NameKey(directory)] { held -= old?.size ?? 1 }
        held += size
        names[NameKey(directory)] = .some(kept)
    }

    /// A history was placed at `path` (a row of `history_dirs` gained a leaf, and the rows
    /// above it a total).
    mutating func noteTaken(_ path: String) {
        guard !names.isEmpty else { return }
        if used >= budget {
            removeAll()
            return
        }
        placed.insert(NameKey(path))
    }

    /// After a rollback (a set read inside it may lack a history it undid the removal
    /// of), or to bound memory.
    mutating func removeAll() {
        names = [:]
        held = 0
        placed = []
    }
}
