import Glibc
import UbiquitySystem

/// The tree's rows written ahead of SQLite: outside a transaction, a change to an inode,
/// an entry or a pending set goes to the overlay (`TreeOverlay`) and, when the store's
/// lock is let go, into one frame of the operation log (`log/`); SQLite gets it at the
/// next fold, in one transaction with the log's mark (`tree_log_mark`).
///
/// The rules that keep SQLite and the overlay one tree:
/// - Any statement on `inodes`, `entries` or `pending` folds the overlay first (the
///   gate, `SQLiteDatabase.beforeTreeStatement`); reads that look at the overlay first
///   (`node`, `childID`, listings) go around it.
/// - Inside a transaction the tree is written straight to SQLite (after the gate's
///   fold), so a rollback undoes it with the rest; a fold written inside a transaction
///   that rolls back goes back to the overlay (its frames are in the log).
/// - A frame holds rows as they are after the change, so writing one twice is harmless:
///   a fold that failed halfway is simply written again.
/// - The mark is the last frame appended before the fold (the fold logs what it holds
///   first), so a crash after the fold's commit replays nothing it wrote.
extension Store {
    /// Whether tree writes go to the overlay now: in a mounted store (one that batches its
    /// commits; its shared store logs at every release of its lock), outside transactions
    /// and folds. A store used directly (a command, a test) writes through as before.
    /// While the connection is lent to the folder, the lock's holder is outside every
    /// transaction (it began none: that needs the connection), and the folder itself
    /// writes to SQLite.
    var overlayOn: Bool {
        if db.isBorrowedHere { return false }
        guard treeLog != nil, db.batching else { return false }
        return db.isLentElsewhere || (!db.inTransaction && !index.folding)
    }

    /// Opens the operation log and replays what it holds after the index's mark into the
    /// overlay, in memory only: the group commit folds it in the background, a part at a
    /// time, as it folds a burst (a mount after a crash serves at once; the open's own
    /// reads look at the overlay first, like a request's). Returns how many changes
    /// were replayed.
    func openTreeLog() throws(StoreError) -> Int {
        // Opening deletes the segments up to the mark: the mark (a commit the last process
        // may have left in the page cache) must be on the disk first.
        try db.syncCommitted()

        let mark = LogSequence(UInt64(try setting(Index.treeLogMarkKey) ?? "") ?? 0)
        var frames: [(sequence: LogSequence, changes: [TreeChange])] = []
        let opened = try OperationLog(directory: directory + "/log", after: mark) { (sequence, payload) throws(StoreError) in
            guard let changes = TreeChange.decode(payload) else {
                // Whole and checked, but not a frame this version writes: refusing to
                // open keeps its changes for the ubiquity that wrote them.
                throw .unsupportedFormat("\(directory)/log: frame \(sequence) is not one this ubiquity can read: upgrade ubiquity")
            }
            frames.append((sequence, changes))
        }
        treeLog = opened
        lastLogged = LogSequence(opened.nextSequence.value &- 1)
        foldedThrough = mark
        overlay = TreeOverlay(replayingFrames: frames)
        frames = []
        let replayed = overlay.changes
        // Saves withdrawn since the intents were last noted as applied: those folds kept
        // (`Index.keepWithdrawals`), and those the replay brings back.
        withdrawnAtOpen = try claimedIndex.withdrawnSetting()
        index.withdrawalsKept = !withdrawnAtOpen.isEmpty
        for case .withdraw(_, let id, _) in replayed { withdrawnAtOpen.insert(id) }
        for case .pending(let kind, let key) in replayed { restorePending(kind, key) }
        // Weak: the database and the sets live as long as the store, and the store's
        // deinit folds by itself (it commits through them after `self` is gone for closures).
        db.beforeTreeStatement = { [weak self] () throws(StoreError) in try self?.foldTree() }
        db.returned = { [weak self] in self?.settleFoldLogging() }
        let deferring = { [weak self] (kind: PendingKind, key: String) -> Bool in self?.deferPending(kind, key) ?? false }
        changed.deferInsert = deferring
        vacated.deferInsert = deferring
        orphaned.deferInsert = deferring
        held.deferInsert = deferring
        moved.deferInsert = deferring
        // The index's sets and the connection's levels: the index handles them, and
        // reaches these only on the store's side.
        index.attachNamespace(levelEnded: { [weak self] level, committed in self?.levelEnded(level, committed: committed) },
                              defersInsert: deferring)
        if !replayed.isEmpty {
            // A burst that has just ended, as far as the group commit's policy goes.
            let now = monotonicNanos()
            overlayTimes = (now, now)
            log("ubiquity: replayed \(replayed.count) tree changes from \(directory)/log (folded in the background)")
        }
        let stored = try db.aroundGate { () throws(StoreError) in
            try db.rows("SELECT max(row) FROM versions", []) { $0.isNull(0) ? 0 : $0.int(0) }.first ?? 0
        }
        nextVersionRow = max(stored, overlay.highestVersionRow) + 1
        return replayed.count
    }

