import CSQLite
import Glibc
import UbiquitySystem

/// Chunks of at most `SmallChunks.limit` bytes (and more than `ChunkList.inlineLimit`,
/// which their lists keep since store format 14), kept as rows of one SQLite database
/// (`chunks/small.sqlite`, local store format 5; keyed by id since format 6) instead of
/// one file each. A file costs a whole filesystem block (4 KiB on ext4) and an inode for a
/// 20-byte version; a row costs its bytes plus about 60 (id, time, B-tree).
///
/// The same contract as chunk files (see `ChunkStore`): a row appears whole (one SQLite
/// statement); `used` is the time the chunk was last written or claimed, and `sweep`
/// deletes a row only when `used` is older than the cutoff, in one statement, so a claim
/// and a sweep of one chunk are ordered by SQLite's write lock; `sync()` makes every row
/// written so far durable (one transaction with synchronous=FULL, which fsyncs the WAL).
/// Bytes are verified by `ChunkStore.read` as a file's are.
final class SmallChunks: Sendable {
    /// Chunks up to this size are rows: it keeps a row within its page (16 KiB pages in a
    /// database made at format 6, 4 KiB before). Bigger chunks are files, where a block's
    /// waste is at most half the chunk.
    static let limit = 2048

    private struct State {
        let db: SQLiteDatabase?
        /// Rows written since the last `sync()`.
        var unsynced = false
        /// Rows put in the open batch (group commit, `startBatching`), by id: the intent
        /// log carries them with the save that wrote them until the batch commits.
        var uncommitted: [ChunkID: [UInt8]] = [:]
        /// Of those, the ones not in SQLite yet, with their last use. With group commit a
        /// put is memory only and `commitBatch` (the group commit's thread) writes them:
        /// a save's request runs no statement here. Reads, claims and sweeps look here
        /// first.
        var unwritten: [ChunkID: Nanos] = [:]
    }
    private let state: Locked<State>
    let path: String

    /// A read-only store (fsck, status) does not create the database when it is missing.
    init(directory: String, readOnly: Bool) throws(StoreError) {
        path = directory + "/small.sqlite"
        checkpointer = WALCheckpointer(path: path)
        if readOnly && access(path, F_OK) != 0 {
            state = Locked(State(db: nil), rank: .leaf)
            return
        }
        let db = try SQLiteDatabase(path: path)
        // Before the first table: space that gc frees goes back to the filesystem
        // (`compact`) instead of staying in the file as free pages; and 16 KiB pages, so
        // that a row of up to `limit` bytes stays in its page in the table keyed by id
        // (with 4 KiB pages such a table keeps at most about 1,000 bytes of a row in the
        // page and puts the rest on an overflow page of its own). No-ops on an older file.
        try db.execute("PRAGMA page_size=16384")
        try db.execute("PRAGMA auto_vacuum=INCREMENTAL")
        try db.execute("PRAGMA journal_mode=WAL")
        try db.execute("PRAGMA synchronous=NORMAL")
        try db.execute("PRAGMA journal_size_limit=\(SQLiteDatabase.walSizeLimit)")
        try db.limitWAL()
        if !readOnly {
            try Self.createTable(db)
            try db.execute("CREATE TABLE IF NOT EXISTS barrier(n INTEGER NOT NULL)")
        }
        state = Locked(State(db: db), rank: .leaf)
    }

    /// The table keyed by the chunk id itself (store format 6): no row number and no
    /// separate index of ids, about 40 bytes less per chunk, and a delete touches one
    /// B-tree. A format-5 table (`row` column, an index on `id`, 4 KiB pages) is kept as
    /// it is: every query here works on both, and rewriting it would need a full copy.
    private static func createTable(_ db: SQLiteDatabase) throws(StoreError) {
        try db.execute("CREATE TABLE IF NOT EXISTS chunks(id BLOB PRIMARY KEY, bytes BLOB NOT NULL, used INTEGER NOT NULL) WITHOUT ROWID")
    }

    /// Group commit (a mounted store): puts join one open transaction that `commitBatch`
    /// commits, instead of a commit (a 16 KiB WAL frame) each. The store commits this batch
    /// before its metadata batch, so a committed version never names an uncommitted row.
    func startBatching(opened: Doorbell?, committed: Doorbell?) {
        state.withLock { s in
            s.db?.batching = true
            s.db?.batchOpened = opened
            if let committed { s.db?.ringOnCommit(committed) }
        }
    }

    /// Writes and commits the rows put since the last call.
    func commitBatch() throws(StoreError) {
        try state.withLock { (s) throws(StoreError) in try Self.commit(&s) }
    }

