import UbiquityCrypto

/// An encrypted container's objects, sealed on their way out and opened on
/// their way in: the one place the sync engine's bytes meet the crypto, as JuiceFS wraps
/// its object storage with an encryptor. Sync, gc, repair and the key-value exchange see
/// plaintext and do not change; the store below sees only sealed blocks (`Sealer`: 64 KiB
/// blocks, each authenticated with the object's name and its place), so a ranged read of
/// a chunk in a pack fetches only the blocks that hold it.
///
/// Left in the clear: `FORMAT` (a device must read it before it has a key) and `keys/`
/// (the passphrase-wrapped container key, `KeyRing`). Keys (object names) pass unchanged:
/// no object is named after what it holds (packs are random, segments name a time, a
/// device id and a sequence number).
///
/// Anything that fails to open is `.garbage`, never returned: a changed, cut, moved or
/// foreign object is treated like a damaged one.
public struct EncryptedStore: WrappingStore {
    public let base: any BackingStore
    private let sealer: Sealer

    public init(_ base: any BackingStore, key: ContainerKey) {
        self.base = base
        sealer = Sealer(key)
    }

    public var location: String { base.location }

    /// No sealed object is larger (S3's limit is 5 TiB); ranges are cut there.
    static let largestObject: Int64 = 1 << 50

    /// What stays in the clear.
    public static func isClear(_ key: BackingKey) -> Bool { key.path == "FORMAT" || key.path.hasPrefix("keys/") }

    public func put(_ key: BackingKey, _ bytes: [UInt8], ifAbsent: Bool) throws(BackingError) {
        if Self.isClear(key) { return try base.put(key, bytes, ifAbsent: ifAbsent) }
        let sealed: [UInt8]
        do { sealed = try sealer.seal(bytes, name: key.path) } catch { throw .permanent("\(location)/\(key): \(error)") }
        try base.put(key, sealed, ifAbsent: ifAbsent)
    }

    public func get(_ key: BackingKey, range: Range<Int64>?) throws(BackingError) -> [UInt8] {
        if Self.isClear(key) { return try base.get(key, range: range) }
        guard let range else {
            let sealed = try base.get(key, range: nil)
            do { return try sealer.open(sealed, name: key.path) } catch { throw refused(key, error) }
        }
        guard range.lowerBound >= 0, range.lowerBound <= Self.largestObject else {
            throw .permanent("\(location)/\(key): a range from \(range.lowerBound)")
        }
        // No object is larger: the block arithmetic below stays far from overflowing.
        let cut = range.lowerBound..<min(range.upperBound, Self.largestObject)
        let (wanted, firstBlock) = Sealer.sealedRange(of: cut)
        let sealed = try base.get(key, range: wanted)
        if cut.isEmpty { return [] }
        let opened: (plaintext: [UInt8], reachedEnd: Bool)
        do { opened = try sealer.open(sealed, name: key.path, firstBlock: firstBlock) } catch { throw refused(key, error) }
        // Fewer bytes than asked for, without the object's last block: cut after a block.
        if !opened.reachedEnd && !sealed.isEmpty && Int64(sealed.count) < Int64(wanted.count) {
            throw refused(key, .notAuthentic(key.path))
        }
        let start = cut.lowerBound - firstBlock * Int64(Sealer.blockSize)
        let plain = opened.plaintext
        guard start < Int64(plain.count) else { return [] }
        let end = min(Int64(plain.count), cut.upperBound - firstBlock * Int64(Sealer.blockSize))
        return Array(plain[Int(start)..<Int(end)])
    }

    public func stat(_ key: BackingKey) throws(BackingError) -> ObjectInfo? {
        guard let info = try base.stat(key) else { return nil }
        if Self.isClear(key) { return info }
        guard let size = Sealer.plainSize(info.size) else {
            throw .garbage("\(location)/\(key): \(info.size) bytes is no sealed object's size")
        }
        return ObjectInfo(key: key, size: size)
    }

    /// Sizes as their plaintext. One that no sealed object has (a stray file, a damaged
    /// object) is listed with the plaintext it could hold at most: a listing is never
    /// refused for one object, which fails when it is read.
    public func list(prefix: String, after: BackingKey?, limit: Int) throws(BackingError) -> ObjectListing {
        var listing = try base.list(prefix: prefix, after: after, limit: limit)
        listing.objects = listing.objects.map { info in
            if Self.isClear(info.key) { return info }
            // Divided before anything is added: a listed size is the store's answer.
            let sealedBlock = Int64(Sealer.blockSize + Sealer.overhead)
            let blocks = info.size / sealedBlock + (info.size % sealedBlock == 0 ? 0 : 1)
            return ObjectInfo(key: info.key, size: Sealer.plainSize(info.size) ?? max(0, info.size - blocks * Int64(Sealer.overhead)))
        }
        return listing
    }

    public func delete(_ key: BackingKey) throws(BackingError) { try base.delete(key) }

    /// An object that does not open: damaged, never served.
    private func refused(_ key: BackingKey, _ failure: CryptoFailure) -> BackingError {
        if case .notAuthentic = failure {
            return .garbage("\(location)/\(key) failed authentication (changed, cut, damaged, or not this container's)")
        }
        return .garbage("\(location)/\(key): \(failure)")
    }
}
