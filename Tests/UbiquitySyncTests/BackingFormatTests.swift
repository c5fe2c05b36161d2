import Glibc
import Testing
import TestSupport
import UbiquityBacking
import UbiquityStore
import UbiquitySystem
@testable import UbiquitySync

/// The backing store's FORMAT (docs/FORMAT.md, "Backing format 5"): an empty store gets
/// format 5, a newer one is refused and left as it is, one older than format 4 is
/// refused (format 4 itself is upgraded by the engine: UpgradeTests).
@Suite struct BackingFormatTests {
    static let device = DeviceID(hex: "0123456789abcdef")!

    @Test func anEmptyStoreGetsFormat5() throws {
        let store = MemoryStore()
        #expect(try Backing(store: store, deviceID: Self.device).open() == nil)
        #expect(store.text("FORMAT") == "ubiquity-backing 5\n")
        // Opened again: format 5, nothing written.
        store.resetCounts()
        #expect(try Backing(store: store, deviceID: Self.device).open() == 5)
        #expect(store.counts.of(.put) == 0)
    }

    @Test func anEmptyDirectoryGetsFormat5ThroughTheEngine() throws {
        let temp = TempDirectory()
        defer { temp.cleanup() }
        mkdir(temp.path + "/backing", 0o755)
        let d = try SimDevice(name: "a", root: temp.path, backing: temp.path + "/backing", clock: nowNanos)
        try d.save("a.txt", "hello")
        try d.engine.cycle(pushPull: true)
        let format = try #require(try readFile(temp.path + "/backing/FORMAT", limit: 100))
        #expect(String(decoding: format, as: UTF8.self) == "ubiquity-backing 5\n")
    }

    @Test(arguments: [6, 12]) func aNewerStoreIsRefused(version: Int) throws {
        let store = MemoryStore()
        try store.put(Backing.formatKey, Array("ubiquity-backing \(version)\n".utf8))
        #expect(throws: StoreError.self) { try Backing(store: store, deviceID: Self.device).open() }
        #expect(store.text("FORMAT") == "ubiquity-backing \(version)\n")
        #expect(store.counts.of(.put) == 1) // ours, above
    }

    @Test func theEngineLeavesANewerStoreAlone() throws {
        let temp = TempDirectory()
        defer { temp.cleanup() }
        let store = MemoryStore()
        try store.put(Backing.formatKey, Array("ubiquity-backing 6\n".utf8))
        let d = try SimDevice(name: "a", root: temp.path, backing: store, clock: nowNanos)
        try d.save("a.txt", "hello")
        #expect(throws: StoreError.self) { try d.engine.cycle(pushPull: true) }
        #expect(store.snapshot.keys.map(\.path) == ["FORMAT"])
        #expect(store.text("FORMAT") == "ubiquity-backing 6\n")
        #expect(d.store.pendingUploadCount > 0) // the record waits
    }

    @Test(arguments: [1, 2, 3]) func aStoreOlderThanFormat4IsRefused(version: Int) throws {
        let store = MemoryStore()
        try store.put(Backing.formatKey, Array("ubiquity-backing \(version)\n".utf8))
        #expect(throws: StoreError.self) { try Backing(store: store, deviceID: Self.device).open() }
        #expect(store.text("FORMAT") == "ubiquity-backing \(version)\n")
    }

    @Test func aFormat4StoreOpens() throws {
        let store = MemoryStore()
        try store.put(Backing.formatKey, Array("ubiquity-backing 4\n".utf8))
        #expect(try Backing(store: store, deviceID: Self.device).open() == 4)
    }

    @Test func aForeignFormatFileIsRefused() throws {
        let store = MemoryStore()
        try store.put(Backing.formatKey, Array("something else\n".utf8))
        #expect(throws: StoreError.self) { try Backing(store: store, deviceID: Self.device).open() }
    }
}