    /// The rows not written yet go into the batch, which commits. A failure keeps them
    /// (a row written twice is one row), and the store then commits no version naming them.
    private static func commit(_ s: inout State) throws(StoreError) {
        guard let db = s.db else { return }
        for (id, used) in s.unwritten {
            guard let bytes = s.uncommitted[id] else { continue }
            try db.statement("INSERT INTO chunks(id, bytes, used) VALUES(?, ?, ?) ON CONFLICT(id) DO UPDATE SET used = excluded.used",
                             [.blob(id.raw), .blob(bytes), .int(used)])
        }
        s.unwritten = [:]
        try db.commitBatch()
        s.uncommitted = [:]
    }

    /// Those of `ids` put in the open batch, with their bytes.
    func uncommitted(_ ids: [ChunkID]) -> [ChunkID: [UInt8]] {
        state.withLock { s in
            guard !s.uncommitted.isEmpty else { return [:] }
            var found: [ChunkID: [UInt8]] = [:]
            for id in ids { if let bytes = s.uncommitted[id] { found[id] = bytes } }
            return found
        }
    }

    /// Stores the chunk, or renews `used` when it is there.
    func put(_ id: ChunkID, _ bytes: UnsafeRawBufferPointer, now: Nanos) throws(StoreError) {
        try state.withLock { (s) throws(StoreError) in
            guard let db = s.db else { throw .io(errno: EROFS, "\(path) is read-only") }
            let row = Array(bytes)
            s.unsynced = true
            if db.batching {
                // The group commit writes it (rung as the batch's first statement would).
                if s.unwritten.isEmpty { db.batchOpened?.ring() }
                s.uncommitted[id] = row
                s.unwritten[id] = now
                return
            }
            try db.statement("INSERT INTO chunks(id, bytes, used) VALUES(?, ?, ?) ON CONFLICT(id) DO UPDATE SET used = excluded.used",
                             [.blob(id.raw), .blob(row), .int(now)])
        }
    }

    /// Whether the chunk is here; if so, its `used` time is renewed (gc keeps it).
    func claim(_ id: ChunkID, now: Nanos) -> Bool {
        state.withLock { s in
            guard let db = s.db else { return false }
            if s.unwritten[id] != nil {
                s.unwritten[id] = now
                return true
            }
            do throws(StoreError) {
                try db.query("UPDATE chunks SET used = ? WHERE id = ?", [.int(now), .blob(id.raw)])
                return db.changes > 0
            } catch {
                // A store that cannot be written (read-only file, full disk): whether the
                // chunk is there all the same.
                return (try? db.rows("SELECT 1 FROM chunks WHERE id = ?", [.blob(id.raw)]) { _ in true }.first) ?? false
            }
        }
    }

    /// Sets `used` (tests: a chunk written long ago).
    func setUsed(_ id: ChunkID, to time: Nanos) throws(StoreError) {
        try state.withLock { (s) throws(StoreError) in
            if s.unwritten[id] != nil { s.unwritten[id] = time }
            try s.db?.query("UPDATE chunks SET used = ? WHERE id = ?", [.int(time), .blob(id.raw)])
        }
    }

    /// The chunk's bytes as stored (not verified), nil when it is not here.
    func get(_ id: ChunkID) throws(StoreError) -> [UInt8]? {
        try state.withLock { (s) throws(StoreError) -> [UInt8]? in
            guard let db = s.db else { return nil }
            if let bytes = s.uncommitted[id] { return bytes }
            return try db.rows("SELECT bytes FROM chunks WHERE id = ?", [.blob(id.raw)]) { $0.blob(0) }.first
        }
    }

    /// The chunk's size, nil when it is not here.
    func size(of id: ChunkID) -> Int? {
        state.withLock { s in
            if let bytes = s.uncommitted[id] { return bytes.count }
            return try? s.db?.rows("SELECT length(bytes) FROM chunks WHERE id = ?", [.blob(id.raw)]) { Int($0.int(0)) }.first
        }
    }

    /// gc: deletes each chunk unless it was written or claimed at or after `cutoff`, in one
    /// transaction (one commit for the batch, the lock held for the batch only). Returns
    /// the bytes freed per chunk deleted (the chunk and its row's share).
    func sweep(_ ids: [ChunkID], unusedSince cutoff: Nanos) -> [ChunkID: Int64] {
        var held = GraceHeld()
        return sweep(ids, unusedSince: cutoff, held: &held)
    }

