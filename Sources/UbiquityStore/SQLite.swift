import CSQLite
import Glibc
import Synchronization
import UbiquitySystem

/// A thin wrapper over one SQLite connection. Not thread-safe: the owner serializes access
/// (the index's: the store's lock holder runs its statements, except while another thread
/// holds the index's lock, `Index`).
final class SQLiteDatabase {
    private var db: OpaquePointer?
    private var cache: [String: OpaquePointer] = [:]
    let path: String

    /// - Parameter readOnly: a connection that only reads (`reader`).
    init(path: String, readOnly: Bool = false) throws(StoreError) {
        self.path = path
        let flags = (readOnly ? SQLITE_OPEN_READONLY : SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE) | SQLITE_OPEN_NOMUTEX
        let rc = sqlite3_open_v2(path, &db, flags, nil)
        guard rc == SQLITE_OK else {
            let message = db.map { String(cString: sqlite3_errmsg($0)) } ?? "out of memory"
            sqlite3_close(db)
            throw .database("cannot open \(path): \(message)")
        }
        sqlite3_busy_timeout(db, 5000)
        sqlite3_extended_result_codes(db, 1)
    }

    /// Makes every transaction committed so far durable, without a checkpoint: one fsync
    /// of the WAL (whose committed frames are the database's newest state) and of its
    /// directory (a WAL the crashed process made may not have had its name flushed). A
    /// checkpoint would also copy the WAL into the database, which at an open after a
    /// crash cost more than the rest of the open.
    func syncCommitted() throws(StoreError) { try Self.syncCommitted(path: path) }

    /// `syncCommitted` of the database at `path`, from any thread: it touches the files
    /// only, so its owner need not hold the connection's lock.
    static func syncCommitted(path: String) throws(StoreError) {
        let directory = String(path[..<(path.lastIndex(of: "/") ?? path.startIndex)])
        try StoreError.wrap { () throws(SystemError) in
            do throws(SystemError) { try fsyncPath(path + "-wal") } catch {
                // No WAL: everything is in the database file.
                guard error.code == ENOENT else { throw error }
                try fsyncPath(path)
            }
            try fsyncPath(directory.isEmpty ? "." : directory, directory: true)
        }
    }

    deinit {
        for statement in cache.values { sqlite3_finalize(statement) }
        sqlite3_close(db)
        committed?.release()
    }

    // MARK: the index's lock (Index, Store+BackgroundFold)

    /// Who has the connection (the index's, `Index.lend`; nil: a connection no other
    /// thread uses): the store's lock holder, or the thread that holds the index's lock,
    /// such as the group commit's folder, which writes a fold with it outside the store's
    /// lock. The store's holder that needs it meanwhile waits for it back (`claim`),
    /// except for reads around the gate, which go to `reader`.
    private var lock: IndexLock?
    /// A second connection, read-only, for reads around the gate while another thread
    /// holds the index's lock: they see what is committed, and the overlay holds the fold
    /// under way until the store marks it folded, so they see each row either there or in
    /// SQLite.
    var reader: SQLiteDatabase?
    /// Reads around the gate under way on the store's side that go to `reader` (touched
    /// only by threads that do not hold the index's lock).
    private var asideDepth = 0
    /// Called on the store's side after a claim got the connection back: the store
    /// finishes the fold's bookkeeping (`Store.settleFold`) before it uses it.
    var returned: (() -> Void)?

    /// Times the store's side waited for the connection (the work tests count them:
    /// requests on the namespace alone never do). Touched by the store's side only.
    private(set) var loanWaits = 0

    /// Makes `lock` the index's lock this connection is used under (`Index`).
    func guarded(by lock: IndexLock) { self.lock = lock }

    /// Whether another thread than the caller holds the index's lock.
    var isLentElsewhere: Bool { lock?.isLentElsewhere ?? false }
    /// Whether the calling thread holds the index's lock.
    var isBorrowedHere: Bool { lock?.isBorrowedHere ?? false }

