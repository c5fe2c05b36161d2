import Crypto
import UbiquitySystem

/// Seals and opens the objects of an encrypted container: AES-256-GCM under the
/// container's content key, in blocks of 64 KiB so that a ranged read (a chunk in the
/// middle of an 8 MiB pack) fetches and opens only the blocks it covers.
///
/// A sealed object is one or more blocks, each
///
///     kind (1 byte) ‖ nonce (12, random) ‖ ciphertext (≤ 65,536) ‖ tag (16)
///
/// where kind is 1 for the object's last block and 0 for every other one; every block
/// but the last holds exactly 65,536 bytes of plaintext (an empty object is one last
/// block of none). A block's associated data is `ubiquity 1 object <name>`, a zero byte,
/// its index (8 bytes, big-endian) and its kind, so that a block moved to another place
/// in its object or to another object (a segment replayed in place of a newer one, one
/// swapped between devices: their names hold the device id and the sequence number), an
/// object cut after any block, or a single changed byte fails to open.
///
/// Random nonces keep a key safe for 2^32 messages (NIST SP 800-38D): 256 TiB of blocks
/// sealed under one container key.
public struct Sealer: Sendable {
    public static let blockSize = 65_536
    /// Bytes each block adds.
    public static let overhead = 1 + 12 + 16
    static let sealedBlock = blockSize + overhead
    static let moreFollows: UInt8 = 0, lastBlock: UInt8 = 1
    private let key: SymmetricKey

    public init(_ containerKey: ContainerKey) { key = containerKey.derived(for: .content) }

    /// The sealed size of `plainSize` bytes.
    public static func sealedSize(_ plainSize: Int64) -> Int64 {
        let blocks = max(1, (plainSize + Int64(blockSize) - 1) / Int64(blockSize))
        return plainSize + blocks * Int64(overhead)
    }

    /// The plaintext size of a sealed object of `sealedSize` bytes; nil when no object is
    /// that long (a last block shorter than its overhead, or an empty one after others).
    public static func plainSize(_ sealedSize: Int64) -> Int64? {
        guard sealedSize >= Int64(overhead) else { return nil }
        let full = sealedSize / Int64(sealedBlock), rest = sealedSize % Int64(sealedBlock)
        if rest == 0 { return full * Int64(blockSize) }
        guard rest >= Int64(overhead), rest > Int64(overhead) || full == 0 else { return nil }
        return full * Int64(blockSize) + rest - Int64(overhead)
    }

    /// Where plaintext `range` lies in the sealed object: the sealed bytes of the blocks
    /// that hold it, and the index of the first of them. `range` within 0...2^50.
    public static func sealedRange(of range: Range<Int64>) -> (bytes: Range<Int64>, firstBlock: Int64) {
        let first = range.lowerBound / Int64(blockSize)
        let end = range.isEmpty ? first : (range.upperBound + Int64(blockSize) - 1) / Int64(blockSize)
        return (first * Int64(sealedBlock)..<end * Int64(sealedBlock), first)
    }

    /// `plaintext` sealed for the object named `name`.
    public func seal(_ plaintext: [UInt8], name: String) throws(CryptoFailure) -> [UInt8] {
        try seal(plaintext, name: name) { _ in AES.GCM.Nonce() }
    }

    /// With given nonces: the golden tests only (a nonce must never repeat under a key).
    func seal(_ plaintext: [UInt8], name: String, nonce: (Int) throws -> AES.GCM.Nonce) throws(CryptoFailure) -> [UInt8] {
        var out: [UInt8] = []
        out.reserveCapacity(Int(Self.sealedSize(Int64(plaintext.count))))
        let label = Self.label(name)
        var start = 0, index = 0
        repeat {
            let end = min(plaintext.count, start + Self.blockSize)
            let kind = end == plaintext.count ? Self.lastBlock : Self.moreFollows
            do {
                let box = try AES.GCM.seal(plaintext[start..<end], using: key, nonce: try nonce(index),
                                           authenticating: Self.associatedData(label, index: index, kind: kind))
                out.append(kind)
                out.append(contentsOf: box.nonce)
                out.append(contentsOf: box.ciphertext)
                out.append(contentsOf: box.tag)
            } catch {
                throw .failed("seal \(name)")
            }
            start = end
            index += 1
        } while start < plaintext.count
        return out
    }

