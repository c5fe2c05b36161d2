import Crypto

/// The key of an encrypted container: 32 random bytes, made once when the
/// container is created and stored in the backing store only wrapped by passphrase keys
/// (`KeyFile`). It never seals anything itself: each use has its own key derived from it
/// (HKDF-SHA256, a label per use), so a key for one use says nothing of another's.
///
/// Not a secret's container for long: callers keep it in memory only (never in argv,
/// logs, status or the local store), and it has no description that shows its bytes.
public struct ContainerKey: Sendable {
    /// Exactly 32 bytes.
    let bytes: [UInt8]

    /// A new random key (the system's generator).
    public static func random() -> ContainerKey {
        ContainerKey(unchecked: SymmetricKey(size: .bits256).withUnsafeBytes { Array($0) })
    }

    /// A key of exactly 32 bytes (nil otherwise).
    public init?(bytes: [UInt8]) {
        guard bytes.count == 32 else { return nil }
        self.bytes = bytes
    }

    private init(unchecked bytes: [UInt8]) { self.bytes = bytes }

    /// What each derived key is for: the label is part of the derivation, so two uses
    /// never share a key. Never change a label of a format that is out: its objects
    /// could no longer be opened.
    public enum Use: String, Sendable, CaseIterable {
        /// Sealing objects and chunks (AES-256-GCM, `Sealer`).
        case content = "ubiquity 1 content"
        /// The seed of the chunker's cut table, so chunk boundaries depend on the key.
        case chunker = "ubiquity 1 chunker"
    }

    /// The chunker's cut table: 256 words, HKDF-SHA256 of the key with the chunker's
    /// label, 2,048 bytes read as little-endian 64-bit words.
    public func chunkerTable() -> [UInt64] {
        let bytes = HKDF<SHA256>.deriveKey(inputKeyMaterial: SymmetricKey(data: bytes), info: Array(Use.chunker.rawValue.utf8),
                                           outputByteCount: 2048).withUnsafeBytes { Array($0) }
        return (0..<256).map { i in (0..<8).reduce(UInt64(0)) { $0 | UInt64(bytes[i * 8 + $1]) << (8 * $1) } }
    }

    /// The key's bytes, to hand it to the mount daemon this program starts (through a
    /// pipe, never argv); nothing else reads them.
    public var bytesForHandOff: [UInt8] { bytes }

    /// The 32-byte key for `use`.
    public func derived(for use: Use) -> SymmetricKey {
        HKDF<SHA256>.deriveKey(inputKeyMaterial: SymmetricKey(data: bytes), info: Array(use.rawValue.utf8), outputByteCount: 32)
    }
}

extension ContainerKey: CustomStringConvertible {
    /// Never the key's bytes (a log line or an error message that prints one says only this).
    public var description: String { "ContainerKey(…)" }
}