    /// Before any use of the connection: when another thread holds the index's lock,
    /// waits until it lets it go, then lets the store finish the fold's bookkeeping.
    func claim() {
        guard isLentElsewhere else { return }
        waitUntilReturned()
        returned?()
    }

    /// Waits until another thread that holds the index's lock, if any, lets it go (the
    /// store's side).
    func waitUntilReturned() {
        guard let lock, lock.isLentElsewhere else { return }
        loanWaits += 1
        lock.awaitEnd()
    }

    /// Rung when the group commit's batch opens: the filesystem's group-commit loop sleeps
    /// until then and commits it 100 ms later.
    var batchOpened: Doorbell?
    /// Rung by every commit of this connection, from SQLite's commit hook (the
    /// background checkpoint loop has work); retained until the connection closes.
    private var committed: Unmanaged<Doorbell>?

    func ringOnCommit(_ bell: Doorbell) {
        committed?.release()
        let retained = Unmanaged.passRetained(bell)
        committed = retained
        sqlite3_commit_hook(db, { context in
            Unmanaged<Doorbell>.fromOpaque(context!).takeUnretainedValue().ring()
            return 0 // go on with the commit
        }, retained.toOpaque())
    }

    // MARK: the tree overlay's gate

    /// Called before any statement on a table the tree overlay shadows (`TreeOverlay`):
    /// the store folds the overlay there, so the statement reads and writes after every
    /// change the overlay holds. A read that looks at the overlay itself first goes
    /// around it (`aroundGate`).
    var beforeTreeStatement: (() throws(StoreError) -> Void)?
    /// Told of every transaction level that ends (the level, and whether it committed):
    /// a fold written inside a level that rolls back goes back to the overlay.
    var levelEnded: ((Int, Bool) -> Void)?
    private var gateOpen = false

    private func ended(_ level: Int, committed: Bool) {
        if !committed { rollbacks += 1 }
        levelEnded?(level, committed)
    }
    private var rollbacks = 0

    /// What this connection has changed so far: the rows its statements inserted, updated
    /// or deleted (SQLite's count), and the transactions and savepoints it rolled back.
    /// While the mark stays the same, a read returns what it returned before: memos of
    /// reads keep it (`StoredHistories`). The owner reads it while it holds the connection.
    struct ChangeMark: Equatable {
        let changes: Int64
        let rollbacks: Int
    }
    var changeMark: ChangeMark { ChangeMark(changes: sqlite3_total_changes64(db), rollbacks: rollbacks) }
    private var shadowed: [String: Bool] = [:]

    /// The tables whose rows the overlay may hold newer than SQLite: the tree's (and its
    /// xattrs), and what folding a save or a tombstone writes (its version, the synced
    /// view, the histories shown); `content_totals` follows `inodes` by triggers.
    static let overlayTables = ["inodes", "entries", "pending", "content_totals", "versions", "histories", "history_dirs",
                                "view_heads", "view_awaited", "view_current", "view_paths", "view_conflicts", "own_dots", "xattrs"]

    static func namesOverlayTable(_ sql: String) -> Bool {
        let words = sql.split { !($0.isLetter || $0.isNumber || $0 == "_") }
        return words.contains { overlayTables.contains($0.lowercased()) }
    }

    private func gate(_ sql: String, remember: Bool) throws(StoreError) {
        guard let hook = beforeTreeStatement, !gateOpen else { return }
        let names: Bool
        if let known = shadowed[sql] {
            names = known
        } else {
            names = Self.namesOverlayTable(sql)
            if remember { shadowed[sql] = names }
        }
        guard names else { return }
        try aroundGate(hook)
    }

    /// Runs `body` with the gate open: its statements do not fold the overlay (the fold
    /// itself, and reads that consult the overlay first).
    /// While the connection is lent, such reads go to `reader` (all of `body`'s, even
    /// when the loan ends before it does).
    func aroundGate<T>(_ body: () throws(StoreError) -> T) throws(StoreError) -> T {
        if !isBorrowedHere && (asideDepth > 0 || isLentElsewhere) && reader != nil {
            asideDepth += 1
            defer { asideDepth -= 1 }
            return try body()
        }
        claim()
        if gateOpen { return try body() }
        gateOpen = true
        defer { gateOpen = false }
        return try body()
    }

