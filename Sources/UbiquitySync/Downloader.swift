import Dispatch
import Glibc
import UbiquityStore
import UbiquitySystem

/// How contents reach this device (files on demand): `all` downloads every file's current
/// content in the background once its record is in (files are usable before); `onDemand`
/// fetches only what is read.
public enum DownloadMode: String, Sendable, CaseIterable {
    case all
    case onDemand = "on-demand"
}

/// Background downloading: with `--download all` (`everything`) of every file but those
/// evicted by hand, and of the unresolved conflict versions; on demand, of pinned files
/// only. Walks the files whose content is not all here (`Store.filesNotDownloaded`, an index, so the walk costs what is left to fetch),
/// fetches their chunks a batch of files at a time (neighbours in a pack in one GET), and
/// refreshes their counts. It yields to readers: while a reader waits for a fetch, no new
/// batch starts. A batch that fails (offline) is tried again after a wait that doubles up
/// to 5 minutes; the walk goes on past files that fail.
final class Downloader: @unchecked Sendable {
    private let shared: SharedStore
    private let chunks: ChunkStore
    /// `--download all`: everything; else only pinned files.
    private let everything: Bool
    /// `--cache-size`: with this many bytes of contents here, only pinned files come.
    private let cacheLimit: Int64?
    private let wake = DispatchSemaphore(value: 0)
    private let finished = DispatchSemaphore(value: 0)
    private let state = Locked(State())

    struct State {
        var stopped = false
        var enabled = false
        var started = false
        var failures = 0
        var lastError = ""
        /// The smallest file the last walk passed over for the cache limit (nil: none).
        var smallestSkipped: Int64?
    }

    /// Files per batch, and the most bytes one batch fetches.
    static let batchFiles = 64
    static let batchBytes = 16 << 20

    init(store: SharedStore, everything: Bool, cacheLimit: Int64?) {
        shared = store
        chunks = store.chunks
        self.everything = everything
        self.cacheLimit = cacheLimit
    }

    /// Turns downloading on or off (pause, offline, the mode).
    func setEnabled(_ on: Bool) {
        let changed = state.withLock { s in defer { s.enabled = on }; return s.enabled != on }
        if changed && on { wake.signal() }
    }

    /// Records came in: there may be something to download.
    func poke() { wake.signal() }

    func start() {
        state.withLock { $0.started = true }
        DispatchQueue(label: "ubiquity.download", qos: .utility).async { [self] in
            var wait = 0.0
            while !state.withLock({ $0.stopped }) {
                if !state.withLock({ $0.enabled }) {
                    _ = wake.wait(timeout: .now() + 60)
                    continue
                }
                switch runPass() {
                case .done:
                    wait = 0
                    _ = wake.wait(timeout: .now() + 300)
                case .failed:
                    // The wait holds whatever pulls poke it with: files that cannot be
                    // fetched must not cost a walk and their GETs at every cycle.
                    wait = min(300, max(5, wait * 2))
                    let until = DispatchTime.now() + wait
                    while DispatchTime.now() < until && !state.withLock({ $0.stopped }) { _ = wake.wait(timeout: until) }
                case .stopped: break
                }
            }
            finished.signal()
        }
    }

    /// Stops the loop; waits at most 10 s for a batch in flight (a stalled backing store
    /// must not hold an unmount for the fetch timeout).
    func stop() {
        let started = state.withLock { s in s.stopped = true; return s.started }
        wake.signal()
        if started && finished.wait(timeout: .now() + 10) == .timedOut {
            log("ubiquity: download: a batch still in flight at unmount was left to end by itself")
        }
    }

    enum Outcome { case done, failed, stopped }

    /// One walk over the files not downloaded, then the unresolved conflict versions (also
    /// called by a cycle without a loop, so a store synced by hand in `all` mode ends with
    /// its contents here).
    func runPass() -> Outcome {
        let files = walkFiles()
        guard files != .stopped, everything else { return files }
        var conflicts: [ChunkWant] = []
        do {
            try withOnDemand { (store) throws(StoreError) in
                conflicts = try store.missingConflictChunks()
            }
            if !conflicts.isEmpty { try chunks.download(conflicts) }
        } catch {
            note("ubiquity: download: conflict versions: \(error)")
            return .failed
        }
        return files
    }