    /// The plaintext of a whole sealed object: its blocks in order, ending with its last.
    public func open(_ sealed: [UInt8], name: String) throws(CryptoFailure) -> [UInt8] {
        let (plain, reachedEnd) = try open(sealed, name: name, firstBlock: 0)
        guard reachedEnd else { throw .notAuthentic(name) } // cut after a block
        return plain
    }

    /// The plaintext of consecutive blocks of an object, the first of them block
    /// `firstBlock`, and whether they end with the object's last block. Every block but
    /// the last one given must be a full one that is not the object's last. Empty
    /// `sealed` opens to nothing (a range past the end of the object).
    public func open(_ sealed: [UInt8], name: String, firstBlock: Int64) throws(CryptoFailure) -> (plaintext: [UInt8], reachedEnd: Bool) {
        guard firstBlock >= 0, firstBlock <= Int64(UInt32.max) else { throw .notAuthentic(name) }
        if sealed.isEmpty {
            guard firstBlock > 0 else { throw .notAuthentic(name) } // every object has a block
            return ([], false)
        }
        let label = Self.label(name)
        var out: [UInt8] = []
        out.reserveCapacity(sealed.count)
        var start = 0, index = Int(firstBlock)
        while start < sealed.count {
            let end = min(sealed.count, start + Self.sealedBlock)
            guard end - start >= Self.overhead else { throw .notAuthentic(name) }
            let kind = sealed[start]
            guard kind == Self.moreFollows || kind == Self.lastBlock else { throw .unknownVersion(name, Int(kind)) }
            // Only the last block may be short, and nothing follows it.
            if kind == Self.moreFollows && end - start < Self.sealedBlock { throw .notAuthentic(name) }
            if kind == Self.lastBlock && end < sealed.count { throw .notAuthentic(name) }
            do {
                let box = try AES.GCM.SealedBox(nonce: AES.GCM.Nonce(data: sealed[(start + 1)..<(start + 13)]),
                                                ciphertext: sealed[(start + 13)..<(end - 16)], tag: sealed[(end - 16)..<end])
                out.append(contentsOf: try AES.GCM.open(box, using: key,
                                                        authenticating: Self.associatedData(label, index: index, kind: kind)))
            } catch {
                throw .notAuthentic(name)
            }
            if kind == Self.lastBlock { return (out, true) }
            start = end
            index += 1
        }
        return (out, false)
    }

    private static func label(_ name: String) -> [UInt8] { Array("ubiquity 1 object \(name)".utf8) + [0] }

    /// What binds a block to its place: the object's name, its index and its kind.
    private static func associatedData(_ label: [UInt8], index: Int, kind: UInt8) -> [UInt8] {
        var data = label
        withUnsafeBytes(of: UInt64(index).bigEndian) { data.append(contentsOf: $0) }
        data.append(kind)
        return data
    }
}

/// Why sealing, opening or unwrapping failed; it never holds a key or a passphrase.
public enum CryptoFailure: Error, Equatable, CustomStringConvertible {
    /// Changed, truncated, under another key, or moved from another name: never served.
    case notAuthentic(String)
    /// Sealed by a newer version of this format.
    case unknownVersion(String, Int)
    /// None of the container's passphrase keys opens with this passphrase.
    case wrongPassphrase
    /// A key file that does not parse or holds numbers out of bounds.
    case malformedKeyFile(String)
    case failed(String)

    public var description: String {
        switch self {
        case .notAuthentic(let name): "\(name) failed authentication (changed, damaged, or not this container's)"
        case .unknownVersion(let name, let v): "\(name) is sealed with version \(v), which this ubiquity does not know (upgrade it)"
        case .wrongPassphrase: "wrong passphrase: no key of this container opens with it"
        case .malformedKeyFile(let why): "malformed key file: \(why)"
        case .failed(let what): "could not \(what)"
        }
    }
}
