import Glibc
import UbiquityBacking
import UbiquityCrypto
import UbiquitySystem

/// An encrypted container's keys: `keys/<id>`, one key file per passphrase,
/// each the container key wrapped under a key derived from its passphrase (`KeyFile`),
/// in the clear beside FORMAT (a device reads them before it has a key). Any one of them
/// opens the container, as restic's keys do. Adding a passphrase writes a new object
/// (whole, or not at all); removing one deletes one; so a crash at any point leaves every
/// passphrase that was there, or was just added, working.
public struct KeyRing {
    /// The backing store below any encryption: FORMAT and `keys/` are read in the clear.
    public let store: any BackingStore

    public init(_ store: any BackingStore) { self.store = store }

    public static let prefix = "keys/"

    /// More key files than this are not tried (each costs a scrypt derivation): a
    /// container has a few passphrases; a server that lists thousands is not believed.
    public static let maxKeys = 32

    /// What FORMAT says the container is.
    public enum Kind: Equatable { case empty, plain, encrypted }

    public struct Entry: Equatable {
        public let id: String
        public let cost: ScryptCost
    }

    public func kind() throws(KeyRingError) -> Kind {
        let format: [UInt8]
        do { format = try store.get(Backing.formatKey, range: 0..<100) } catch {
            if case .notFound = error { return .empty }
            throw .backing("read \(store.location)/FORMAT: \(error)")
        }
        return Backing.isEncryptedFormat(format) ? .encrypted : .plain
    }

    /// Makes an empty backing store an encrypted container: a new random key under
    /// `passphrase`, then FORMAT (written only if absent, last: a container whose FORMAT
    /// says encrypted always has a key).
    public func create(passphrase: [UInt8], cost: ScryptCost) throws(KeyRingError) -> (key: ContainerKey, id: String) {
        guard try kind() == .empty else { throw .notEmpty(store.location) }
        let key = ContainerKey.random()
        let id = try add(key, passphrase: passphrase, cost: cost)
        do { try store.put(Backing.formatKey, Array(Backing.encryptedFormatLine.utf8), ifAbsent: true) } catch {
            try? store.delete(Self.key(id))
            if case .exists = error { throw .notEmpty(store.location) } // another device was first
            throw .backing("put \(store.location)/FORMAT: \(error)")
        }
        return (key, id)
    }

    /// Makes an empty backing store a plain container (`ubiquity init` without
    /// encryption; a first mount does the same).
    public func createPlain() throws(KeyRingError) {
        guard try kind() == .empty else { throw .notEmpty(store.location) }
        do { try store.put(Backing.formatKey, Array(Backing.formatLine.utf8), ifAbsent: true) } catch {
            if case .exists = error { throw .notEmpty(store.location) }
            throw .backing("put \(store.location)/FORMAT: \(error)")
        }
    }

    /// The container key, from the first key file `passphrase` opens.
    public func open(passphrase: [UInt8]) throws(KeyRingError) -> (key: ContainerKey, id: String) {
        let ids = try ids()
        guard !ids.isEmpty else { throw .noKeys(store.location) }
        for id in ids.prefix(Self.maxKeys) {
            guard let file = try? read(id) else { continue } // logged by list; another may open
            if let key = try? file.unwrap(passphrase: passphrase) { return (key, id) }
        }
        throw .wrongPassphrase
    }

    /// Every key file, parsed; one that does not parse is named in `malformed`.
    public func list() throws(KeyRingError) -> (entries: [Entry], malformed: [String]) {
        var entries: [Entry] = [], malformed: [String] = []
        for id in try ids() {
            do { entries.append(Entry(id: id, cost: try read(id).cost)) } catch { malformed.append("\(id): \(error)") }
        }
        return (entries, malformed)
    }

    /// Wraps `key` under another passphrase: a new key file. Returns its id.
    @discardableResult
    public func add(_ key: ContainerKey, passphrase: [UInt8], cost: ScryptCost) throws(KeyRingError) -> String {
        let file: KeyFile
        do { file = try KeyFile.wrap(key, passphrase: passphrase, cost: cost) } catch { throw .crypto(error) }
        let id = Hex.encode((0..<8).map { _ in UInt8.random(in: 0...255) })
        do { try store.put(Self.key(id), file.encoded, ifAbsent: true) } catch {
            throw .backing("put \(store.location)/\(Self.prefix)\(id): \(error)")
        }
        return id
    }

    /// Deletes key file `id`; never the last one, nor `current` (the one this
    /// passphrase opened: remove it from another, as restic does).
    public func remove(_ id: String, current: String) throws(KeyRingError) {
        let ids = try ids()
        guard ids.contains(id) else { throw .noSuchKey(id) }
        guard id != current else { throw .removingCurrent(id) }
        guard ids.count > 1 else { throw .removingLast(id) }
        do { try store.delete(Self.key(id)) } catch { throw .backing("delete \(store.location)/\(Self.prefix)\(id): \(error)") }
    }

    /// Deletes key file `old` once `new` (another key file of the same key) is there.
    public func removeAfterReplacing(_ old: String, by new: String) throws(KeyRingError) {
        let ids = try ids()
        guard ids.contains(new) else { throw .noSuchKey(new) }
        guard old != new, ids.contains(old) else { return }
        do { try store.delete(Self.key(old)) } catch { throw .backing("delete \(store.location)/\(Self.prefix)\(old): \(error)") }
    }

    static func key(_ id: String) -> BackingKey { BackingKey(checked: prefix + id) }


    private func ids() throws(KeyRingError) -> [String] {
        let listed: [ObjectInfo]
        do { listed = try store.listAll(prefix: Self.prefix, pageSize: 1000, cap: 10_000) } catch {
            throw .backing("list \(store.location)/\(Self.prefix): \(error)")
        }
        return listed.compactMap { info in
            let name = info.key.path.dropFirst(Self.prefix.count)
            return Hex.isLowercase(name, count: 16) ? String(name) : nil
        }
    }

    private func read(_ id: String) throws(KeyRingError) -> KeyFile {
        let bytes: [UInt8]
        do { bytes = try store.get(Self.key(id), range: 0..<Int64(KeyFile.maxSize)) } catch {
            throw .backing("get \(store.location)/\(Self.prefix)\(id): \(error)")
        }
        do { return try KeyFile(decoding: bytes) } catch { throw .crypto(error) }
    }
}

/// Why a key operation failed; never holds a key or a passphrase.
public enum KeyRingError: Error, Equatable, CustomStringConvertible {
    case wrongPassphrase
    case noKeys(String)
    case notEmpty(String)
    case noSuchKey(String)
    case removingCurrent(String)
    case removingLast(String)
    case crypto(CryptoFailure)
    case backing(String)

    public var description: String {
        switch self {
        case .wrongPassphrase: "wrong passphrase: no key of this container opens with it"
        case .noKeys(let at): "\(at) says it is encrypted but holds no key (keys/ is empty): it cannot be opened"
        case .notEmpty(let at): "\(at) is a container already: encryption is chosen when a backing store is first used"
        case .noSuchKey(let id): "no key \(id) (`ubiquity key list` shows them)"
        case .removingCurrent(let id): "key \(id) is the one this passphrase opened: remove it with another passphrase (or use `ubiquity key passwd`)"
        case .removingLast(let id): "key \(id) is the container's last key: without it nobody could open the container"
        case .crypto(let failure): "\(failure)"
        case .backing(let what): what
        }
    }
}
