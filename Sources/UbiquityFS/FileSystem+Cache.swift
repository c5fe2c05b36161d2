import UbiquityStore
import UbiquitySystem

/// The cache limit (`--cache-size`, files on demand): past it, the least recently used
/// files whose current version is safe in the backing store give their local copies back
/// (`evict`): unpinned, uploaded, closed and saved; small chunks that came inside records
/// stay. They stay listed and are fetched again when read. What counts is the bytes of
/// current contents here (`Store.contentTotals`, kept by the store's triggers: O(1)); the
/// history's own chunks are the retention policy's business. Space pressure (min-free,
/// size-limit) evicts the same way before it prunes any history.
///
/// When a file was opened is noted in memory (`uses`) and written in one transaction by
/// the next pass, so an open costs no database write; the order is as of that write.
extension FileSystem {
    /// Files looked at per hold of the lock.
    static let evictionPage = 64

    /// The content totals (O(1)).
    public func contentTotals() -> ContentTotals? { meta.withLock { $1.contentTotals() } }

    /// Writes the opens noted since the last call, `usesPerHold` per hold of the lock (a
    /// `grep -r` over a million files must not hold every other request behind one long
    /// write).
    static let usesPerHold = 250

    func writeUses() {
        let taken = uses.withLock { u -> [InodeNumber: Nanos] in defer { u = [:] }; return u }
        let sorted = taken.sorted { $0.key < $1.key }
        for (n, start) in stride(from: 0, to: sorted.count, by: Self.usesPerHold).enumerated() {
            // Each use dirties pages of its own: 16 slices put about 32 MiB in the WAL. A
            // checkpoint here, off the lock, keeps the serving connection's automatic one
            // (at 64 MiB, in the committing hold, where every request waits for it) from
            // running in a slice.
            if n > 0 && n % 16 == 0 { checkpointInBackground() }
            let slice = sorted[start..<min(start + Self.usesPerHold, sorted.count)]
            do { try withMetaSlice { (_, store) throws(StoreError) in try store.noteUses(slice) } } catch {
                log("ubiquity: cache: noting when files were used: \(error)")
                return
            }
        }
    }

    /// Runs from the maintenance loop (every 10 s): evicts until the contents here fit the
    /// cache limit, or nothing more may go.
    public func keepCacheLimit() {
        writeUses()
        guard let limit = options.cacheSize, let here = contentTotals()?.here, here > limit else { return }
        let (files, freed) = evictLeastRecentlyUsed { (contentTotals()?.here ?? 0) <= limit }
        let now = contentTotals()?.here ?? 0
        log("ubiquity: cache: \(byteText(here)) of contents here, more than cache-size \(byteText(limit)): evicted \(files) file(s), "
            + "freed \(byteText(freed)); \(byteText(now)) here now"
            + (now > limit ? " (the rest is pinned, open, unsaved or not uploaded yet)" : ""))
    }

    /// Evicts files least recently used first until `enough()` (asked before each file) or
    /// none is left that may go; returns how many went and the disk space freed. Each
    /// candidate is looked at once per call (a refused one is passed over). A walk that
    /// found too little is not made again while the contents here and the uploads
    /// pending stay the same (for at most 5 minutes: files get closed meanwhile), so a
    /// store that cannot shrink does not cost a walk of its files every 10 s.
    func evictLeastRecentlyUsed(now: Nanos = nowNanos(), until enough: () -> Bool) -> (files: Int, bytes: Int64) {
        guard hasSync else { return (0, 0) } // nowhere to fetch them back from
        let state = { self.meta.withLock { _, store in EvictionState(here: store.contentTotals()?.here ?? 0, pending: store.pendingUploadCount) } }
        if let last = space.withLock({ $0.evictionExhausted }), last.state == state(), now - last.at < 300 * 1_000_000_000 {
            return (0, 0)
        }
        let walk = walkLeastRecentlyUsed(until: enough)
        // Only a walk that looked at every candidate (not one the backing store cut short).
        if walk.ranOut && !enough() {
            let last = state()
            space.withLock { $0.evictionExhausted = (last, now) }
        }
        return (walk.files, walk.bytes)
    }

    struct EvictionState: Equatable {
        var here: Int64
        var pending: Int
    }

    /// `ranOut`: every candidate was looked at.
    private func walkLeastRecentlyUsed(until enough: () -> Bool) -> (files: Int, bytes: Int64, ranOut: Bool) {
        var cursor: (used: Nanos, ino: InodeNumber) = (Nanos.min, .zero)
        var files = 0, freed: Int64 = 0
        // Chunks pinned and open files use stay, whichever file they are evicted for.
        guard let inUse = try? chunksInUse() else { return (0, 0, false) }
        while !enough() {
            let page: [(used: Nanos, ino: InodeNumber)]
            do {
                page = try withMetaSlice { (_, store) throws(StoreError) in try store.evictionCandidates(after: cursor, limit: Self.evictionPage) }
            } catch {
                log("ubiquity: cache: \(error)")
                return (files, freed, false)
            }
            guard let last = page.last else { return (files, freed, true) }
            cursor = last
            for candidate in page {
                if enough() { break }
                switch evict(candidate.ino, closedOnly: true, keeping: inUse) {
                case .done(let bytes) where bytes > 0:
                    files += 1
                    freed += bytes
                case .done, .refused: continue // nothing here that may go (a small tail, shared chunks)
                case .failed(let why):
                    // The backing store cannot say the packs are there: nothing more goes now.
                    log("ubiquity: cache: evicting stopped: \(why)")
                    return (files, freed, false)
                }
            }
        }
        return (files, freed, false)
    }
}
