import Glibc
import UbiquityStore
import UbiquitySystem

/// What watchers are told (`ubiquity kv watch`, `ubiquity query --watch`).
public enum FeedEvent: Sendable {
    /// Another device changed a key (a change made here is not announced, as iCloud's
    /// key-value store does not).
    case keyValue(KVChange)
    /// A file shown at `path` appeared, changed, went, or gained a conflict version, here
    /// or through sync.
    case file(FileEvent)
}

public struct FileEvent: Sendable, Equatable {
    public enum Kind: String, Sendable { case added, changed, removed, conflict }
    public var kind: Kind
    public var path: String
    /// The file as it is now (nil for `removed`).
    public var item: QueryItem?
}

/// The daemon's change feed: events in order, kept in a ring of the latest
/// `FeedState.capacity`, for subscribers that each read from their own position. A
/// subscriber waits on its pipe, which gets a byte when events arrive, so a watcher costs
/// nothing while nothing changes; nothing is recorded while nobody subscribes.
public final class ChangeFeed: Sendable {
    struct FeedState {
        static let capacity = 10_000
        var events: [FeedEvent] = []
        /// The sequence number of `events[0]`.
        var first: UInt64 = 1
        var subscribers: [ObjectIdentifier: Int32] = [:]
        var closed = false
    }

    private let state = Locked(FeedState())

    public init() {}

    /// Whether anyone listens: callers skip working out events otherwise.
    public var isWatched: Bool { state.withLock { !$0.subscribers.isEmpty } }

    public func publish(_ events: [FeedEvent]) {
        guard !events.isEmpty else { return }
        state.withLock { s in
            guard !s.subscribers.isEmpty else { return }
            s.events += events
            if s.events.count > FeedState.capacity {
                let drop = s.events.count - FeedState.capacity
                s.events.removeFirst(drop)
                s.first += UInt64(drop)
            }
            var one: UInt8 = 1
            for fd in s.subscribers.values { _ = write(fd, &one, 1) } // non-blocking: a full pipe is woken already
        }
    }

    /// A new subscriber, from the next event published on.
    public func subscribe() throws(SystemError) -> Subscription {
        var fds: [Int32] = [-1, -1]
        guard pipe(&fds) == 0 else { throw .last("pipe") }
        for fd in fds {
            _ = fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK)
            _ = fcntl(fd, F_SETFD, FD_CLOEXEC)
        }
        let subscription = Subscription(feed: self, readFD: fds[0], writeFD: fds[1])
        state.withLock { s in
            subscription.position = s.first + UInt64(s.events.count)
            s.subscribers[ObjectIdentifier(subscription)] = fds[1]
            if s.closed { var one: UInt8 = 1; _ = write(fds[1], &one, 1) }
        }
        return subscription
    }

    fileprivate func take(_ subscription: Subscription) -> (events: [FeedEvent], lost: Bool, closed: Bool) {
        state.withLock { s in
            let end = s.first + UInt64(s.events.count)
            let lost = subscription.position < s.first
            let from = max(subscription.position, s.first)
            subscription.position = end
            let events = Array(s.events[Int(from - s.first)..<s.events.count])
            // Events every subscriber has read go.
            return (events, lost, s.closed)
        }
    }

    fileprivate func unsubscribe(_ subscription: Subscription) {
        state.withLock { s in
            s.subscribers[ObjectIdentifier(subscription)] = nil
            if s.subscribers.isEmpty {
                s.first += UInt64(s.events.count)
                s.events = []
            }
        }
    }

    /// Ends every subscription (unmount): waiting subscribers wake and see `closed`.
    public func close() {
        state.withLock { s in
            s.closed = true
            var one: UInt8 = 1
            for fd in s.subscribers.values { _ = write(fd, &one, 1) }
        }
    }
}

