import Crypto
import CryptoExtras
import UbiquitySystem

/// scrypt's cost parameters, recorded in each key file (so a key made on a fast machine
/// opens on a slow one, only more slowly). Bounds are checked before any use: a key file
/// is input from the backing store, and N·r·128 bytes is what scrypt allocates.
public struct ScryptCost: Sendable, Equatable {
    /// CPU/memory cost: a power of two, 2^10 ... 2^20 (2^20 with r = 8 is 1 GiB).
    public let n: Int
    /// Block size, 1 ... 32.
    public let r: Int
    /// Parallelism, 1 ... 16.
    public let p: Int

    public static let maxMemory = 1 << 30

    public init?(n: Int, r: Int, p: Int) {
        guard n >= 1 << 10, n <= 1 << 20, n & (n - 1) == 0, (1...32).contains(r), (1...16).contains(p),
              n * r * 128 <= Self.maxMemory else { return nil }
        self.n = n
        self.r = r
        self.p = p
    }

    /// The 32-byte key `passphrase` and `salt` give at this cost.
    public func deriveKey(passphrase: [UInt8], salt: [UInt8]) throws(CryptoFailure) -> SymmetricKey {
        do {
            return try KDF.Scrypt.deriveKey(from: passphrase, salt: salt, outputByteCount: 32, rounds: n, blockSize: r,
                                            parallelism: p, maxMemory: n * r * 128 * p + (1 << 20))
        } catch {
            throw .failed("derive a key with scrypt")
        }
    }

    /// The cost for this machine: r = 8, p = 1 and the largest N whose derivation takes at
    /// most `seconds` here (one derivation is timed; each doubling of N doubles the time),
    /// at least 2^15 (what scrypt's authors advise for interactive logins), at most 2^20.
    public static func tuned(seconds: Double = 0.5, clock: () -> Double) throws(CryptoFailure) -> ScryptCost {
        var n = 1 << 14
        let salt = [UInt8](repeating: 0, count: 16)
        let start = clock()
        _ = try ScryptCost(n: n, r: 8, p: 1)!.deriveKey(passphrase: [0], salt: salt)
        var took = max(clock() - start, 1e-6)
        while n < 1 << 20 && took * 2 <= seconds {
            n <<= 1
            took *= 2
        }
        return ScryptCost(n: max(n, 1 << 15), r: 8, p: 1)!
    }
}

/// One passphrase's copy of the container key, as stored in the backing store
/// (`keys/<id>`): anyone with any one passphrase opens the container (restic's model).
///
///     ubiquity-key 1
///     scrypt n=<N> r=<r> p=<p> salt=<32 hex digits or more>
///     key=<hex: the container key sealed under the passphrase's key>
///
/// The container key is sealed with AES-256-GCM under scrypt(passphrase, salt) with the
/// first two lines as associated data, so the cost and salt cannot be changed either.
public struct KeyFile: Sendable, Equatable {
    public let cost: ScryptCost
    public let salt: [UInt8]
    /// version (1) ‖ nonce (12) ‖ sealed container key (32) ‖ tag (16).
    let wrapped: [UInt8]
    static let version: UInt8 = 1
    static let wrappedSize = 1 + 12 + 32 + 16

    static let magic = "ubiquity-key 1"
    /// A file this long or longer is refused before it is parsed.
    public static let maxSize = 4096

    /// A new key file for `key` under `passphrase`.
    public static func wrap(_ key: ContainerKey, passphrase: [UInt8], cost: ScryptCost) throws(CryptoFailure) -> KeyFile {
        var salt = [UInt8](repeating: 0, count: 16)
        var rng = SystemRandomNumberGenerator()
        for i in salt.indices { salt[i] = rng.next() }
        return try wrap(key, passphrase: passphrase, cost: cost, salt: salt, nonce: AES.GCM.Nonce())
    }

