import Dispatch
import Glibc
import UbiquitySystem

/// A chunk wanted from elsewhere, with the size its chunk list records.
public struct ChunkWant: Sendable, Hashable {
    public let id: ChunkID
    public let size: Int
    public init(id: ChunkID, size: Int) {
        self.id = id
        self.size = size
    }
}

/// Where chunks that are not here come from (files on demand): the sync engine, by
/// ranged GETs of the packs its records name. Called outside every lock of the
/// filesystem and the store; it may take the filesystem's lock briefly to look up places.
public protocol ChunkSource: AnyObject, Sendable {
    /// Fetches `wants`, verifies each against its id and puts it into `chunks`, calling
    /// `arrived` as each one is there (its readers go on at once, before the rest of the
    /// batch); returns why each chunk that was not put failed.
    func fetch(_ wants: [ChunkWant], into chunks: ChunkStore, arrived: @escaping @Sendable (ChunkID) -> Void) -> [ChunkID: String]
}

/// The chunk store's side of files on demand: fetches of chunks that are not here, one per
/// chunk however many readers want it (they wait for the same flight), bounded in time
/// for a reader (`timeout`: the fetch goes on, its chunk lands for the next read), and
/// refused under the filesystem's lock (`lockHeld`): a request to a server that stalls
/// must never stall every other operation.
final class ChunkFetcher: Sendable {
    final class Flight: @unchecked Sendable {
        let done = DispatchGroup()
        /// Set before `done` is left; read after it was.
        var failure: String?
        /// `done` was left (under the fetcher's state lock: exactly once).
        var ended = false
    }

    /// Weak: the source (the sync engine) holds the filesystem, which holds the store and
    /// this chunk store; a strong reference would keep a closed store open (and locked).
    private final class SourceBox: @unchecked Sendable {
        weak var source: (any ChunkSource)?
        init(_ source: any ChunkSource) { self.source = source }
    }

    private final class CheckBox: Sendable {
        let held: @Sendable () -> Bool
        init(_ held: @escaping @Sendable () -> Bool) { self.held = held }
    }

    struct State {
        var flights: [ChunkID: Flight] = [:]
        /// Readers waiting for a fetch now (background downloading yields to them).
        var waiting = 0
        var fetchedChunks = 0
        var fetchedBytes: Int64 = 0
        var failedFetches = 0
        /// Fetches asked for under the filesystem's lock, refused (a bug if ever non-zero).
        var refusedUnderLock = 0
        var lastFailure: String?
    }

    private let state = Locked(State())
    private let sourceBox = Locked<SourceBox?>(nil)
    private let check = Locked<CheckBox?>(nil)
    private let timeoutNanos = Locked<Int64>(30_000_000_000)
    /// The readers waiting for a fetch, as a group the downloader waits on to be empty
    /// (`ChunkStore.awaitNoReaders`): background downloading yields to them.
    let readers = DispatchGroup()
    /// Source calls at once: readers of many files must not start a thread each.
    private let slots = DispatchSemaphore(value: 16)

    func setSource(_ source: (any ChunkSource)?) { sourceBox.withLock { $0 = source.map(SourceBox.init) } }
    var hasSource: Bool { sourceBox.withLock { $0?.source != nil } }
    func setTimeout(seconds: Double) {
        let nanos = seconds.isFinite && seconds > 0 ? Int64(min(seconds, 86_400) * 1e9) : 30_000_000_000
        timeoutNanos.withLock { $0 = nanos }
    }
    func refuseFetches(when held: (@Sendable () -> Bool)?) { check.withLock { $0 = held.map(CheckBox.init) } }

    var statistics: State { state.withLock { $0 } }

    /// Those of `ids` a flight is fetching now (one hold of the lock): a reader need not
    /// look for them on disk, they are not there yet.
    func inFlight(_ ids: some Sequence<ChunkID>) -> Set<ChunkID> {
        state.withLock { s in
            var flying: Set<ChunkID> = []
            for id in ids where s.flights[id] != nil { flying.insert(id) }
            return flying
        }
    }

