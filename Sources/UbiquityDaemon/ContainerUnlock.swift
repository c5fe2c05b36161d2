import Glibc
import UbiquityBacking
import UbiquityCrypto
import UbiquityStore
import UbiquitySync
import UbiquitySystem

/// Unlocking an encrypted container, for `mount`, `init`, `key` and `fsck`:
/// the one place that decides from FORMAT whether a passphrase is needed, asks for it and
/// turns it into the container key.
public enum ContainerUnlock {
    /// An open container: its key, and which key file the passphrase opened.
    public struct Unlocked: Sendable {
        public let key: ContainerKey
        public let keyID: String
        /// The store that seals and opens every object but FORMAT and `keys/`.
        public func wrap(_ store: any BackingStore) -> any BackingStore { EncryptedStore(store, key: key) }
        /// The chunker of this container's files (its cut table derived from the key).
        public var chunker: Chunker { Chunker.keyed(table: key.chunkerTable())! }
    }

    /// The passphrase was wrong or missing: `ubiquity` exits with status 2.
    public struct Refused: Error, CustomStringConvertible {
        public let description: String
    }

    /// The cost of new key files: tuned on this machine (0.5 s); `UBQ_TEST_SCRYPT=fast`
    /// (tests only, logged) takes the cheapest the format allows.
    public static func newKeyCost() throws -> ScryptCost {
        if Paths.env("UBQ_TEST_SCRYPT") == "fast" {
            log("ubiquity: UBQ_TEST_SCRYPT=fast: the passphrase key is the cheapest scrypt allows (a test setting)")
            return ScryptCost(n: 1 << 10, r: 8, p: 1)!
        }
        return try ScryptCost.tuned {
            var now = timespec()
            clock_gettime(CLOCK_MONOTONIC, &now)
            return Double(now.tv_sec) + Double(now.tv_nsec) / 1e9
        }
    }

    /// For a mount: the container's key when FORMAT says it is encrypted (or `encrypt`
    /// asks for a new encrypted container on an empty store), nil for a plain one.
    public static func forMount(_ clear: any BackingStore, encrypt: Bool, source: PassphraseSource) throws -> Unlocked? {
        let ring = KeyRing(clear)
        switch try ring.kind() {
        case .empty:
            guard encrypt else { return nil }
            return try create(ring, source: source)
        case .plain:
            if encrypt {
                throw DaemonError.encryption("\(clear.location) is a container already, not encrypted: encryption is chosen when a backing store is first used (mount it without --encrypt, or give an empty one)")
            }
            return nil
        case .encrypted:
            return try open(ring, source: source)
        }
    }

    /// Makes an empty store an encrypted container.
    public static func create(_ ring: KeyRing, source: PassphraseSource) throws -> Unlocked {
        let passphrase = try source.read(purpose: "New passphrase for the encrypted container at \(ring.store.location)", confirm: true)
        let cost = try newKeyCost()
        let (key, id) = try ring.create(passphrase: passphrase.bytes, cost: cost)
        log("ubiquity: created an encrypted container at \(ring.store.location) (key \(id), scrypt N=\(cost.n) r=\(cost.r) p=\(cost.p))")
        return Unlocked(key: key, keyID: id)
    }

    /// Opens an encrypted container with a passphrase from `source`.
    public static func open(_ ring: KeyRing, source: PassphraseSource) throws -> Unlocked {
        let passphrase: Passphrase
        do { passphrase = try source.read(purpose: "Passphrase of the encrypted container at \(ring.store.location)") } catch let none as NoPassphrase {
            throw Refused(description: "\(ring.store.location) is encrypted and needs its passphrase: \(none)")
        }
        do {
            let (key, id) = try ring.open(passphrase: passphrase.bytes)
            return Unlocked(key: key, keyID: id)
        } catch {
            if error == .wrongPassphrase { throw Refused(description: "\(ring.store.location): \(error)") }
            throw DaemonError.encryption("\(error)")
        }
    }

    // MARK: handing the key to the daemon

    /// A pipe that holds the key for the daemon this process starts (`--key-fd`): the
    /// passphrase is asked and scrypt runs once, here, where the terminal is.
    public static func handOff(_ unlocked: Unlocked) throws -> Int32 {
        var fds: [Int32] = [0, 0]
        guard pipe(&fds) == 0 else { throw DaemonError.system("pipe", errno: errno) }
        let text = Array((Hex.encode(unlocked.key.bytesForHandOff) + " " + unlocked.keyID + "\n").utf8)
        let written = text.withUnsafeBytes { write(fds[1], $0.baseAddress, $0.count) }
        close(fds[1])
        guard written == text.count else {
            close(fds[0])
            throw DaemonError.system("cannot hand the key to the daemon", errno: errno)
        }
        return fds[0]
    }

    /// The key the starting process handed over (`handOff`).
    public static func receive(fd: Int32) throws -> Unlocked {
        defer { close(fd) }
        let bytes = try PassphraseSource.readToEnd(fd, what: "--key-fd")
        let parts = String(decoding: bytes, as: UTF8.self).split(whereSeparator: { $0 == " " || $0 == "\n" })
        guard parts.count == 2, let raw = Hex.decode(parts[0]), let key = ContainerKey(bytes: raw), Hex.isLowercase(parts[1], count: 16) else {
            throw DaemonError.encryption("--key-fd: not a container key")
        }
        return Unlocked(key: key, keyID: String(parts[1]))
    }
}
