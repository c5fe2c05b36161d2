import UbiquitySystem

/// Files' versions and where their histories are shown, as readers see them: `.versions/`
/// (and the views of the whole container at a past moment to come). A connection of its
/// own on `meta.sqlite`, read-only, under a lock of its own (`LockRank.versionLog`, under
/// which nothing is taken): its reads never hold the store's lock, fold the overlay or
/// wait for the folder, and no request waits for them (ARCHITECTURE.md "The Store split",
/// step 5).
///
/// It reads what the index has committed. What the overlay holds (saves, tombstones and
/// history moves not folded yet, directories moved and not settled) is not there, so a
/// reader first brings the index up to the moment it asks (`SharedStore.prepareVersionReads`:
/// the overlay folded in parts outside the lock, the moves settled a slice at a time,
/// the batch committed), then reads here. What changes after that shows at its next read.
///
/// Writes of these tables stay with the store (a save writes the tree and its version
/// in one log frame); prune and gc's walks too, as they delete.
public final class VersionLog: Sendable {
    private let connection: Locked<SQLiteDatabase?>
    public let path: String

    /// The reader of `meta.sqlite` at `path`, opened at its first read (a store that
    /// never reads `.versions/` never opens it).
    init(path: String) {
        self.path = path
        connection = Locked(nil, rank: .versionLog)
    }

    private func read<T>(_ body: (SQLiteDatabase) throws(StoreError) -> T) throws(StoreError) -> T {
        try connection.withLock { (c) throws(StoreError) -> T in
            if c == nil {
                let db = try SQLiteDatabase(path: path, readOnly: true)
                try db.execute("PRAGMA cache_size=-4096")
                c = db
            }
            guard let db = c else { throw .database("cannot open \(path) to read versions") }
            return try body(db)
        }
    }

    /// Rows SQLite examined for this reader's statements so far (the work tests count).
    public var work: Int { connection.withLock { $0?.work ?? 0 } }

    /// A file's versions, oldest first (tombstones, local-only versions and meta records
    /// excluded); with `committed`, only those committed in that range (an index range
    /// scan).
    public func versions(of fileID: FileID, committed range: ClosedRange<Nanos>) throws(StoreError) -> [Version] {
        try read { (db) throws(StoreError) in try Self.versions(of: fileID, committed: range, in: db) }
    }

    /// The chunk list of the version at `row`.
    public func chunkList(row: Int64) throws(StoreError) -> ChunkList {
        try read { (db) throws(StoreError) in try Self.chunkList(row: row, in: db) }
    }

    /// The histories shown at `path`.
    public func histories(at path: String) throws(StoreError) -> [FileID] {
        try read { (db) throws(StoreError) in try Self.histories(at: path, in: db) }
    }

    /// One name below `path` under `.versions/`: whether it shows a history (true) or
    /// only directories on the way to some (false); nil when nothing is shown there.
    public func historyChild(of path: String, name: String) throws(StoreError) -> Bool? {
        try read { (db) throws(StoreError) in try Self.historyChild(of: path, name: name, in: db) }
    }

    /// The names below `path` under `.versions/`, by name, each with whether it shows a
    /// history.
    public func historyChildren(of path: String) throws(StoreError) -> [(name: String, isHistory: Bool)] {
        try read { (db) throws(StoreError) in try Self.historyChildren(of: path, in: db) }
    }

    // MARK: gc's mark (`FileSystem.collectGarbage`), a page at a time

    /// The chunks named by the version rows after `afterRow`, up to `limit` rows; returns
    /// the last row read (nil: no more rows) and how many were read.
    public func markChunks(afterRow: Int64, limit: Int, _ body: (Int64, ChunkList) -> Void) throws(StoreError) -> (last: Int64, rows: Int)? {
        try read { (db) throws(StoreError) -> (last: Int64, rows: Int)? in
            var last: Int64?, rows = 0
            try db.query("SELECT row, chunks FROM versions WHERE row > ? ORDER BY row LIMIT ?", [.int(afterRow), .int(Int64(limit))]) { r in
                last = r.int(0)
                rows += 1
                guard let list = ChunkList(encoded: r.blob(1)) else { return }
                body(r.int(0), list)
            }
            return last.map { ($0, rows) }
        }
    }

    /// The version rows files show now (their inodes' heads) of up to `limit` inodes after
    /// inode `after`, for gc's space report; returns the last inode read (nil: done).
    public func currentVersionRows(afterInode after: InodeNumber, limit: Int, into rows: inout Set<Int64>) throws(StoreError) -> InodeNumber? {
        try read { (db) throws(StoreError) -> InodeNumber? in
            var last: InodeNumber?
            try db.query("SELECT id, head, nlink FROM inodes WHERE id > ? ORDER BY id LIMIT ?", [.inode(after), .int(Int64(limit))]) { r in
                last = r.inode(0)
                if !r.isNull(1) && r.int(2) > 0 { rows.insert(r.int(1)) } // a file with a name
            }
            return last
        }
    }

    /// About how many version rows there are (the mark's progress): the highest row, read
    /// from the end of the table's index, not a count of every row.
    public func versionRowCount() throws(StoreError) -> Int {
        try read { (db) throws(StoreError) -> Int in try db.rows("SELECT max(row) FROM versions", []) { Int($0.int(0)) }.first ?? 0 }
    }

    // MARK: the queries, on any connection (the store runs them on its own, through the gate)

    static func versions(of fileID: FileID, committed range: ClosedRange<Nanos>, in db: SQLiteDatabase) throws(StoreError) -> [Version] {
        try db.rows("""
            SELECT \(Store.versionColumns) FROM \(Store.versionsWithDevices)
            WHERE file_id = ? AND committed >= ? AND committed <= ? AND tombstone = 0 AND local = 0 AND meta = 0
            ORDER BY committed, id
            """, [.id(fileID), .int(range.lowerBound), .int(range.upperBound)], Store.version(from:))
    }

    static func version(row: Int64, in db: SQLiteDatabase) throws(StoreError) -> Version? {
        try db.rows("SELECT \(Store.versionColumns) FROM \(Store.versionsWithDevices) WHERE row = ?", [.int(row)], Store.version(from:)).first
    }

    static func chunkList(row: Int64, in db: SQLiteDatabase) throws(StoreError) -> ChunkList {
        guard let blob = try db.rows("SELECT chunks FROM versions WHERE row = ?", [.int(row)], { $0.blob(0) }).first else {
            throw .noSuchVersion("version row \(row)")
        }
        guard let list = ChunkList(encoded: blob) else { throw .database("version row \(row) has a malformed chunk list") }
        return list
    }

    static func histories(at path: String, in db: SQLiteDatabase) throws(StoreError) -> [FileID] {
        try db.rows("SELECT file_id FROM histories WHERE path = ?", [.text(path)]) { $0.fileID(0) }
    }

    static func historyChild(of path: String, name: String, in db: SQLiteDatabase) throws(StoreError) -> Bool? {
        try db.rows("SELECT leaves FROM history_dirs WHERE parent = ? AND name = ?", [.text(path), .text(name)]) { $0.int(0) > 0 }.first
    }

    static func historyChildren(of path: String, in db: SQLiteDatabase) throws(StoreError) -> [(name: String, isHistory: Bool)] {
        try db.rows("SELECT name, leaves FROM history_dirs WHERE parent = ? ORDER BY name", [.text(path)]) {
            (name: $0.text(0), isHistory: $0.int(1) > 0)
        }
    }
}