    private func restorePending(_ kind: Int64, _ key: String) {
        switch PendingKind(rawValue: kind) {
        case .inode: changed.restore(key, parse: Self.changedInode)
        case .vacated: vacated.restore(key, parse: NameKey.init)
        case .recheck: recheck.restore(key, parse: NameKey.init)
        case .unreconciled: unreconciled.restore(key, parse: NameKey.init)
        case .orphaned: orphaned.restore(key, parse: { FileID(hex: $0) })
        case .held: held.restore(key, parse: { FileID(hex: $0) })
        case .moved: moved.restore(key, parse: Self.changedInode)
        case nil: break
        }
    }

    func deferPending(_ kind: PendingKind, _ key: String) -> Bool {
        guard overlayOn else { return false }
        addToOverlay(.pending(kind: kind.rawValue, key: key))
        return true
    }

    /// Writes one change: to the overlay when it is on, else to SQLite now.
    func record(_ change: TreeChange) throws(StoreError) {
        if overlayOn {
            addToOverlay(change)
        } else {
            let absorbed = bulkCreates != nil ? try absorbInBulk(change) : false
            if !absorbed { try writeDirectly(change) }
        }
        // The working set follows each change as it is made: readers take it without the
        // store's lock (`TreeCache`).
        switch change {
        case .putInode(let node): tree.withLock { $0.inodes.put(node) }
        case .putEntry(let parent, let name, let inode): tree.withLock { $0.directories.put(parent, NameKey(name), inode) }
        case .removeEntry(let parent, let name): tree.withLock { $0.directories.remove(parent, NameKey(name)) }
        case .dropInode(let id):
            tree.withLock { t in
                t.inodes.remove(id)
                t.directories.drop(id)
            }
        case .xattr(let id, let name, let value): tree.withLock { $0.inodes.changeXattr(id, name, value) }
        default: break
        }
    }

    /// The first change of an empty overlay rings the group commit's doorbell, as the
    /// first statement of a batch does: its loop folds and commits 100 ms later, so the
    /// overlay (and the log a mount would replay) holds at most that much.
    private func addToOverlay(_ change: TreeChange) {
        let now = monotonicNanos()
        if overlay.isEmpty {
            db.batchOpened?.ring()
            overlayTimes.first = now
        }
        overlayTimes.last = now
        overlay.apply(change)
    }

    /// Drops inodes at open: through the overlay and one log frame when the replay left
    /// changes there (a statement on `inodes` would fold them all now), else in SQLite.
    func dropAtOpen(_ ids: Set<InodeNumber>) throws(StoreError) {
        guard !ids.isEmpty else { return }
        guard treeLog != nil, !overlay.isEmpty else {
            for id in ids { try writeDirectly(.dropInode(id)) }
            return
        }
        for id in ids { addToOverlay(.dropInode(id)) }
        logTreeChanges(committingFirst: false)
    }

    /// Writes one change straight to SQLite (`Index.writeRow`), then lets the reserves of
    /// an inode it drops go.
    private func writeDirectly(_ change: TreeChange) throws(StoreError) {
        let facts = try namespaceFacts(for: [change])
        try claimedIndex.writeRow(change, facts: facts)
        releaseReserves(droppedIn: [change], facts: facts)
    }

