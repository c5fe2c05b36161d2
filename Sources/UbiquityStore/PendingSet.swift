/// The pending sets, as the `pending` table's `kind` column numbers them.
enum PendingKind: Int64 {
    case inode = 1, vacated = 2, recheck = 3, unreconciled = 4, orphaned = 5
    /// Store format 7: nodes held by inodes a sliced sync step recorded (`held`).
    case held = 6
    /// Store format 23: directories moved whose subtrees are not settled yet (`moved`).
    case moved = 7
}

/// A set of things the sync step still has to look at (the local change set, the paths
/// to reconcile), kept in memory and in the table `pending` (store format 4). Every
/// change to it is written in the transaction of the change that caused it, so a crash
/// loses no entry of a committed change and opening a store never has to walk the whole
/// tree to find what changed. The sync step consumes entries in its own transaction.
/// Not thread-safe: guarded by whatever guards the store.
///
/// While the store's tree overlay is on (`TreeOverlay`), an insert is a change the overlay
/// holds and the log carries, written by the next fold: `deferInsert` says so.
final class PendingSet<Element: Hashable> {
    typealias Kind = PendingKind

    static var schema: String {
        "CREATE TABLE IF NOT EXISTS pending(kind INTEGER NOT NULL, key TEXT NOT NULL, PRIMARY KEY(kind, key)) WITHOUT ROWID"
    }

    private let db: SQLiteDatabase
    private let kind: Kind
    private let key: (Element) -> String
    private(set) var members: Set<Element> = []
    /// Inside `holdingWrites`: the members added there, not written yet (nil outside).
    private var held: Set<Element>?

    /// Loads the set's entries (`parse` drops a key that does not parse); a read-only
    /// store (status, fsck) loads none.
    init(_ kind: Kind, db: SQLiteDatabase, load: Bool, key: @escaping (Element) -> String,
         parse: (String) -> Element?) throws(StoreError) {
        self.db = db
        self.kind = kind
        self.key = key
        guard load else { return }
        for text in try db.rows("SELECT key FROM pending WHERE kind = ?", [.int(kind.rawValue)], { $0.text(0) }) {
            if let element = parse(text) { members.insert(element) }
        }
    }

    var isEmpty: Bool { members.isEmpty }
    var count: Int { members.count }
    func contains(_ element: Element) -> Bool { members.contains(element) }

    func insert(_ element: Element) throws(StoreError) {
        guard members.insert(element).inserted else { return }
        if held != nil { held!.insert(element); return }
        try write(element)
    }

    /// Takes an insert as a change the tree overlay holds (true), or leaves it to be
    /// written now (false). Set by the store.
    var deferInsert: ((PendingKind, String) -> Bool)?

    private func write(_ element: Element) throws(StoreError) {
        if let deferInsert, deferInsert(kind, key(element)) { return }
        try db.query("INSERT OR IGNORE INTO pending(kind, key) VALUES(?, ?)", [.int(kind.rawValue), .text(key(element))])
    }

    func formUnion(_ elements: some Sequence<Element>) throws(StoreError) {
        for element in elements { try insert(element) }
    }

    func remove(_ element: Element) throws(StoreError) {
        guard members.remove(element) != nil else { return }
        if held?.remove(element) != nil { return }
        try db.query("DELETE FROM pending WHERE kind = ? AND key = ?", [.int(kind.rawValue), .text(key(element))])
    }

    func popFirst() throws(StoreError) -> Element? {
        guard let element = members.first else { return nil }
        try remove(element)
        return element
    }

    /// Takes up to `count` entries out of the set, any of them.
    func removeSome(_ count: Int) throws(StoreError) -> [Element] {
        guard members.count > count else { return Array(try removeAll()) }
        let taken = Array(members.prefix(count))
        for element in taken { try remove(element) }
        return taken
    }

    /// Empties the set, returning what it held.
    @discardableResult
    func removeAll() throws(StoreError) -> Set<Element> {
        let all = members
        if !all.isEmpty {
            members = []
            // Rows only when some member was written (not all were held back).
            let written = all.count > (held?.count ?? 0)
            if held != nil { held = [] }
            if written { try db.query("DELETE FROM pending WHERE kind = ?", [.int(kind.rawValue)]) }
        }
        return all
    }

    /// Runs `body`, which the caller runs inside one transaction, writing the members it
    /// adds only at its end, and only those still in the set then: a pull slice queues each
    /// path its records changed and reconciles them in the same transaction, so rows
    /// written for them at once would be deleted unseen (one statement per record of a
    /// join). What is left (paths reconcile deferred) is written in that transaction all
    /// the same. When `body` throws, the transaction rolls back and the caller reloads the set.
    func holdingWrites<T>(_ body: () throws(StoreError) -> T) throws(StoreError) -> T {
        if held != nil { return try body() }
        held = []
        defer { held = nil }
        let result = try body()
        for element in held ?? [] where members.contains(element) { try write(element) }
        return result
    }

    /// A member the operation log's replay brings back (its row is the fold's to write).
    func restore(_ text: String, parse: (String) -> Element?) {
        if let element = parse(text) { members.insert(element) }
    }

    /// Reads the set again from SQLite (after a transaction that changed it rolled back).
    func reload(parse: (String) -> Element?) throws(StoreError) {
        var loaded: Set<Element> = []
        for text in try db.rows("SELECT key FROM pending WHERE kind = ?", [.int(kind.rawValue)], { $0.text(0) }) {
            if let element = parse(text) { loaded.insert(element) }
        }
        members = loaded
    }
}
