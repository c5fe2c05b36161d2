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
    /// `download`: only the file's download state changed (`QueryItem.downloaded`).
    public enum Kind: String, Sendable { case added, changed, removed, conflict, download }
    public var kind: Kind
    public var path: String
    /// The file as it is now (nil for `removed`).
    public var item: QueryItem?
}

/// The daemon's change feed: events in order, kept until every subscriber has read them,
/// but never more than `FeedState.capacity` events or `FeedState.byteLimit` bytes (a
/// subscriber that fell further behind is told it lost some). A subscriber waits on its
/// pipe, which gets a byte when events arrive, so a watcher costs nothing while nothing
/// changes; nothing is recorded while nobody subscribes.
public final class ChangeFeed: Sendable {
    struct FeedState {
        static let capacity = 10_000
        static let byteLimit = 64 << 20
        /// Kept events are `events[head...]`; `head` moves on as they go, and the array is
        /// compacted when half of it is gone (no shifting of the whole ring per event).
        var events: [(event: FeedEvent, bytes: Int)] = []
        var head = 0
        var bytes = 0
        /// The sequence number of `events[head]`.
        var first: UInt64 = 1
        var subscribers: [ObjectIdentifier: (fd: Int32, position: UInt64)] = [:]
        var closed = false

        var end: UInt64 { first + UInt64(events.count - head) }

        mutating func dropFirst(_ n: Int) {
            for i in head..<head + n { bytes -= events[i].bytes }
            head += n
            first += UInt64(n)
            if head > events.count / 2 {
                events.removeFirst(head)
                head = 0
            }
        }

        /// Drops what every subscriber has read, then the oldest beyond the limits.
        mutating func trim() {
            let read = subscribers.values.map(\.position).min() ?? end
            if read > first { dropFirst(Int(min(read, end) - first)) }
            while events.count - head > Self.capacity || (bytes > Self.byteLimit && events.count - head > 1) { dropFirst(1) }
        }
    }

    private let state = Locked(FeedState())

    public init() {}

    /// Whether anyone listens: callers skip working out events otherwise.
    public var isWatched: Bool { state.withLock { !$0.subscribers.isEmpty } }

    public func publish(_ events: [FeedEvent]) {
        guard !events.isEmpty else { return }
        state.withLock { s in
            guard !s.subscribers.isEmpty else { return }
            for event in events {
                let size = Self.size(of: event)
                s.events.append((event, size))
                s.bytes += size
            }
            s.trim()
            var one: UInt8 = 1
            for subscriber in s.subscribers.values { _ = write(subscriber.fd, &one, 1) } // non-blocking: a full pipe is woken already
        }
    }

    /// Roughly what an event holds in memory (a key's values can be large).
    private static func size(of event: FeedEvent) -> Int {
        switch event {
        case .keyValue(let c): 256 + c.key.utf8.count + (c.old?.value.count ?? 0) + c.new.value.count
        case .file(let e): 256 + e.path.utf8.count
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
            let end = s.end
            s.subscribers[ObjectIdentifier(subscription)] = (fds[1], end)
            if s.closed { var one: UInt8 = 1; _ = write(fds[1], &one, 1) }
        }
        return subscription
    }

    fileprivate func take(_ subscription: Subscription) -> (events: [FeedEvent], lost: Bool, closed: Bool) {
        state.withLock { s in
            let id = ObjectIdentifier(subscription)
            guard let position = s.subscribers[id]?.position else { return ([], false, s.closed) }
            let lost = position < s.first
            let from = max(position, s.first)
            let events = s.events[(s.head + Int(from - s.first))...].map(\.event)
            let end = s.end
            s.subscribers[id]?.position = end
            s.trim()
            return (events, lost, s.closed)
        }
    }

    fileprivate func unsubscribe(_ subscription: Subscription) {
        state.withLock { s in
            s.subscribers[ObjectIdentifier(subscription)] = nil
            s.trim()
        }
    }

    /// Ends every subscription (unmount): waiting subscribers wake and see `closed`.
    public func close() {
        state.withLock { s in
            s.closed = true
            var one: UInt8 = 1
            for subscriber in s.subscribers.values { _ = write(subscriber.fd, &one, 1) }
        }
    }
}

/// One watcher's place in the feed. `wait` blocks until events arrive, the feed closes,
/// or `other` (the watcher's socket) becomes readable or hangs up.
public final class Subscription: @unchecked Sendable {
    private let feed: ChangeFeed
    let readFD: Int32
    private let writeFD: Int32
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
            if n < 0 { if errno == EINTR { continue } else { return .closed } }
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
    func publishFileEvents(_ store: any FileSystemStore, _ changes: [(FileEvent.Kind, String)]) {
        guard feed.isWatched else { return }
        var events: [FeedEvent] = []
        // Local-only files too: the snapshot lists them (state local-only).
        for (kind, path) in changes {
            let item = kind == .removed ? nil : (try? store.queryItem(at: path)) ?? nil
            if kind != .removed && item == nil { continue } // not a regular file (any more)
            events.append(.file(FileEvent(kind: kind, path: path, item: item)))
        }
        feed.publish(events)
    }

    /// Files a sync step changed (the tree's changes, with paths), remote key-value
    /// changes and new conflicts.
    func publishSyncEvents(_ store: any FileSystemStore, _ changes: TreeChanges) {
        var files: [(FileEvent.Kind, String)] = []
        for entry in changes.entries {
            guard let dir = store.path(of: entry.parent) else { continue }
            let path = dir.isEmpty ? entry.name : dir + "/" + entry.name
            if let id = store.child(entry.parent, entry.name) {
                if store.inode(id)?.kind == .file { files.append((.added, path)) }
            } else {
                files.append((.removed, path))
            }
        }
        for ino in changes.inodes where store.inode(ino)?.kind == .file {
            if let path = store.path(of: ino) { files.append((.changed, path)) }
        }
        for ino in changes.downloads where !changes.inodes.contains(ino) {
            if let path = store.path(of: ino) { files.append((.download, path)) }
        }
        for path in changes.conflicts { files.append((.conflict, path)) }
        feed.publish(changes.keyValues.map { .keyValue($0) })
        publishFileEvents(store, files)
    }
}

extension FileSystem.Meta {
    /// The path of the entry `name` in directory `parent` (a hard link's other names
    /// have their own paths).
    func childPath(_ parent: InodeNumber, _ name: String, store: any FileSystemStore) -> String? {
        guard let dir = store.path(of: parent) else { return nil }
        return dir.isEmpty ? name : dir + "/" + name
    }

    /// The paths of the regular files at `parent`/`name`: itself, or those below it when
    /// it is a directory (at most 10,000: a watcher of a bigger move sees its first ones).
    func filePaths(_ parent: InodeNumber, _ name: String, store: any FileSystemStore) -> Set<String> {
        guard !VirtualViews.isVirtual(parent), let id = store.child(parent, name), let inode = store.inode(id),
              let path = childPath(parent, name, store: store) else { return [] }
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