    /// Open transactions: the group-commit batch counts as one, each savepoint or
    /// transaction inside it as one more.
    var level: Int {
        claim()
        return (batchOpen ? 1 : 0) + depth
    }
    /// Inside a transaction or savepoint (not just the batch): the store writes the tree
    /// straight to SQLite there, so a rollback undoes it with the rest.
    var inTransaction: Bool {
        claim()
        return depth > 0
    }

    /// Runs `body` in the open batch or transaction (each of its statements is atomic;
    /// the caller makes repeating it harmless), else in the batch it opens when batching,
    /// else in a transaction of its own.
    func withinTransaction(_ body: () throws(StoreError) -> Void) throws(StoreError) {
        claim()
        if depth > 0 || batchOpen { return try body() }
        if batching {
            try openBatch()
            return try body()
        }
        try transaction(body)
    }

    /// Runs SQL with no parameters and no results (schema, pragmas, BEGIN/COMMIT).
    func execute(_ sql: String) throws(StoreError) {
        claim()
        try gate(sql, remember: false)
        var error: UnsafeMutablePointer<CChar>?
        if sqlite3_exec(db, sql, nil, nil, &error) != SQLITE_OK {
            let message = error.map { String(cString: $0) } ?? "unknown error"
            sqlite3_free(error)
            throw .database("\(message) (in: \(sql.prefix(80)))")
        }
    }

    /// Runs one statement with parameters, calling `row` for each result row.
    func query(_ sql: String, _ params: [SQLValue] = [], row: (SQLRow) throws(StoreError) -> Void = { _ in }) throws(StoreError) {
        if !isBorrowedHere && asideDepth > 0, let reader { return try reader.query(sql, params, row: row) }
        claim()
        try gate(sql, remember: true)
        let statement = try prepared(sql)
        statements += 1
        if failingStatements.contains(statements) { throw .database("statement \(statements) failed on purpose (a test's)") }
        defer {
            // Rows SQLite examined for it, indexes and scans alike (the work tests count).
            work += Int(sqlite3_stmt_status(statement, SQLITE_STMTSTATUS_VM_STEP, 1))
            sqlite3_reset(statement)
            sqlite3_clear_bindings(statement)
        }
        for (index, value) in params.enumerated() {
            let position = Int32(index + 1)
            let rc: Int32
            switch value {
            case .null: rc = sqlite3_bind_null(statement, position)
            case .int(let v): rc = sqlite3_bind_int64(statement, position, v)
            case .text(let v): rc = sqlite3_bind_text(statement, position, v, -1, sqliteTransient)
            case .blob(let v):
                rc = v.withUnsafeBytes { bytes in
                    sqlite3_bind_blob64(statement, position, bytes.baseAddress ?? UnsafeRawPointer(bitPattern: 1), sqlite3_uint64(bytes.count), sqliteTransient)
                }
            }
            guard rc == SQLITE_OK else { throw .database("bind failed: \(errorMessage)") }
        }
        while true {
            let rc = sqlite3_step(statement)
            if rc == SQLITE_DONE { return }
            guard rc == SQLITE_ROW else { throw .database("\(errorMessage) (in: \(sql.prefix(80)))") }
            try row(SQLRow(statement: statement!))
        }
    }

    /// The rows of a query, mapped.
    func rows<T>(_ sql: String, _ params: [SQLValue] = [], _ map: (SQLRow) throws(StoreError) -> T) throws(StoreError) -> [T] {
        var result: [T] = []
        try query(sql, params) { (r) throws(StoreError) in result.append(try map(r)) }
        return result
    }

    /// The rows of a query over many keys, a page of 256 keys per statement: `sql` is
    /// given the page's placeholders ("?,?,…") for its `IN (…)`; `before`: parameters
    /// ahead of them. A short last page is padded with its own last key, so there is one
    /// statement text to prepare (a device joining takes in a million records).
    func rows<T>(in keys: [String], before: [SQLValue] = [], _ sql: (String) -> String,
                 _ map: (SQLRow) throws(StoreError) -> T) throws(StoreError) -> [T] {
        try rows(in: keys.map { SQLValue.text($0) }, before: before, sql, map)
    }

