/// Which names of a directory SQLite shows a history at (`history_dirs` rows with
/// leaves), so that a file created at a name that never had one does not look for a dead
/// history to continue (`Store.deadHistory`): most creates then run no statement.
///
/// Kept by the directory's path, as histories are (a renamed directory's histories stay
/// at their old paths), and read at the first create in a directory. What a fold or a
/// sync step places later is not added to the sets: its path goes into `placed`, which a
/// look checks too. Whatever is unsure answers "may have", which costs the old query and
/// never a wrong answer. Memory is bounded: past `budget` names, or `budget` paths
/// placed, everything is forgotten and read again when asked.
///
/// Not thread-safe: the store's lock guards it.
struct HistoryNames {
    private var names: [NameKey: Set<NameKey>] = [:]
    private var held = 0
    private var placed: Set<NameKey> = []
    let budget: Int

    init(budget: Int = 262_144) { self.budget = budget }

    /// Whether SQLite may show a history at `name` in the directory at `directory` (a
    /// path as `histories` keeps them; "" is the root); nil when that directory's names
    /// are not known.
    func mayHave(_ directory: String, _ name: String) -> Bool? {
        guard let known = names[NameKey(directory)] else { return nil }
        if known.contains(NameKey(name)) { return true }
        return placed.contains(NameKey(directory.isEmpty ? name : directory + "/" + name))
    }

    /// The names the directory at `directory` shows histories at, as SQLite has them now.
    mutating func load(_ directory: String, _ shown: [String]) {
        if held + shown.count > budget { removeAll() }
        guard shown.count <= budget else { return }
        let set = Set(shown.map(NameKey.init))
        held += set.count - (names[NameKey(directory)]?.count ?? 0)
        names[NameKey(directory)] = set
    }

    /// A history was placed at `path` (a row of `history_dirs` gained a leaf).
    mutating func noteTaken(_ path: String) {
        guard !names.isEmpty else { return }
        if placed.count >= budget {
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
