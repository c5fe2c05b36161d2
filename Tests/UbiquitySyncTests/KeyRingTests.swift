import Testing
import UbiquityBacking
import UbiquityCrypto
import UbiquitySystem
import UbiquityStore
@testable import UbiquitySync

/// An encrypted container's keys: made once on an empty store, opened by any of its
/// passphrases, never by another; a passphrase added and removed without touching any
/// other object; hostile key files skipped, never trusted.
@Suite struct KeyRingTests {
    static let cheap = ScryptCost(n: 1 << 10, r: 8, p: 1)!
    static let first = Array("first passphrase".utf8), second = Array("second passphrase".utf8)

    @Test func aContainerIsMadeOnceAndOpensWithItsPassphraseOnly() throws {
        let store = MemoryStore()
        let ring = KeyRing(store)
        #expect(try ring.kind() == .empty)
        let made = try ring.create(passphrase: Self.first, cost: Self.cheap)
        #expect(try ring.kind() == .encrypted)
        #expect(try store.get(BackingKey(checked: "FORMAT")) == Array("ubiquity-backing 6\n".utf8))
        let opened = try ring.open(passphrase: Self.first)
        #expect(opened.id == made.id && opened.key.bytesForHandOff == made.key.bytesForHandOff)
        #expect(throws: KeyRingError.wrongPassphrase) { try ring.open(passphrase: Self.second) }
        #expect(throws: KeyRingError.notEmpty(store.location)) { try ring.create(passphrase: Self.second, cost: Self.cheap) }
        #expect(throws: KeyRingError.notEmpty(store.location)) { try ring.createPlain() }

        let plain = KeyRing(MemoryStore())
        try plain.createPlain()
        #expect(try plain.kind() == .plain)
    }

    @Test func passphrasesAreAddedAndRemovedWithoutTouchingTheContainer() throws {
        let store = MemoryStore()
        let ring = KeyRing(store)
        let made = try ring.create(passphrase: Self.first, cost: Self.cheap)
        try store.put(BackingKey(checked: "packs/aa/aa000000000000000000000000000000"), [1, 2, 3])
        store.resetCounts()
        let added = try ring.add(made.key, passphrase: Self.second, cost: Self.cheap)
        #expect(store.counts.of(.put) == 1, "one new key file, nothing else")
        #expect(try ring.open(passphrase: Self.second).key.bytesForHandOff == made.key.bytesForHandOff)
        #expect(try ring.list().entries.map(\.id).sorted() == [made.id, added].sorted())

        #expect(throws: KeyRingError.removingCurrent(added)) { try ring.remove(added, current: added) }
        #expect(throws: KeyRingError.noSuchKey("0000000000000000")) { try ring.remove("0000000000000000", current: added) }
        try ring.remove(made.id, current: added)
        #expect(throws: KeyRingError.wrongPassphrase) { try ring.open(passphrase: Self.first) }
        #expect(throws: KeyRingError.removingLast(added)) { try ring.remove(added, current: made.id) }
        #expect(try ring.open(passphrase: Self.second).id == added)

        // passwd: the new key first, then the old one goes.
        let third = try ring.add(made.key, passphrase: Self.first, cost: Self.cheap)
        try ring.removeAfterReplacing(added, by: third)
        #expect(try ring.list().entries.map(\.id) == [third])
    }

    /// Key files come from the backing store: ones that do not parse are named, never
    /// fatal; a listing of thousands is not tried past `maxKeys` (each try is a scrypt).
    @Test func hostileKeyFilesAreSkipped() throws {
        let store = MemoryStore()
        let ring = KeyRing(store)
        let made = try ring.create(passphrase: Self.first, cost: Self.cheap)
        try store.put(BackingKey(checked: "keys/0000000000000000"), Array("ubiquity-key 1\nscrypt n=2097152 r=8 p=1 salt=00\nkey=00\n".utf8))
        try store.put(BackingKey(checked: "keys/not-a-key-id"), [0xff])
        let listed = try ring.list()
        #expect(listed.entries.map(\.id) == [made.id])
        #expect(listed.malformed.count == 1 && listed.malformed[0].hasPrefix("0000000000000000"))
        #expect(try ring.open(passphrase: Self.first).id == made.id)

        let crowded = MemoryStore()
        try crowded.put(BackingKey(checked: "FORMAT"), Array("ubiquity-backing 6\n".utf8))
        let other = KeyRing(crowded)
        for _ in 0..<(KeyRing.maxKeys + 5) { try other.add(.random(), passphrase: Self.second, cost: Self.cheap) }
        crowded.resetCounts()
        #expect(throws: KeyRingError.wrongPassphrase) { try other.open(passphrase: Self.first) }
        #expect(crowded.counts.of(.get) == KeyRing.maxKeys, "at most \(KeyRing.maxKeys) key files are tried")
    }
}

/// FORMAT and the way a device opened the store must agree: an encrypted container is
/// never read without its key, and a device that opened one encrypted never writes
/// plaintext into it because its FORMAT was replaced.
@Suite struct EncryptedFormatTests {
    @Test func formatAndEncryptionMustAgree() throws {
        let store = MemoryStore()
        _ = try KeyRing(store).create(passphrase: Array("p".utf8), cost: KeyRingTests.cheap)
        let key = try KeyRing(store).open(passphrase: Array("p".utf8)).key
        #expect(try Backing(store: EncryptedStore(store, key: key), deviceID: DeviceID(hex: "0123456789abcdef")!).open() == 6)
        #expect(throws: StoreError.self) { try Backing(store: store, deviceID: DeviceID(hex: "0123456789abcdef")!).open() }
        try store.put(Backing.formatKey, Array("ubiquity-backing 5\n".utf8))
        #expect(throws: StoreError.self) { try Backing(store: EncryptedStore(store, key: key), deviceID: DeviceID(hex: "0123456789abcdef")!).open() }
        #expect(try Backing(store: store, deviceID: DeviceID(hex: "0123456789abcdef")!).open() == 5)

        // An empty store opened encrypted says so in FORMAT.
        let empty = MemoryStore()
        #expect(try Backing(store: EncryptedStore(empty, key: key), deviceID: DeviceID(hex: "0123456789abcdef")!).open() == nil)
        #expect(try empty.get(Backing.formatKey) == Array("ubiquity-backing 6\n".utf8))
    }

    /// Regression: a device that found the store empty and lost the race to write FORMAT
    /// took the winner's for its own: a plain device went on to write plaintext into a
    /// container just made encrypted.
    @Test func aDeviceThatLosesTheRaceForFORMATChecksTheWinners() throws {
        let store = MemoryStore()
        let raced = Locked(false)
        store.setFault { op, key in
            guard op == .put, key == Backing.formatKey, !raced.withLock({ was in defer { was = true }; return was }) else { return nil }
            try? store.put(Backing.formatKey, Array("ubiquity-backing 6\n".utf8)) // the other device, first
            return .exists(key?.path ?? "")
        }
        #expect(throws: StoreError.self) { try Backing(store: store, deviceID: DeviceID(hex: "0123456789abcdef")!).open() }

        // A store that answers "exists" yet has nothing to read: an error, not a loop.
        let liar = MemoryStore()
        liar.setFault { op, key in op == .put && key == Backing.formatKey ? .exists("FORMAT") : nil }
        #expect(throws: StoreError.self) { try Backing(store: liar, deviceID: DeviceID(hex: "0123456789abcdef")!).open() }
    }
}
