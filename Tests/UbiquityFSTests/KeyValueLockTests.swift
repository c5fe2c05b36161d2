import Glibc
import Testing
import TestSupport
import UbiquitySystem
@testable import UbiquityFS
@testable import UbiquityStore

/// The key-value store has its own database and lock (`KeyValueTable`): `.kv/` requests
/// (listings too) take the filesystem's lock and that one, never the store's, so a fold,
/// a sync slice or a barrier holding the store never holds up a key, and a key never
/// holds them up.
@Suite struct KeyValueLockTests {
    /// Everything `.kv/` does: create, set the type, write, fsync, close, list, look up,
    /// stat, read the attributes, truncate, delete.
    static func useKeys(_ h: Harness, round: Int) throws {
        let fs = h.fs!
        let name = "key\(round)"
        let (a, handle) = try fs.create(parent: KeyValueDoor.root, name: name, mode: 0o644, flags: OpenFlags(O_WRONLY | O_TRUNC), caller: h.me)
        try fs.setxattr(a.ino, name: KeyValueDoor.typeAttribute, value: Array("integer".utf8), flags: 0)
        _ = try Array("\(round)".utf8).withUnsafeBytes { try fs.write(handle, offset: 0, data: $0) }
        try fs.fsync(handle)
        try fs.flush(handle)
        try fs.release(handle)
        let listing = try fs.opendir(KeyValueDoor.root)
        #expect(try fs.readdir(listing).map(\.name).contains(name))
        #expect(try fs.readdir(listing, fromStart: true).map(\.name).contains(name))
        fs.releasedir(listing)
        let looked = try fs.lookup(parent: KeyValueDoor.root, name: name)
        #expect(looked.size == Int64("\(round)\n".utf8.count))
        #expect(try fs.getattr(looked.ino).size == looked.size)
        #expect(try fs.getxattr(looked.ino, name: KeyValueDoor.typeAttribute) == Array("integer".utf8))
        var change = FileSystem.AttributeChanges()
        change.size = 0
        #expect(throws: Errno.self) { try fs.setattr(looked.ino, change) } // an integer of no digits: refused, the value stays
        #expect(try fs.getattr(looked.ino).size == looked.size)
        try fs.unlink(parent: KeyValueDoor.root, name: name)
        #expect(throws: Errno.self) { try fs.lookup(parent: KeyValueDoor.root, name: name) }
        fs.forget(looked.ino, count: 1)
    }

    @Test func keyRequestsTakeNotTheStoresLock() throws {
        let h = try Harness()
        try Self.useKeys(h, round: 0) // the root is in the working set from here
        let before = h.fs.store.acquisitions
        for round in 1...20 { try Self.useKeys(h, round: round) }
        #expect(h.fs.store.acquisitions == before, "acquisitions of the store's lock by 20 rounds of key requests")
    }

    /// The store's lock held by another thread until the key requests are done, or for a
    /// minute: requests that needed it would wait the minute out.
    @Test func keyRequestsGoOnWhileAnotherThreadHoldsTheStoresLock() throws {
        let h = try Harness()
        try Self.useKeys(h, round: 0)
        let finishedUnderTheLock = try ReaderLockTests.whileAnotherThreadHoldsTheStoresLock(h.fs) { () throws in
            try Self.useKeys(h, round: 1)
        }
        #expect(finishedUnderTheLock, "the key requests finished while the store's lock was held")
    }
}
