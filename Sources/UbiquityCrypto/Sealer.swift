import Crypto
import UbiquitySystem

/// Seals and opens the objects of an encrypted container: AES-256-GCM under the
/// container's content key, a fresh random 96-bit nonce per message, and the object's
/// name as associated data, so an object moved to another name (a segment replayed in
/// place of a newer one, one swapped between devices: their names hold the device id and
/// the sequence number) fails to open, as does any changed byte.
///
/// A sealed message: version (1 byte, 1) ‖ nonce (12) ‖ ciphertext ‖ tag (16), 29 bytes
/// more than the plaintext. Random nonces keep a key safe for 2^32 messages (NIST
/// SP 800-38D); at 64 KiB a chunk that is 256 TiB sealed under one container key.
public struct Sealer: Sendable {
    public static let version: UInt8 = 1
    public static let overhead = 1 + 12 + 16
    private let key: SymmetricKey

    public init(_ containerKey: ContainerKey) { key = containerKey.derived(for: .content) }

    /// `plaintext` sealed for the object named `name`.
    public func seal(_ plaintext: [UInt8], name: String) throws(CryptoFailure) -> [UInt8] {
        try seal(plaintext, name: name, nonce: AES.GCM.Nonce())
    }

    /// With a given nonce: the golden tests only (a nonce must never repeat under a key).
    func seal(_ plaintext: [UInt8], name: String, nonce: AES.GCM.Nonce) throws(CryptoFailure) -> [UInt8] {
        do {
            let box = try AES.GCM.seal(plaintext, using: key, nonce: nonce, authenticating: Self.associatedData(name))
            return [Self.version] + Array(box.nonce) + Array(box.ciphertext) + Array(box.tag)
        } catch {
            throw .failed("seal \(name)")
        }
    }

    /// The plaintext of `sealed`, the object named `name`; `.notAuthentic` when it was not
    /// sealed under this container's key for this name, or any byte of it changed.
    public func open(_ sealed: [UInt8], name: String) throws(CryptoFailure) -> [UInt8] {
        guard sealed.count >= Self.overhead else { throw .notAuthentic(name) }
        guard sealed[0] == Self.version else { throw .unknownVersion(name, Int(sealed[0])) }
        do {
            let box = try AES.GCM.SealedBox(nonce: AES.GCM.Nonce(data: sealed[1..<13]),
                                            ciphertext: sealed[13..<(sealed.count - 16)],
                                            tag: sealed[(sealed.count - 16)...])
            return Array(try AES.GCM.open(box, using: key, authenticating: Self.associatedData(name)))
        } catch {
            throw .notAuthentic(name)
        }
    }

    /// What binds a message to its object: a label and the name.
    private static func associatedData(_ name: String) -> [UInt8] { Array("ubiquity 1 object \(name)".utf8) }
}

/// Object names that must not say what they hold: a chunk's backing name is a keyed MAC
/// of its id, not its hash, so the backing store cannot tell whether a user holds a known
/// file.
public struct NameKey: Sendable {
    private let key: SymmetricKey

    public init(_ containerKey: ContainerKey) { key = containerKey.derived(for: .names) }

    /// 64 lowercase hex digits: HMAC-SHA256 of `id` under the container's name key.
    public func name(for id: [UInt8]) -> String {
        Hex.encode(HMAC<SHA256>.authenticationCode(for: id, using: key))
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
