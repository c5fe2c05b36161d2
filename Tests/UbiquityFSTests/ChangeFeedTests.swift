import Glibc
import Testing
import TestSupport
import UbiquitySystem
@testable import UbiquityFS
@testable import UbiquityStore

/// The change feed behind `ubiquity query --watch` and `kv watch`: events in order from a
/// subscriber's own start, nothing recorded while nobody listens, a waiting subscriber
/// not woken while nothing changes, an overflow said, and the consistent listing a query
/// starts from.
@Suite struct ChangeFeedTests {
    static func paths(_ events: [FeedEvent]) -> [String] {
        events.compactMap { if case .file(let e) = $0 { return "\(e.kind.rawValue) \(e.path)" } else { return nil } }
    }

    @Test func filesChangedHereReachASubscriberInOrder() throws {
        let h = try Harness()
        try h.save("before.txt", "not seen")
        let sub = try h.fs.feed.subscribe()
        defer { sub.cancel() }
        let dir = try h.fs.mkdir(parent: Store.rootInode, name: "d", mode: 0o755, caller: h.me).ino
        try h.save("a.txt", "one", in: dir)
        try h.save("a.txt", "two", in: dir)
        try h.fs.rename(parent: dir, name: "a.txt", newParent: Store.rootInode, newName: "b.txt", flags: 0)
        try h.fs.rename(parent: Store.rootInode, name: "before.txt", newParent: dir, newName: "c.txt", flags: 0)
        try h.fs.rename(parent: Store.rootInode, name: "d", newParent: Store.rootInode, newName: "e", flags: 0)
        try h.fs.unlink(parent: Store.rootInode, name: "b.txt")
        let (events, lost, closed) = sub.take()
        #expect(!lost && !closed)
        #expect(Self.paths(events) == [
            "added d/a.txt", "changed d/a.txt", "changed d/a.txt",
            "removed d/a.txt", "added b.txt",
            "removed before.txt", "added d/c.txt",
            "removed d/c.txt", "added e/c.txt",
            "removed b.txt",
        ])
        if case .file(let e)? = events.dropFirst(2).first {
            #expect(e.item?.size == 3 && e.item?.state == .pending)
        }
        #expect(sub.take().events.isEmpty)
    }

    @Test func nothingIsRecordedWithoutSubscribersAndAWaiterSleeps() throws {
        let feed = ChangeFeed()
        #expect(!feed.isWatched)
        feed.publish([.file(FileEvent(kind: .added, path: "x", item: nil))])
        let sub = try feed.subscribe()
        #expect(feed.isWatched)
        #expect(sub.take().events.isEmpty) // what came before the subscription is not replayed
        // A waiter wakes for an event, and only then: poll with nothing pending times out.
        var fds = [pollfd(fd: sub.readFD, events: Int16(POLLIN), revents: 0)]
        #expect(poll(&fds, 1, 200) == 0, "woken with nothing published")
        feed.publish([.file(FileEvent(kind: .removed, path: "y", item: nil))])
        #expect(poll(&fds, 1, 1000) == 1)
        var pair: [Int32] = [-1, -1]
        #expect(pipe(&pair) == 0)
        defer { close(pair[0]); close(pair[1]) }
        #expect(sub.wait(other: pair[0]) == .events)
        #expect(Self.paths(sub.take().events) == ["removed y"])
        // An overflow is said, then the newest events follow.
        for i in 0..<(ChangeFeed.FeedState.capacity + 5) { feed.publish([.file(FileEvent(kind: .added, path: "f\(i)", item: nil))]) }
        let (events, lost, _) = sub.take()
        #expect(lost && events.count == ChangeFeed.FeedState.capacity)
        feed.close()
        #expect(sub.take().closed)
        sub.cancel()
        #expect(!feed.isWatched)
    }

    /// The listing a query streams: one snapshot (a change after it began is not in it),
    /// the scopes and the name pattern, hidden files only when asked, and the work: each
    /// directory read once, none the scope rules out.
    @Test func queryListingIsOneSnapshot() throws {
        let h = try Harness()
        let docs = try h.fs.mkdir(parent: Store.rootInode, name: "Documents", mode: 0o755, caller: h.me).ino
        let sub = try h.fs.mkdir(parent: docs, name: "sub", mode: 0o755, caller: h.me).ino
        let other = try h.fs.mkdir(parent: Store.rootInode, name: "other", mode: 0o755, caller: h.me).ino
        try h.save("a.txt", "1", in: docs)
        try h.save("b.tinypix", "12345678", in: sub)
        try h.save(".hidden", "h", in: docs)
        try h.save("c.txt", "3", in: other)
        try h.save("top.txt", "4")
        let snapshot = try h.fs.withStoreSnapshot { () throws(StoreError) -> Store in
            let s = try Store(directory: h.dir, readOnly: true)
            try s.beginSnapshot()
            return s
        }
        try h.save("late.txt", "after the snapshot")
        h.fs.commitMetadata() // the group commit: now other connections can see it
        func list(_ filter: QueryFilter) throws -> ([String], Int) {
            var paths: [String] = []
            let dirs = try snapshot.forEachQueryItem(filter) { item in paths.append(item.path) }
            return (paths, dirs)
        }
        #expect(try list(QueryFilter()) == (["top.txt", "Documents/a.txt", "Documents/sub/b.tinypix", "other/c.txt"], 4))
        #expect(try list(QueryFilter(scope: .documents)) == (["Documents/a.txt", "Documents/sub/b.tinypix"], 3))
        #expect(try list(QueryFilter(scope: .data)) == (["top.txt", "other/c.txt"], 2))
        #expect(try list(QueryFilter(name: "*.txt")).0 == ["top.txt", "Documents/a.txt", "other/c.txt"])
        #expect(try list(QueryFilter(scope: .documents, includeHidden: true)).0 == ["Documents/.hidden", "Documents/a.txt", "Documents/sub/b.tinypix"])
        try snapshot.endSnapshot() // the next read sees the database as it is now
        var after: [String] = []
        try snapshot.forEachQueryItem(QueryFilter(name: "late*")) { after.append($0.path) }
        #expect(after == ["late.txt"])
    }
}
