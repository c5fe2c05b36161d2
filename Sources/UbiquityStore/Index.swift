import UbiquitySystem

/// The index: `meta.sqlite`'s serving connection, its lock, and the state a fold and a
/// sync step write with it (the synced view, the sets a fold adds to, the memos of folds
/// and pulls). One user at a time: the store's
/// lock holder (`SharedStore`) uses the connection whenever no other thread holds the
/// index's lock; the group commit's folder takes the lock under the store's lock
/// (`lend`, Store+BackgroundFold), lets the store's lock go, writes the part with the
/// connection (`write`), and lets the index's lock go. A durability barrier's commit
/// does the same (`writeBarrier`). The store's holder that needs the connection
/// meanwhile waits on the index's lock (`SQLiteDatabase.claim`); reads around the gate
/// go to a second, read-only connection instead (`openReader`), so requests on the
/// namespace never wait for the folder, and background work waits for it with the
/// store's lock let go (`SharedStore.withLock`).
///
/// What the folder gets: this index and the part (`Store.FoldPart`, immutable), not the
/// store. The fold's SQL is still the store's code, reached through `FoldWriter`.
final class Index: @unchecked Sendable {
    let connection: SQLiteDatabase
    private let lock = IndexLock()
    /// Writes a part's rows (the store, whose index-side methods hold the fold's SQL).
    weak var writer: (any FoldWriter)?

    // The fold's memos: written by whoever writes a fold (the folder, holding the index's
    // lock, or the store's holder folding through the gate while no one else holds it),
    // read by the code both run.

    /// Set while a fold is written: what it writes goes to SQLite.
    var folding = false
    /// Histories begun since the last fold (`TreeOverlay.isFresh`) whose row in
    /// `histories` the fold under way has not written yet: `placeHistory` need not look.
    var historiesUnplaced: Set<FileID> = []
    /// A fold failed since the overlay was last folded whole: what it wrote may be in
    /// SQLite already, so folds look for each version before writing it.
    var foldFailed = false
    /// Local files' versions the fold under way deleted, replaced by newer ones.
    var replacedInFold: [VersionID] = []
    /// While the folder writes: what it was told and what it found.
    var folderWork: Store.FolderWork?
    /// Set by the lock's holder while it writes without the store's lock (`write`,
    /// `writeBarrier`): read only by that thread (`Store.assertNamespaceSide`).
    var writingAside = false
    /// What the last part written left to its bookkeeping (`Store.settleFold`).
    var foldOutcome: Store.FoldOutcome?

    // What a fold and a sync step write besides the tables, used by whoever has the
    // connection (the store reaches them through accessors that claim it first).

    /// The synced view computed from all records (`Replica`).
    let replica: Replica
    /// Paths this device's own records changed the view of, and paths where the tree may
    /// not show the view yet (`Store.recheck`, `Store.unreconciled`): a fold adds to them.
    let recheck: PendingSet<NameKey>
    let unreconciled: PendingSet<NameKey>
    /// What a pull slice (or a fold) wrote that it reads again, while it runs.
    var takingIn: TakeInMemo?
    /// Records handed to the sync engine and not marked uploaded yet.
    var uploadsInFlight: Set<VersionID> = []
    /// Whether `settings` may hold withdrawals (`Store.keepWithdrawals`).
    var withdrawalsKept = false

    init(connection: SQLiteDatabase, replica: Replica, recheck: PendingSet<NameKey>, unreconciled: PendingSet<NameKey>) {
        self.connection = connection
        self.replica = replica
        self.recheck = recheck
        self.unreconciled = unreconciled
        connection.guarded(by: lock)
    }

    /// Opens the second, read-only connection that reads around the gate while another
    /// thread holds the lock.
    func openReader() throws(StoreError) {
        let reader = try SQLiteDatabase(path: connection.path, readOnly: true)
        try reader.execute("PRAGMA cache_size=-8192")
        connection.reader = reader
    }

