/// Which names of a directory SQLite shows a history at (`history_dirs` rows with
/// leaves), so that a file created at a name that never had one does not look for a dead
/// history to continue (`Store.deadHistory`): most creates then run no statement.
///
/// Kept by the directory's path, as histories are (a renamed directory's histories stay
/// at their old paths), and read at the first create in a directory. What a fold or a
/// sync step places later is not added to the sets: its path goes into `placed`, which a
/// look checks too. Whatever is unsure answers "may have", which costs the old query and
/// never a wrong answer. Memory is bounded: a directory of more than `perDirectory`
/// such names is only marked (each create there asks SQLite), and past `budget` names
/// and paths placed, everything is forgotten and read again when asked.
///
/// Not thread-safe: the store's lock guards it.
struct HistoryNames {
    /// nil: too many to keep.
    private var names: [NameKey: Set<NameKey>?] = [:]
    private var held = 0
    private var placed: Set<NameKey> = []
    let budget: Int
    var perDirectory: Int { budget / 8 }

    init(budget: Int = 131_072) { self.budget = budget }

    /// Whether no directory's names are kept (a path placed need not be noted).
    var isEmpty: Bool { names.isEmpty }

    /// Whether SQLite may show a history at `name` in the directory at `directory` (a
    /// path as `histories` keeps them; "" is the root); nil when that directory's names
    /// are not known.
    func mayHave(_ directory: String, _ name: String) -> Bool? {
        guard let entry = names[NameKey(directory)] else { return nil }
        guard let known = entry else { return true }
        if known.contains(NameKey(name)) { return true }
        return placed.contains(NameKey(directory.isEmpty ? name : directory + "/" + name))
    }

    /// The names the directory at `directory` shows histories at, as SQLite has them now
    /// (more than `perDirectory` of them: the directory is marked as too big to keep).
    mutating func load(_ directory: String, _ shown: [String]) {
        let kept = shown.count <= perDirectory ? Set(shown.map(NameKey.init)) : nil
        if held + (kept?.count ?? 0) + placed.count > budget { removeAll() }
        if let old = names[NameKey(directory)] { held -= old?.count ?? 0 }
        held += kept?.count ?? 0
        names[NameKey(directory)] = .some(kept)
    }

    /// A history was placed at `path` (a row of `history_dirs` gained a leaf).
    mutating func noteTaken(_ path: String) {
        guard !names.isEmpty else { return }
        if held + placed.count >= budget {
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