    func rows<T>(in keys: [SQLValue], before: [SQLValue] = [], _ sql: (String) -> String,
                 _ map: (SQLRow) throws(StoreError) -> T) throws(StoreError) -> [T] {
        let page = 256
        let text = sql(Array(repeating: "?", count: page).joined(separator: ","))
        var result: [T] = []
        for start in stride(from: 0, to: keys.count, by: page) {
            let part = keys[start..<min(keys.count, start + page)]
            let params = before + Array(part) + Array(repeating: part.last!, count: page - part.count)
            result += try rows(text, params, map)
        }
        return result
    }

    var lastInsertRowID: Int64 {
        claim()
        return sqlite3_last_insert_rowid(db)
    }

    /// Defines `name(x)` on this connection, a deterministic SQL function of one value: a
    /// text that `transform` maps to bytes becomes that blob; anything else (another text,
    /// a blob, NULL) is returned as it is. For the store's upgrades (format 13: ids as
    /// bytes), which rewrite columns in one statement each.
    func defineTextToBlob(_ name: String, _ transform: @escaping (String) -> [UInt8]?) throws(StoreError) {
        final class Box { let transform: (String) -> [UInt8]?; init(_ t: @escaping (String) -> [UInt8]?) { transform = t } }
        let box = Unmanaged.passRetained(Box(transform)).toOpaque()
        let rc = sqlite3_create_function_v2(db, name, 1, SQLITE_UTF8 | SQLITE_DETERMINISTIC, box, { context, count, values in
            guard count == 1, let value = values?[0] else { return }
            guard sqlite3_value_type(value) == SQLITE_TEXT, let text = sqlite3_value_text(value),
                  let user = sqlite3_user_data(context) else {
                sqlite3_result_value(context, value)
                return
            }
            let string = String(decoding: UnsafeBufferPointer(start: text, count: Int(sqlite3_value_bytes(value))), as: UTF8.self)
            guard let bytes = Unmanaged<Box>.fromOpaque(user).takeUnretainedValue().transform(string) else {
                sqlite3_result_value(context, value)
                return
            }
            if bytes.isEmpty {
                sqlite3_result_zeroblob(context, 0)
            } else {
                bytes.withUnsafeBytes { sqlite3_result_blob(context, $0.baseAddress, Int32($0.count), sqliteTransient) }
            }
        }, nil, nil, { user in
            if let user { Unmanaged<Box>.fromOpaque(user).release() }
        })
        guard rc == SQLITE_OK else { throw .database("defining \(name): \(errorMessage)") }
    }

    /// Virtual-machine steps of every statement run so far: a measure of rows read that
    /// does not depend on timing. Tests assert that operations stay proportional to their
    /// change, not to the size of the database.
    private(set) var work = 0
    /// Statements run so far (the work tests count them per record a device takes in).
    private(set) var statements = 0
    /// Tests: the statements that make `statements` one of these numbers fail before they
    /// run, as a crash there would leave its transaction unfinished.
    var failingStatements: Set<Int> = []
    /// Database pages this connection has written (to the WAL) so far: what a commit of
    /// changes spread all over the B-trees costs (the work tests count them per record a
    /// device takes in).
    var pagesWritten: Int {
        var current: Int32 = 0, highwater: Int32 = 0
        sqlite3_db_status(db, SQLITE_DBSTATUS_CACHE_WRITE, &current, &highwater, 0)
        return Int(current)
    }
    var changes: Int {
        claim()
        return Int(sqlite3_changes(db))
    }

    /// Group commit: when on, changes accumulate in one open transaction that
    /// `commitBatch()` commits (the filesystem does so every 100 ms, at every saved
    /// version and at every fsync). One SQLite commit per create or unlink would be most
    /// of their cost. A crash of the process loses at most the metadata-only changes (mkdir,
    /// unlink, rename, chmod) of the last 100 ms, never a saved file, never consistency.
    var batching = false
    private var batchOpen = false
    /// Transactions open inside one another (an inner one is a savepoint).
    private var depth = 0
    /// Inside `standalone`: inner transactions are part of it, with no savepoint each.
    private var flat = false