    /// What the index needs of the namespace to write `changes`: which inodes they drop
    /// have reserves (when the table is in memory), and the overlay's versions of the heads
    /// their tombstones name (read there, not from SQLite).
    private func namespaceFacts(for changes: [TreeChange]) throws(StoreError) -> Index.NamespaceFacts {
        var facts = Index.NamespaceFacts()
        if let reserves {
            var reserved: Set<InodeNumber> = []
            for case .dropInode(let id) in changes where reserves[id] != nil { reserved.insert(id) }
            facts.reserved = reserved
        }
        for case .tombstone(_, _, _, let head?, _, _) in changes where overlay.saves[head] != nil {
            facts.heads[head] = try version(row: head)
        }
        return facts
    }

    /// The namespace's side of the reserves of inodes a write dropped, whose rows the index
    /// deleted (`NamespaceFacts.reserved`).
    private func releaseReserves(droppedIn changes: [TreeChange], facts: Index.NamespaceFacts) {
        for case .dropInode(let id) in changes where facts.reserved?.contains(id) ?? true { releaseReserve(id) }
    }

    /// Appends the overlay's changes not logged yet as one frame (the shared store does
    /// this each time its lock is let go, so a request's changes are one write(2) and
    /// are in the log before its reply). A log that fails is given up for the rest of
    /// this open: what it could not take is folded now, and later changes go straight to
    /// SQLite (the group commit's durability, as before the log).
    ///
    /// Writes that went straight to SQLite (the histories an editor's save adopts, a
    /// reserve fallocate set aside) wait in the group commit's batch, which a crash loses: when
    /// the batch is open, it is committed (the overlay folded into it first) before a
    /// change is logged, so no logged change survives a crash that the writes it may
    /// depend on did not.
    /// What the shared store does as each hold of its lock ends: the changes not logged go
    /// in one frame, unless none of them needs one (`TreeOverlay.unloggedNeedFrame`).
    public func logTreeChanges() {
        guard overlay.unloggedNeedFrame else { return }
        logTreeChanges(committingFirst: true)
    }

    func logTreeChanges(committingFirst: Bool) {
        guard overlay.hasUnlogged, let opLog = treeLog else { return }
        // What the batch holds is the request's too, and may depend on the tree changes
        // not logged yet (a version row deleted while the inode that named it moves on in
        // the overlay): both are committed together, the overlay folded, so a crash
        // keeps both or neither. A frame after the batch's commit would leave a window.
        // (Lent to the folder, the connection has no batch open: the fold's first step
        // committed it, and opening one waits for the connection.)
        if committingFirst && !db.isLentElsewhere && db.hasOpenBatch && !db.inTransaction {
            do {
                try commitBatch()
                return
            } catch {
                log("ubiquity: committing the batch before logging failed: \(error) (the change is logged; the batch commits later)")
            }
        }
        let payload = TreeChange.encode(overlay.takeUnlogged())
        do {
            lastLogged = try opLog.append(payload)
            overlay.noteFrame(lastLogged)
        } catch {
            log("ubiquity: the operation log failed (\(error)): tree changes go to SQLite directly until the next mount")
            treeLog = nil
            do { try foldTree() } catch { log("ubiquity: folding the tree after the log failed: \(error) (the next statement on the tree tries again)") }
        }
    }