    private func walkFiles() -> Outcome {
        var after = InodeNumber.zero
        var failed = false
        // With a cache limit, files that do not fit in the room left are passed over. A
        // walk that passed some over is not made again (but for pinned files) until the
        // smallest of them fits, so a full cache does not cost a walk of every file not
        // here at every pull (new files wait for that too).
        let lastSmallest = state.withLock { $0.smallestSkipped }
        var smallest: Int64?, walkedAll = false, room = Int64.max
        while true {
            if state.withLock({ $0.stopped || !$0.enabled }) { return .stopped }
            // Reads first: a reader waiting for a fetch has the network to itself.
            while !chunks.awaitNoReaders(until: .now() + 1), !state.withLock({ $0.stopped }) {}
            var files: [InodeNumber] = []
            var wants: [ChunkWant] = []
            var seenLast: InodeNumber?
            do {
                try withOnDemand { (store) throws(StoreError) in
                    var bytes: Int64 = 0
                    var seen: Set<ChunkID> = []
                    room = cacheLimit.map { $0 - (store.contentTotals()?.here ?? 0) } ?? Int64.max
                    let takeAll = everything && lastSmallest.map { room >= $0 } != false
                    if takeAll { walkedAll = true }
                    for ino in try store.filesNotDownloaded(after: after, limit: Self.batchFiles, everything: takeAll) {
                        seenLast = ino
                        let missing = try store.missingChunks(of: ino).filter { !seen.contains($0.id) }
                        let size = missing.reduce(Int64(0)) { $0 + Int64($1.size) }
                        if takeAll && bytes + size > room && store.inode(ino)?.keep != .pinned {
                            smallest = min(smallest ?? size, size)
                            continue
                        }
                        files.append(ino)
                        for want in missing where seen.insert(want.id).inserted { wants.append(want) }
                        bytes += size
                        if bytes >= Self.batchBytes { break }
                    }
                }
            } catch {
                note("ubiquity: download: \(error)")
                return .failed
            }
            guard let last = seenLast else {
                if walkedAll { state.withLock { $0.smallestSkipped = smallest } }
                return failed ? .failed : .done
            }
            after = last
            if fetch(wants) == false { failed = true }
            do {
                try changeOnDemand { (store) throws(StoreError) -> TreeChanges in
                    var changes = TreeChanges()
                    for ino in files where try store.refreshAbsent(ino).stateChanged { changes.downloads.insert(ino) }
                    return changes
                }
            } catch {
                note("ubiquity: download: \(error)")
                return .failed
            }
        }
    }

    /// The store as the downloader uses it (files on demand), under the store's lock.
    private func withOnDemand<T>(_ body: (any OnDemand) throws(StoreError) -> T) throws(StoreError) -> T {
        try shared.withLedger { (store) throws(StoreError) -> T in try body(store) }
    }

    /// `SharedStore.change` with the store as the downloader uses it.
    private func changeOnDemand(_ body: (any OnDemand) throws(StoreError) -> TreeChanges) throws(StoreError) {
        try shared.change { (store, _) throws(StoreError) -> TreeChanges in try body(store) }
    }

    /// Fetches in pieces, so a reader waits behind at most one of them; false if any failed.
    private func fetch(_ wants: [ChunkWant]) -> Bool {
        var start = 0
        while start < wants.count {
            var end = start, bytes = 0
            while end < wants.count && (end == start || bytes + wants[end].size <= Self.batchBytes) {
                bytes += wants[end].size
                end += 1
            }
            do { try chunks.download(Array(wants[start..<end])) } catch {
                note("ubiquity: download: \(error)")
                return false
            }
            start = end
        }
        return true
    }

    private func note(_ message: String) {
        let first = state.withLock { s in
            defer { s.lastError = message; s.failures += 1 }
            return s.lastError != message
        }
        if first { log(message) }
    }
}