    /// `sweep`, counting in `held` the chunks kept because they were used at or after `cutoff`.
    func sweep(_ ids: [ChunkID], unusedSince cutoff: Nanos, held: inout GraceHeld) -> [ChunkID: Int64] {
        state.withLock { s -> [ChunkID: Int64] in
            guard let db = s.db else { return [:] }
            var freed: [ChunkID: Int64] = [:]
            do throws(StoreError) {
                try db.transaction { () throws(StoreError) in
                for id in ids {
                    // Put since the last commit: its last use is the one in memory, and an
                    // older row of it in SQLite goes with it.
                    if let used = s.unwritten[id], let bytes = s.uncommitted[id] {
                        guard used < cutoff else {
                            held.add(bytes: Int64(bytes.count) + 80, lastUse: used)
                            continue
                        }
                        freed[id] = Int64(bytes.count) + 80 // dropped from memory once committed
                    }
                    guard let (size, used) = try db.rows("SELECT length(bytes), used FROM chunks WHERE id = ?",
                                                         [.blob(id.raw)], { ($0.int(0), $0.int(1)) }).first else { continue }
                    guard used < cutoff else {
                        held.add(bytes: size + 80, lastUse: used)
                        continue
                    }
                    try db.query("DELETE FROM chunks WHERE id = ? AND used < ?", [.blob(id.raw), .int(cutoff)])
                    if db.changes > 0 { freed[id] = size + 80 }
                }
                }
                try db.commitBatch()
            } catch {
                // Nothing of the batch was deleted (rolled back): gc reports it as kept.
                log("ubiquity: gc: deleting small chunks failed: \(error)")
                return [:]
            }
            for id in freed.keys {
                s.uncommitted[id] = nil
                s.unwritten[id] = nil
            }
            return freed
        }
    }

    /// Every chunk id here (for fsck and gc), read 4,096 rows per hold of the lock: a
    /// reader of a small file never waits for the whole list.
    func ids() -> [ChunkID] {
        var ids: [ChunkID] = [], after: [UInt8] = []
        // Those not written yet, listed whether or not a commit writes them meanwhile.
        let unwritten = state.withLock { Array($0.unwritten.keys) }
        while true {
            let page = state.withLock { s -> [[UInt8]] in
                (try? s.db?.rows("SELECT id FROM chunks WHERE id > ? ORDER BY id LIMIT 4096", [.blob(after)]) { $0.blob(0) }) ?? []
            }
            guard let last = page.last else {
                guard !unwritten.isEmpty else { return ids }
                let pending = Set(unwritten)
                let listed = Set(ids.lazy.filter { pending.contains($0) })
                return ids + unwritten.filter { !listed.contains($0) }
            }
            ids += page.compactMap { ChunkID(raw: $0) }
            after = last
            state.yieldToWaiters() // a waiting reader goes first (the lock is not fair)
        }
    }

    /// Between two holds of background work: a thread waiting for the lock takes it first.
    func yieldToWaiters() { state.yieldToWaiters() }

    /// Durability barrier for every row written so far (`all`: by any process, even if
    /// this one wrote none: recovery after a crash).
    func sync(all: Bool = false) throws(StoreError) {
        try state.withLock { (s) throws(StoreError) in
            guard s.unsynced || all, let db = s.db else { return }
            try Self.commit(&s)
            try db.execute("PRAGMA synchronous=FULL")
            defer { try? db.execute("PRAGMA synchronous=NORMAL") }
            // A transaction that writes, so that its commit (and the WAL's fsync) happens.
            try db.transaction { () throws(StoreError) in
                try db.execute("DELETE FROM barrier")
                try db.execute("INSERT INTO barrier(n) VALUES(1)")
            }
            try db.commitBatch() // with group commit on, the transaction above opened a batch
            s.unsynced = false
        }
    }

    let checkpointer: WALCheckpointer

    /// Gives the pages of swept rows back to the filesystem, a `vacuumStep` per hold of
    /// the lock (a vacuum of everything at once would stall saves of small files).
    func compact() throws(StoreError) {
        while try state.withLock({ (s) throws(StoreError) -> Bool in
            guard let db = s.db else { return false }
            return try db.vacuumStep()
        }) {
            state.yieldToWaiters() // a waiting reader goes first (the lock is not fair)
        }
    }

    /// Statements run on the database so far (the work tests count a save's).
    var statements: Int { state.withLock { $0.db?.statements ?? 0 } }

    /// The database's size on disk, WAL included (O(1): `ubiquity status`).
    var diskBytes: Int64 { SQLiteDatabase.diskBytes(path: path) }
}