    /// Runs one statement (atomic by itself: SQLite undoes a statement that fails) in the
    /// open batch, or opening one, with no savepoint around it: a savepoint journals every
    /// page the statement touches to a temp file first (gigabytes of them while a device
    /// joins a container of many small files: one statement per chunk put).
    func statement(_ sql: String, _ params: [SQLValue]) throws(StoreError) {
        claim()
        if batching && !batchOpen && depth == 0 { try openBatch() }
        try query(sql, params)
    }

    /// Opens the group-commit batch, its journals in memory. Every metadata operation in
    /// the batch is a savepoint, and SQLite spills a savepoint's journal to a temporary file
    /// in /var/tmp past 64 KiB; a spilled journal is not emptied when the savepoint is
    /// released, so once a batch passes 64 KiB each create, save and unlink writes every page
    /// it changes there (a pwrite per page, dozens per small file created, and a new file
    /// per batch). In memory, each operation's journal is emptied at its release. The same
    /// holds for the statement journal of a `standalone` step (below). A migration, and a
    /// step whose one statement may touch a whole table (a barrier's UPDATE of every
    /// version a join took in), keep SQLite's default and spill, so no journal holds the
    /// table in memory. (`SQLITE_CONFIG_STMTJRNL_SPILL` is no substitute: it is process-wide,
    /// so it changes every transaction, and SQLite 3.40 fails a big UPDATE with SQLITE_FULL
    /// at thresholds from 256 KiB to 4 MiB.)
    private func openBatch() throws(StoreError) {
        try journalsInMemory(true)
        try execute("BEGIN IMMEDIATE")
        batchOpen = true
        batchOpened?.ring()
    }

    /// `temp_store` (which decides whether the transaction's journals stay in memory) as
    /// the next transaction needs it; SQLite reads it when a transaction begins.
    private func journalsInMemory(_ on: Bool) throws(StoreError) {
        guard on != tempInMemory else { return }
        try execute(on ? "PRAGMA temp_store=MEMORY" : "PRAGMA temp_store=DEFAULT")
        tempInMemory = on
    }
    private var tempInMemory = false

    /// Runs `body` atomically: its own transaction, or a savepoint inside the open batch
    /// or an enclosing transaction. Rolls back what `body` did if it throws.
    func transaction<T>(_ body: () throws(StoreError) -> T) throws(StoreError) -> T {
        claim()
        if flat { return try body() }
        if batching && !batchOpen { try openBatch() }
        if batchOpen || depth > 0 {
            try control("SAVEPOINT op")
            savepoints += 1
            depth += 1
            let opened = level
            defer { depth -= 1 }
            do {
                let result = try body()
                try control("RELEASE op")
                ended(opened, committed: true)
                return result
            } catch {
                try? control("ROLLBACK TO op")
                try? control("RELEASE op")
                ended(opened, committed: false)
                throw error
            }
        }
        try journalsInMemory(false)
        try execute("BEGIN IMMEDIATE")
        depth += 1
        defer { depth -= 1 }
        do {
            let result = try body()
            try execute("COMMIT")
            ended(1, committed: true)
            return result
        } catch {
            try? execute("ROLLBACK")
            ended(1, committed: false)
            throw error
        }
    }

    /// `transaction`, with every transaction inside it flattened into its one savepoint
    /// (see `standalone` for why, and for the rule its body must keep).
    func flattened<T>(_ body: () throws(StoreError) -> T) throws(StoreError) -> T {
        try transaction { () throws(StoreError) -> T in
            let was = flat
            flat = true
            defer { flat = was }
            return try body()
        }
    }

