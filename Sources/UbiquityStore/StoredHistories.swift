/// The histories SQLite shows at a directory's names, each with its newest stored version:
/// what `Store.deadHistory` needs when a file is made at a name that had a history. A tree
/// extracted again where it was deleted (`rm -rf build; tar -x`) makes every create such a
/// one; with this, a directory costs one read, not two per file (and the file's first save
/// reads nothing more: the version it descends from comes along).
///
/// True only while SQLite reads as it did: it is kept with the serving connection's change
/// mark at the read (`SQLiteDatabase.ChangeMark`), and any other mark forgets everything.
/// A fold, a sync step, a prune, a barrier or a rollback each change the mark, so no writer
/// needs to keep this up to date. What the overlay holds is newer and is looked at first
/// (`Store.deadHistory`).
///
/// A directory is read whole only at the `readAfter`th create at such a name in it while
/// the mark stays the same; the ones before read their name alone. An editor's save asks
/// once between folds, and a directory of many files would cost many rows read for one
/// name; a tree being extracted asks for every file.
///
/// Memory is bounded: a directory with more than `perDirectory` histories at its names is
/// only marked (its creates read SQLite as before), and past `budget` entries everything
/// is forgotten. Not thread-safe: the store's lock guards it.
struct StoredHistories {
    struct Entry {
        let fileID: FileID
        let live: Bool
        /// The newest version that is not local-only (a tombstone, if the file's last name
        /// went): row, commit time and id.
        let newest: (row: Int64, committed: Nanos, id: VersionID)?
    }

    /// By directory path (as histories keep paths; "" is the root), then name; nil: too
    /// many to keep.
    private var directories: [NameKey: [NameKey: [Entry]]?] = [:]
    private var mark: SQLiteDatabase.ChangeMark?
    private var held = 0
    /// Creates that asked in each directory not read at this mark.
    private var asked: [NameKey: Int] = [:]
    let budget: Int
    /// Creates asking in a directory before it is read whole (tests: `.max`, never).
    let readAfter: Int
    static let defaultReadAfter = 4
    var perDirectory: Int { budget / 8 }

    init(budget: Int = 131_072, readAfter: Int = defaultReadAfter) {
        self.budget = budget
        self.readAfter = readAfter
    }

    /// The directory's histories by name, if read at `mark`: `.some(nil)` when it has too
    /// many to keep, nil when not known at this mark.
    mutating func directory(_ directory: String, at mark: SQLiteDatabase.ChangeMark) -> [NameKey: [Entry]]?? {
        if self.mark != mark { removeAll() }
        return directories[NameKey(directory)]
    }

    /// Notes a create that asks in a directory not known at `mark`; returns whether the
    /// directory is now to be read whole.
    mutating func shouldRead(_ directory: String, at mark: SQLiteDatabase.ChangeMark) -> Bool {
        if self.mark != mark {
            removeAll()
            self.mark = mark
        }
        let key = NameKey(directory)
        asked[key, default: 0] += 1
        return asked[key]! >= readAfter
    }

    /// What a read at `mark` found in the directory (`rows` of (name, entry)), or that it
    /// has more than `perDirectory` (`rows` then holds one more than that).
    mutating func load(_ directory: String, _ rows: [(name: String, entry: Entry)], at mark: SQLiteDatabase.ChangeMark) {
        let kept = rows.count <= perDirectory
        if self.mark != mark || (kept && held + rows.count > budget) { removeAll() }
        self.mark = mark
        guard kept else {
            directories[NameKey(directory)] = .some(nil)
            return
        }
        var byName: [NameKey: [Entry]] = [:]
        for row in rows { byName[NameKey(row.name), default: []].append(row.entry) }
        held += rows.count
        directories[NameKey(directory)] = .some(byName)
        asked[NameKey(directory)] = nil
    }

    mutating func removeAll() {
        directories = [:]
        held = 0
        asked = [:]
        mark = nil
    }
}