    /// Starts fetching the `wants` that no flight covers yet (all of them are not here),
    /// in one call of the source; waits for the first `waiting` of them. Throws
    /// `.notLocal` with the reason when one of those did not arrive (failed, or the
    /// timeout passed). `atLeast`: when nothing is waited for, nothing starts unless the
    /// chunks no flight covers come to that many bytes (read-ahead fetches in pieces worth
    /// a request of their own).
    func fetch(_ wants: [ChunkWant], into chunks: ChunkStore, waiting: Int, atLeast: Int = 0) throws(StoreError) {
        let wait = waiting > 0
        guard let first = wants.first else { return }
        if let held = check.withLock({ $0 }), held.held() {
            state.withLock { $0.refusedUnderLock += 1 }
            log("ubiquity: refused to fetch chunk \(first.id.hex) under the filesystem's lock (a bug: please report it)")
            throw .notLocal(first.id, "a fetch was asked for under the filesystem's lock")
        }
        guard let source = sourceBox.withLock({ $0?.source }) else { throw .missingChunk(first.id) }
        var waitFor: [(ChunkID, Flight)] = []
        var launch: [ChunkWant] = []
        var launched: [Flight] = []
        state.withLock { s in
            if !wait {
                var fresh = 0
                for want in wants where s.flights[want.id] == nil { fresh += want.size }
                if fresh < atLeast { return }
            }
            for want in wants {
                if let flight = s.flights[want.id] {
                    waitFor.append((want.id, flight))
                    continue
                }
                let flight = Flight()
                flight.done.enter()
                s.flights[want.id] = flight
                launch.append(want)
                launched.append(flight)
                waitFor.append((want.id, flight))
            }
        }
        // A chunk a flight brought between the caller's look (it was in flight: not here)
        // and the lock above (the flight had ended) is here now: asking for it again would
        // be a second request for the same bytes.
        if !launch.isEmpty {
            var here: [(ChunkWant, Flight, String?)] = [], missing: [(ChunkWant, Flight)] = []
            for (want, flight) in zip(launch, launched) {
                if chunks.isLocal(want.id) { here.append((want, flight, nil)) } else { missing.append((want, flight)) }
            }
            if !here.isEmpty {
                end(here, fetched: false)
                launch = missing.map(\.0)
                launched = missing.map(\.1)
            }
        }
        if !launch.isEmpty {
            let slots = self.slots
            let flights = Dictionary(uniqueKeysWithValues: zip(launch.map(\.id), zip(launch, launched)))
            let launch = launch
            // A thread of its own: a stalled request must not hold the global queue's few
            // threads (JoinableThread.detach).
            JoinableThread.detach { [self] in
                slots.wait()
                let failures = source.fetch(launch, into: chunks) { [self] id in
                    if let (want, flight) = flights[id] { end([(want, flight, nil)]) }
                }
                slots.signal()
                // All at once: a reader that saw one of them fail and asks again must not
                // join a flight of this call that is still ending (it would fail too).
                end(flights.map { id, f in (f.0, f.1, failures[id] ?? "the backing store's answer did not hold it") })
            }
        }
        guard wait else { return }
        waitFor = Array(waitFor.prefix(waiting))
        readers.enter()
        state.withLock { $0.waiting += 1 }
        defer {
            state.withLock { $0.waiting -= 1 }
            readers.leave()
        }
        let deadline = DispatchTime.now() + .nanoseconds(Int(timeoutNanos.withLock { $0 }))
        // Last first: the chunks of one request usually come in order from one GET, so the
        // reader wakes once when its last chunk is here, not once per chunk.
        for (id, flight) in waitFor.reversed() {
            guard flight.done.wait(timeout: deadline) == .success else {
                // It may have come another way meanwhile (another reader's batch).
                if chunks.isLocal(id) { continue }
                let seconds = Double(timeoutNanos.withLock { $0 }) / 1e9
                let why = "the backing store did not deliver it within \(seconds) s"
                state.withLock { $0.lastFailure = why }
                throw .notLocal(id, why)
            }
            if let why = flight.failure, !chunks.isLocal(id) { throw .notLocal(id, why) }
        }
    }

    /// Ends flights, each once, in one hold of the lock: its chunk is here (`failure`
    /// nil) or did not come. `fetched`: the chunks came from the source (the statistics
    /// count them).
    private func end(_ items: [(ChunkWant, Flight, String?)], fetched: Bool = true) {
        let ended = state.withLock { s -> [Flight] in
            var ended: [Flight] = []
            for (want, flight, failure) in items where !flight.ended {
                flight.ended = true
                s.flights[want.id] = nil
                if let failure {
                    flight.failure = failure
                    s.failedFetches += 1
                    s.lastFailure = failure
                } else if fetched {
                    s.lastFailure = nil
                    s.fetchedChunks += 1
                    s.fetchedBytes += Int64(want.size)
                }
                ended.append(flight)
            }
            return ended
        }
        for flight in ended { flight.done.leave() }
    }
}