    /// A savepoint's statement, prepared once: every metadata operation inside the
    /// group-commit batch is a savepoint (two or three nested), and `execute` would parse
    /// "SAVEPOINT op" and "RELEASE op" anew each time, two dozen parses per editor save.
    private func control(_ sql: String) throws(StoreError) {
        let statement = try prepared(sql)
        let rc = sqlite3_step(statement)
        let message = rc == SQLITE_DONE ? "" : errorMessage
        sqlite3_reset(statement)
        guard rc == SQLITE_DONE else { throw .database("\(message) (in: \(sql))") }
    }

    /// Disk space of the database file at `path` and its WAL (O(1): two stats).
    static func diskBytes(path: String) -> Int64 {
        var total: Int64 = 0
        for p in [path, path + "-wal"] {
            var st = stat()
            if stat(p, &st) == 0 { total = total.addingClamped(Int64(st.st_blocks).multipliedClamped(by: 512)) }
        }
        return total
    }

    /// The WAL file is cut back to this after a checkpoint (`journal_size_limit`): a big
    /// prune or gc would otherwise leave it at its largest size for good.
    static let walSizeLimit = 4 << 20

    /// WAL bytes past which a commit of the serving connection checkpoints by itself (and
    /// fsyncs, on the committing thread). SQLite's default of 1,000 pages is met by every
    /// slice of a device joining a container, and those fsyncs would take a large part of
    /// the join: the background checkpoints (`WALCheckpointer`, every 5 s) keep the
    /// WAL short instead, and this bounds it when they fall behind.
    static let autoCheckpointBytes = 64 << 20

    /// `autoCheckpointBytes` for this database's page size.
    func limitWAL() throws(StoreError) {
        let pageSize = try rows("PRAGMA page_size", []) { $0.int(0) }.first ?? 4096
        try execute("PRAGMA wal_autocheckpoint=\(Int64(Self.autoCheckpointBytes) / max(pageSize, 512))")
    }

    /// One step of an incremental vacuum (auto_vacuum=INCREMENTAL databases): frees up to
    /// 32 pages. Returns whether free pages remain.
    func vacuumStep() throws(StoreError) -> Bool {
        try commitBatch()
        let free = { () throws(StoreError) -> Int64 in try self.rows("PRAGMA freelist_count", []) { $0.int(0) }.first ?? 0 }
        let before = try free()
        guard before > 0 else { return false }
        try execute("PRAGMA incremental_vacuum(32)")
        let after = try free()
        // No progress: not an auto-vacuum database (a store from before format 5).
        return after > 0 && after < before
    }

    /// Runs `body` as a transaction of its own (the batch must be committed: the caller
    /// does it), with every transaction inside it flattened into it. A savepoint makes
    /// SQLite journal each page it touches again, to a temporary file: a device taking in
    /// records would write dozens of pages per record that way. Only for bodies that let
    /// every error through: one that caught an inner failure and went on
    /// would keep that inner transaction's partial writes. Nested in a transaction, it is
    /// an ordinary inner one.
    ///
    /// With no savepoint, the journals are statement journals: SQLite keeps the pages a
    /// statement that may fail halfway changes (an upsert, an `INSERT … SELECT`), and
    /// empties the journal when the statement ends. Kept in memory, that is a few pages
    /// a statement. Spilled to a file, as by default, the file is not emptied, and every
    /// such statement after the first 64 KiB writes each page it changes there: 5 KiB a
    /// record while a device joins, five times what the WAL gets. `wholeTable`: a
    /// statement of `body` may change a whole table (its journal stays on disk).
    func standalone<T>(wholeTable: Bool = false, _ body: () throws(StoreError) -> T) throws(StoreError) -> T {
        claim()
        guard depth == 0, !batchOpen, !flat else { return try transaction(body) }
        try journalsInMemory(!wholeTable)
        try execute("BEGIN IMMEDIATE")
        depth += 1
        flat = true
        defer { depth -= 1; flat = false }
        do {
            let result = try body()
            try execute("COMMIT")
            standaloneCommits += 1
            ended(1, committed: true)
            return result
        } catch {
            try? execute("ROLLBACK")
            ended(1, committed: false)
            throw error
        }
    }

    /// Savepoints opened so far (the work tests count a fold's).
    private(set) var savepoints = 0