    /// With a given salt and nonce: the golden tests only.
    static func wrap(_ key: ContainerKey, passphrase: [UInt8], cost: ScryptCost, salt: [UInt8],
                     nonce: AES.GCM.Nonce) throws(CryptoFailure) -> KeyFile {
        let kek = try cost.deriveKey(passphrase: passphrase, salt: salt)
        let header = Self.header(cost, salt)
        do {
            let box = try AES.GCM.seal(key.bytes, using: kek, nonce: nonce, authenticating: Array(header.utf8))
            return KeyFile(cost: cost, salt: salt, wrapped: [Self.version] + Array(box.nonce) + Array(box.ciphertext) + Array(box.tag))
        } catch {
            throw .failed("wrap the container key")
        }
    }

    /// The container key, if `passphrase` is this file's.
    public func unwrap(passphrase: [UInt8]) throws(CryptoFailure) -> ContainerKey {
        let kek = try cost.deriveKey(passphrase: passphrase, salt: salt)
        guard wrapped.count == Self.wrappedSize, wrapped[0] == Self.version else { throw .malformedKeyFile("the wrapped key's length or version") }
        do {
            let box = try AES.GCM.SealedBox(nonce: AES.GCM.Nonce(data: wrapped[1..<13]), ciphertext: wrapped[13..<45], tag: wrapped[45...])
            let bytes = try AES.GCM.open(box, using: kek, authenticating: Array(Self.header(cost, salt).utf8))
            guard let key = ContainerKey(bytes: Array(bytes)) else { throw CryptoFailure.wrongPassphrase }
            return key
        } catch {
            throw .wrongPassphrase
        }
    }

    private static func header(_ cost: ScryptCost, _ salt: [UInt8]) -> String {
        "\(magic)\nscrypt n=\(cost.n) r=\(cost.r) p=\(cost.p) salt=\(Hex.encode(salt))\n"
    }

    /// The file's bytes.
    public var encoded: [UInt8] { Array((Self.header(cost, salt) + "key=\(Hex.encode(wrapped))\n").utf8) }

    /// Parses a key file, checking every number and length before use.
    public init(decoding bytes: [UInt8]) throws(CryptoFailure) {
        guard bytes.count < Self.maxSize else { throw .malformedKeyFile("\(bytes.count) bytes") }
        let lines = String(decoding: bytes, as: UTF8.self).split(separator: "\n", omittingEmptySubsequences: false)
        guard lines.count == 4, lines[0] == Self.magic, lines[3].isEmpty else { throw .malformedKeyFile("not a ubiquity key file of version 1") }
        let fields = lines[1].split(separator: " ")
        guard fields.count == 5, fields[0] == "scrypt" else { throw .malformedKeyFile("the scrypt line") }
        var values: [Substring: Substring] = [:]
        for field in fields.dropFirst() {
            guard let eq = field.firstIndex(of: "="), values.updateValue(field[field.index(after: eq)...], forKey: field[..<eq]) == nil else {
                throw .malformedKeyFile("the scrypt line")
            }
        }
        guard let n = values["n"].flatMap({ Int($0) }), let r = values["r"].flatMap({ Int($0) }), let p = values["p"].flatMap({ Int($0) }),
              let cost = ScryptCost(n: n, r: r, p: p) else { throw .malformedKeyFile("scrypt's cost out of bounds") }
        guard let salt = values["salt"].flatMap(Hex.decode), (16...64).contains(salt.count) else { throw .malformedKeyFile("the salt") }
        guard lines[2].hasPrefix("key="), let wrapped = Hex.decode(lines[2].dropFirst(4)), wrapped.count == Self.wrappedSize else {
            throw .malformedKeyFile("the wrapped key")
        }
        self.init(cost: cost, salt: salt, wrapped: wrapped)
    }

    init(cost: ScryptCost, salt: [UInt8], wrapped: [UInt8]) {
        self.cost = cost
        self.salt = salt
        self.wrapped = wrapped
    }
}