    /// Writes the overlay's changes to SQLite, logging them first, with the mark of the
    /// last frame (the gate calls it; so do the group commit and a barrier).
    /// - Parameter alone: the caller is outside every transaction and may end the batch
    ///   (the group commit): the fold is then a transaction of its own, not a savepoint
    ///   in the batch. Inside a savepoint SQLite journals each page a statement first
    ///   changes, and the release of every statement's own savepoint walks that journal
    ///   from its start; a fold of thousands of changes spent a third of its time there.
    /// - Parameter limit: with `alone`, fold at most this many changes (whole frames, at
    ///   least one), so the caller can let the store's lock go between parts; the rest
    ///   stays in the overlay.
    func foldTree(alone: Bool = false, limit: Int? = nil) throws(StoreError) {
        settleFoldLogging()
        guard !overlay.isEmpty else {
            // Every change is in SQLite, but a part the folder wrote may have left its rows
            // here (`markFolded` does not rebuild them in the middle of a hold). What comes
            // through the gate may write SQLite past the overlay (a sync step shows another
            // device's version in its transaction): a row kept here would shadow that
            // write for every later read (`BackgroundFoldTests`, t-sync-garbage).
            if !overlay.changes.isEmpty { overlay = TreeOverlay() }
            return
        }
        logTreeChanges(committingFirst: false)
        let part = alone ? limit.flatMap { overlay.prefix(upTo: $0) } : nil
        let changes = Array(overlay.changes[overlay.folded..<(part?.end ?? overlay.changes.count)])
        let through = part?.through ?? lastLogged
        let fresh = overlay.freshHistories(in: changes)
        let facts = try namespaceFacts(for: changes)
        // The fold writes: it waits for whoever holds the index (a barrier's commit; a
        // folder's part is settled above), since its gate would otherwise send its
        // statements to the read-only connection that reads around it.
        db.claim()
        index.folding = true
        index.historiesUnplaced = fresh
        defer {
            index.folding = false
            index.historiesUnplaced = []
        }
        func fold() throws(StoreError) { try index.writeFolded(changes, fresh: fresh, through: through, facts: facts) }
        do {
            try db.aroundGate { () throws(StoreError) in
                if alone && !db.inTransaction {
                    // What the batch holds first (small chunks before it: a committed
                    // version never names a row that is not), and the intents applied with
                    // the saves that apply them.
                    try chunks.commitSmallChunks()
                    try db.commitBatch()
                    try db.standalone { () throws(StoreError) in
                        try fold()
                        // Only with the last part: a save still in the overlay is not in
                        // SQLite, so its intent must stay to be replayed.
                        if part == nil { try index.noteIntentsApplied(through: intentSequence) }
                    }
                } else {
                    try db.flattened(fold)
                }
            }
        } catch {
            overlay.forgetFresh()
            index.foldFailed = true
            throw error
        }
        releaseReserves(droppedIn: changes, facts: facts)
        if let part {
            overlay.markFolded(through: part.end)
        } else {
            overlay = TreeOverlay()
            index.foldFailed = false
        }
        if db.level > 0 {
            openFolds.append((db.level, changes, through))
        } else {
            foldedThrough = max(foldedThrough, through)
        }
    }

    /// A transaction level ended on the store's side (the index has undone its own memos
    /// of a rollback: `Index.levelEnded`): folds inside it now belong to the level around
    /// it (or are committed), or, when it rolled back, are the overlay's again, ahead of
    /// what it holds now.
    private func levelEnded(_ level: Int, committed: Bool) {
        if !committed { forgetCachedTree() }
        guard !openFolds.isEmpty else { return }
        if committed {
            for i in openFolds.indices where openFolds[i].level >= level { openFolds[i].level = level - 1 }
            for fold in openFolds where fold.level == 0 { foldedThrough = max(foldedThrough, fold.through) }
            openFolds.removeAll { $0.level == 0 }
            return
        }
        let undone = openFolds.filter { $0.level >= level }
        guard !undone.isEmpty else { return }
        openFolds.removeAll { $0.level >= level }
        let unlogged = overlay.changes.count - overlay.unlogged
        overlay = TreeOverlay(replaying: undone.flatMap(\.changes) + overlay.unfolded, unlogged: unlogged)
        forgetCachedTree()
    }

    /// Runs a tree change: in the overlay when it is on (a change that fails halfway is
    /// taken back out of it), else as one transaction.
    func treeChange<T>(_ body: () throws(StoreError) -> T) throws(StoreError) -> T {
        guard overlayOn else { return try treeTransaction(body) }
        let mark = overlay.changes.count
        do {
            return try body()
        } catch {
            overlay.rollBack(to: mark)
            forgetCachedTree()
            throw error
        }
    }

    /// Whether tree changes are written ahead in the operation log (false once it failed:
    /// they then wait in the group commit's batch, which a failed commit rolls back).
    public var writesAhead: Bool { treeLog != nil }

    /// Whether the log has segments whose frames are all folded: a durability barrier
    /// lets them go.
    public var treeLogNeedsTrim: Bool {
        guard let opLog = treeLog else { return false }
        let starts = opLog.segmentStarts
        return starts.count > 1 && starts[1].value &- 1 <= foldedThrough.value
    }
}