    /// Commits of `standalone` so far (the work tests count a join's).
    private(set) var standaloneCommits = 0

    /// Commits the open batch, if any.
    func commitBatch() throws(StoreError) {
        claim()
        guard batchOpen else { return }
        do {
            try execute("COMMIT")
        } catch {
            // A commit that failed may have ended the transaction (an I/O error rolls it
            // back) or left it open (busy): only an open one is tried again.
            if sqlite3_get_autocommit(db) != 0 {
                batchOpen = false
                ended(1, committed: false)
            }
            throw error
        }
        batchOpen = false
        ended(1, committed: true)
    }

    /// Whether a group-commit batch is open (changes wait for `commitBatch`).
    var hasOpenBatch: Bool {
        claim()
        return batchOpen
    }

    private var errorMessage: String { String(cString: sqlite3_errmsg(db)) }

    private func prepared(_ sql: String) throws(StoreError) -> OpaquePointer? {
        if let statement = cache[sql] { return statement }
        var statement: OpaquePointer?
        guard sqlite3_prepare_v2(db, sql, -1, &statement, nil) == SQLITE_OK else {
            throw .database("\(errorMessage) (in: \(sql.prefix(80)))")
        }
        cache[sql] = statement
        return statement
    }
}

enum SQLValue {
    case null
    case int(Int64)
    case text(String)
    case blob([UInt8])
}

/// One result row; valid only inside the row callback.
struct SQLRow {
    let statement: OpaquePointer

    func int(_ column: Int32) -> Int64 { sqlite3_column_int64(statement, column) }
    func isNull(_ column: Int32) -> Bool { sqlite3_column_type(statement, column) == SQLITE_NULL }
    func isText(_ column: Int32) -> Bool { sqlite3_column_type(statement, column) == SQLITE_TEXT }
    func isBlob(_ column: Int32) -> Bool { sqlite3_column_type(statement, column) == SQLITE_BLOB }
    func text(_ column: Int32) -> String {
        guard let p = sqlite3_column_text(statement, column) else { return "" }
        return String(cString: p)
    }
    /// A text column's bytes in place, valid until the next step (no String made).
    func utf8(_ column: Int32) -> UnsafeBufferPointer<UInt8> {
        guard let p = sqlite3_column_text(statement, column) else { return UnsafeBufferPointer(start: nil, count: 0) }
        return UnsafeBufferPointer(start: p, count: Int(sqlite3_column_bytes(statement, column)))
    }
    func blob(_ column: Int32) -> [UInt8] {
        let count = Int(sqlite3_column_bytes(statement, column))
        guard count > 0, let p = sqlite3_column_blob(statement, column) else { return [] }
        return Array(UnsafeRawBufferPointer(start: p, count: count))
    }
}

/// SQLITE_TRANSIENT: SQLite copies the bound value (the macro is not importable).
private let sqliteTransient = unsafeBitCast(OpaquePointer(bitPattern: -1), to: sqlite3_destructor_type.self)

/// Checkpoints of a WAL database from a connection of their own, so that commits of the
/// serving connection seldom run one (a checkpoint writes pages back and fsyncs the
/// database: milliseconds, which a save, or a read waiting for the serving connection's
/// lock, would otherwise pay). A mounted filesystem calls `run()` every 5 s; a PASSIVE
/// checkpoint never blocks the serving connection's readers or writers. The serving
/// connection keeps its automatic checkpoint (at 1,000 pages) as the bound on the WAL
/// when a burst of writes (a prune) outruns these.
final class WALCheckpointer: @unchecked Sendable {
    private let path: String
    private let connection = Locked<SQLiteDatabase?>(nil)

    init(path: String) { self.path = path }

    func run() throws(StoreError) {
        try connection.withLock { (c) throws(StoreError) in
            if c == nil {
                let db = try SQLiteDatabase(path: path)
                try db.execute("PRAGMA journal_size_limit=\(SQLiteDatabase.walSizeLimit)")
                c = db
            }
            try c?.execute("PRAGMA wal_checkpoint(PASSIVE)")
        }
    }
}