/// One watcher's place in the feed. `wait` blocks until events arrive, the feed closes,
/// or `other` (the watcher's socket) becomes readable or hangs up.
public final class Subscription: @unchecked Sendable {
    private let feed: ChangeFeed
    let readFD: Int32
    private let writeFD: Int32
    /// Guarded by the feed's lock.
    fileprivate var position: UInt64 = 0

    fileprivate init(feed: ChangeFeed, readFD: Int32, writeFD: Int32) {
        self.feed = feed
        self.readFD = readFD
        self.writeFD = writeFD
    }

    deinit {
        close(readFD)
        close(writeFD)
    }

    public enum Wake { case events, other, closed }

    public func wait(other: Int32) -> Wake {
        var fds = [pollfd(fd: readFD, events: Int16(POLLIN), revents: 0), pollfd(fd: other, events: Int16(POLLIN), revents: 0)]
        while true {
            let n = poll(&fds, 2, -1)
            if n < 0 && errno == EINTR { continue }
            if fds[1].revents != 0 { return .other }
            var drain = [UInt8](repeating: 0, count: 64)
            while read(readFD, &drain, drain.count) > 0 {}
            return .events
        }
    }

    /// The events since the last call; `lost` when the ring overflowed meanwhile.
    public func take() -> (events: [FeedEvent], lost: Bool, closed: Bool) { feed.take(self) }

    public func cancel() { feed.unsubscribe(self) }
}

extension FileSystem {
    /// Tells watchers about files at these paths (nothing is worked out when nobody
    /// watches). Called under the metadata lock, from the operation that made the change.
    func publishFileEvents(_ m: Meta, _ changes: [(FileEvent.Kind, String)]) {
        guard feed.isWatched else { return }
        var events: [FeedEvent] = []
        for (kind, path) in changes where !LocalOnly.contains(path) || kind == .removed {
            let item = kind == .removed ? nil : (try? m.store.queryItem(at: path)) ?? nil
            if kind != .removed && item == nil { continue } // not a regular file (any more)
            events.append(.file(FileEvent(kind: kind, path: path, item: item)))
        }
        feed.publish(events)
    }

    /// Files a sync step changed (the tree's changes, with paths), remote key-value
    /// changes and new conflicts.
    func publishSyncEvents(_ m: Meta, _ changes: TreeChanges) {
        var files: [(FileEvent.Kind, String)] = []
        for entry in changes.entries {
            guard let dir = m.store.path(of: entry.parent) else { continue }
            let path = dir.isEmpty ? entry.name : dir + "/" + entry.name
            if let id = m.store.child(entry.parent, entry.name) {
                if m.store.inode(id)?.kind == .file { files.append((.added, path)) }
            } else {
                files.append((.removed, path))
            }
        }
        for ino in changes.inodes where m.store.inode(ino)?.kind == .file {
            if let path = m.store.path(of: ino) { files.append((.changed, path)) }
        }
        for path in changes.conflicts { files.append((.conflict, path)) }
        feed.publish(changes.keyValues.map { .keyValue($0) })
        publishFileEvents(m, files)
    }
}

extension FileSystem.Meta {
    /// The paths of the regular files at `parent`/`name`: itself, or those below it when
    /// it is a directory (at most 10,000: a watcher of a bigger move sees its first ones).
    func filePaths(_ parent: UInt64, _ name: String) -> Set<String> {
        guard !VirtualViews.isVirtual(parent), let id = store.child(parent, name), let inode = store.inode(id),
              let path = store.path(of: id) else { return [] }
        if inode.kind == .file { return [path] }
        guard inode.kind == .directory else { return [] }
        var result: Set<String> = []
        var pending = [(id, path)]
        while let (dir, prefix) = pending.popLast(), result.count < 10_000 {
            for entry in store.entriesWithInodes(dir) {
                let child = prefix + "/" + entry.name
                switch entry.inode.kind {
                case .file: result.insert(child)
                case .directory: pending.append((entry.inode.id, child))
                default: break
                }
            }
        }
        return result
    }
}
