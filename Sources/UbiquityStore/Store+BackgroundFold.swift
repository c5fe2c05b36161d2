import UbiquitySystem

/// The group commit's fold, written outside the store's lock, so that requests go on
/// while SQLite takes a part of the overlay: they change only the overlay and the log,
/// and read what they do not find there from a second, read-only connection.
///
/// Three steps (a mount runs them through `SharedStore.groupCommit`):
/// 1. `beginFold`, under the store's lock: takes a part of the overlay (whole frames),
///    commits the batch (reads while the index is lent see only what is committed), and
///    lends the index (its lock) to the calling thread.
/// 2. `FoldPart.write` (`Index.write`), without the store's lock: writes the part in one
///    transaction with its mark, with the index and the part alone (Index+Fold: no way
///    to the store), and lets the index's lock go. What it does to the namespace
///    (history names placed) waits in the index's `foldOutcome`.
/// 3. `finishFold`, under the store's lock: marks the part folded in the overlay and
///    applies the outcome. Until then the overlay holds the part, so a reader sees each
///    of its rows there or in SQLite, never neither.
///
/// Anything else that needs the connection while the index is lent waits for it and then
/// does step 3 itself (`settleFold`), so the store's holder never finds a fold half done.
extension Store {
    /// A part of the overlay on its way to SQLite, and the index it goes to: all the
    /// folder is handed.
    public struct FoldPart {
        let index: Index
        let number: Int
        let changes: [TreeChange]
        /// Where it ends in the overlay's changes, and its last frame.
        let end: Int
        let through: LogSequence
        /// Histories it begins that SQLite has no row of (`historiesUnplaced`).
        let fresh: Set<FileID>
        /// Whether it is everything the overlay held: the intents up to `intentSequence`
        /// are then applied with it.
        let isLast: Bool
        let intentSequence: Int64
        /// Inodes it drops that have reserved ranges.
        let reserved: Set<InodeNumber>
        /// When the part leaves the overlay at most half unfolded (its rows are then
        /// rebuilt from the rest): the changes after the part, for the folder to build
        /// the rest's rows from (`TreeOverlay.Rest`).
        let rest: (changes: [TreeChange], generation: UInt64)?

        /// Step 2 (`Index.write`), on the thread the index was lent to.
        public func write() { index.write(self) }
    }

    /// What a written part leaves to its bookkeeping.
    struct FoldOutcome {
        let number: Int
        let error: StoreError?
        let placed: [String]
        var rest: TreeOverlay.Rest?
    }

    /// What the group commit's first step found to do.
    public enum FoldStart {
        case ended(GroupCommit)
        case fold(FoldPart)
    }

    /// Step 1: commits what waits when there is no fold to do; else takes a part and lends
    /// the index to the calling thread, which must call `FoldPart.write` next.
    /// - Parameter lastRequest: see `groupCommit`.
    /// - Parameter leaving: fold ahead of work that would fold under the lock (`SharedStore.foldAhead`):
    ///   a part whenever more than this many changes wait, burst or not, and nothing
    ///   committed otherwise.
    public func beginFold(lastRequest: Int64 = 0, leaving: Int? = nil) throws(StoreError) -> FoldStart {
        settleFoldLogging()
        if let leaving {
            guard overlay.unfolded.count > leaving else { return .ended(.done) }
        } else if overlay.isEmpty {
            return .ended(try foldDone())
        } else {
            let times = (first: overlayTimes.first, last: max(overlayTimes.last, lastRequest))
            guard foldPolicy.due(changes: overlay.unfolded.count, times: times, now: monotonicNanos()) else {
                try commitBatchWithoutFold()
                return .ended(.waiting)
            }
        }
        logTreeChanges(committingFirst: false)
        let prefix = overlay.prefix(upTo: foldPolicy.part(of: overlay.unfolded.count))
        let end = prefix?.end ?? overlay.changes.count
        let changes = Array(overlay.changes[overlay.folded..<end])
        try commitBatchWithoutFold()
        _ = try reservedRanges(Self.rootInode) // the table in memory, read once
        var reserved: Set<InodeNumber> = []
        for case .dropInode(let id) in changes where reserves?[id] != nil { reserved.insert(id) }
        foldsBegun += 1
        let count = overlay.changes.count
        let rebuilds = end < count && end >= count - end
        let part = FoldPart(index: index, number: foldsBegun, changes: changes, end: end, through: prefix?.through ?? lastLogged,
                            fresh: overlay.freshHistories(in: changes), isLast: prefix == nil,
                            intentSequence: intentSequence, reserved: reserved,
                            rest: rebuilds ? (Array(overlay.changes[end...]), overlay.generation) : nil)
        foldInFlight = part
        index.lend()
        return .fold(part)
    }

    /// Step 3, under the lock: the part's bookkeeping (unless a claim did it already),
    /// then what is left to do. Throws the part's error.
    public func finishFold(_ part: FoldPart) throws(StoreError) -> GroupCommit {
        if let error = settleFold(compacting: true) { throw error }
        return try groupCommitEnded()
    }

    /// After a part: the batch committed when nothing is left to fold.
    func groupCommitEnded() throws(StoreError) -> GroupCommit {
        guard overlay.isEmpty else { return .more }
        return try foldDone()
    }

    /// Nothing is left to fold: the batch is committed, then a slice of what moved
    /// directories left (Store+MovedTrees) is settled, and the loop comes back for
    /// the next while any is left.
    private func foldDone() throws(StoreError) -> GroupCommit {
        try commitBatch()
        return try settleMoves() ? .more : .done
    }

    /// Finishes the fold in flight, if any: waits for the folder to let the index's lock
    /// go, then marks the part folded and applies its outcome (a failed part stays in
    /// the overlay, folded again later). Called before the lock's holder uses the
    /// connection (`SQLiteDatabase.returned`) or folds.
    /// - Parameter compacting: the overlay may rebuild its rows (`TreeOverlay.markFolded`):
    ///   only at the start of a hold, not in the middle of a request that holds positions
    ///   in it.
    func settleFold(compacting: Bool = false) -> StoreError? {
        guard let part = foldInFlight else { return nil }
        db.waitUntilReturned()
        foldInFlight = nil
        guard var outcome = index.foldOutcome, outcome.number == part.number else {
            return .database("the fold of part \(part.number) left no outcome")
        }
        index.foldOutcome = nil
        if let error = outcome.error {
            overlay.forgetFresh()
            return error
        }
        for path in outcome.placed { historyNames.noteTaken(path) }
        for id in part.reserved { releaseReserve(id) }
        // The rest's only holder from here, so that applying the changes since does not
        // copy its tables.
        var rest = outcome.rest
        outcome.rest = nil
        overlay.markFolded(through: part.end, compacting: compacting, prebuilt: &rest)
        foldedThrough = max(foldedThrough, part.through)
        return nil
    }

    /// `settleFold` where no one waits for the fold's error: it is logged.
    func settleFoldLogging() {
        guard let error = settleFold() else { return }
        log("ubiquity: folding a part of the tree's changes failed (they stay in the overlay and the log, folded again later): \(error)")
    }
}