    /// Whether another thread than the caller holds the lock.
    var isLentElsewhere: Bool { lock.isLentElsewhere }
    /// Whether the calling thread holds the lock.
    var isBorrowedHere: Bool { lock.isBorrowedHere }
    /// Whether any thread holds the lock.
    var isLent: Bool { lock.isLent }

    /// Gives the lock to the calling thread (under the store's lock), which must then
    /// `write` a part or `writeBarrier`, each of which lets it go.
    func lend() { lock.lend() }

    /// Told each time the lock is let go (`SharedStore`: it wakes the holders that wait
    /// for the index with its lock let go), so no such wait depends on a hold that
    /// happens to come after.
    var letGo: (() -> Void)?

    private func giveBack() {
        lock.giveBack()
        letGo?()
    }

    /// Step 2 of a part (Store+BackgroundFold), without the store's lock, on the thread
    /// the lock was lent to: writes the part in one transaction with its mark, leaves
    /// what it found to the bookkeeping (`foldOutcome`), and lets the lock go.
    func write(_ part: Store.FoldPart) {
        precondition(isBorrowedHere, "a part is written on the thread the index was lent to")
        defer { giveBack() }
        folding = true
        historiesUnplaced = part.fresh
        folderWork = Store.FolderWork(reserved: part.reserved)
        writingAside = true
        defer {
            writingAside = false
            folding = false
            historiesUnplaced = []
            folderWork = nil
        }
        var failure: StoreError?
        do throws(StoreError) {
            guard let writer else { throw .database("the store of part \(part.number) is gone") }
            try connection.aroundGate { () throws(StoreError) in
                try connection.standalone { () throws(StoreError) in try writer.writeFoldPart(part) }
            }
            if part.isLast { foldFailed = false }
        } catch {
            foldFailed = true
            failure = error
        }
        // The rest's rows, built here rather than under the store's lock at step 3.
        let rest = failure == nil ? part.rest.map { TreeOverlay.Rest(of: $0.changes, generation: $0.generation, from: part.end) } : nil
        foldOutcome = Store.FoldOutcome(number: part.number, error: failure, placed: folderWork?.placed ?? [], rest: rest)
    }

    /// A durability barrier's step 2 (`Store.markDurable`), without the store's lock, on
    /// the thread the lock was lent to: one transaction with synchronous=FULL, which
    /// fsyncs the WAL and so makes every metadata change committed so far durable (the
    /// chunks they name already are). It also marks the versions up to the mark as
    /// durable. Lets the lock go. Requests go on meanwhile, on the overlay and the second
    /// connection, as they do while the folder writes.
    func writeBarrier(_ barrier: Store.BarrierCommit) throws(StoreError) {
        precondition(isBorrowedHere, "a barrier's commit runs on the thread the index was lent to")
        writingAside = true
        defer {
            writingAside = false
            giveBack()
        }
        // Through the gate its UPDATE of `versions` would fold the overlay, which is the
        // namespace's: the versions it marks are in SQLite already (`beginBarrier`
        // folded and committed them, and the mark names none after).
        try connection.aroundGate { () throws(StoreError) in
            try connection.execute("PRAGMA synchronous=FULL")
            defer { try? connection.execute("PRAGMA synchronous=NORMAL") }
            // A transaction of its own, not a batch, its journal on disk: after a join its
            // UPDATE marks every record taken in (`SQLiteDatabase.openBatch`).
            try connection.standalone(wholeTable: true) { () throws(StoreError) in
                try connection.query("UPDATE versions SET durable = 1 WHERE durable = 0 AND row <= ?", [.int(barrier.mark.row)])
                // Always write something, so the commit (and its WAL fsync) really happens.
                try connection.execute("REPLACE INTO settings(key, value) VALUES('last_sync', strftime('%s','now'))")
            }
        }
    }
}

/// What the folder asks of the code that writes a fold's rows, while it holds the index's
/// lock: the part's rows and mark, and the intents it applies (the store's index-side
/// methods: Store+Overlay, Store+Versions, Store+Histories, `Replica`).
protocol FoldWriter: AnyObject {
    func writeFoldPart(_ part: Store.FoldPart) throws(StoreError)
}
