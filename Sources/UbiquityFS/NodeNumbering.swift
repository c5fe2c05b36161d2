import UbiquityStore

/// Inode numbers for nodes that are not in the store (the history views' nodes, the
/// key-value store's files): a node keeps its number while the kernel holds a reference
/// to it (a lookup, a readdirplus entry), numbers are never reused, and a node the
/// kernel forgot is dropped, so such nodes cost memory only while in use.
struct NodeNumbering<Key: Hashable> {
    private var keys: [InodeNumber: Key] = [:]
    private var numbers: [Key: InodeNumber] = [:]
    private var references: [InodeNumber: UInt64] = [:]
    private var next: InodeNumber
    /// Numbered from the start and never dropped (the views' roots).
    private let permanent: Set<InodeNumber>

    init(first: InodeNumber, permanent: [InodeNumber: Key] = [:]) {
        next = first
        self.permanent = Set(permanent.keys)
        for (n, key) in permanent {
            keys[n] = key
            numbers[key] = n
        }
    }

    mutating func number(_ key: Key) -> InodeNumber {
        if let n = numbers[key] { return n }
        let n = next
        next = next.advanced(by: 1)
        keys[n] = key
        numbers[key] = n
        return n
    }

    func key(_ ino: InodeNumber) -> Key? { keys[ino] }

    func existingNumber(_ key: Key) -> InodeNumber? { numbers[key] }

    var count: Int { keys.count }

    /// The kernel took a reference to `ino`.
    mutating func referenced(_ ino: InodeNumber) {
        if keys[ino] != nil { references[ino, default: 0] += 1 }
    }

    /// The kernel dropped `count` references to `ino`.
    mutating func forget(_ ino: InodeNumber, count: UInt64) {
        guard let held = references[ino] else { return }
        if held > count {
            references[ino] = held - count
            return
        }
        references[ino] = nil
        drop(ino)
    }

    /// Drops the numbered nodes no reference holds once more than `limit` are, but those
    /// in `pinned` (an open directory handle lists them: readdirplus may still hand them out).
    mutating func pruneUnreferenced(limit: Int, pinned: () -> Set<InodeNumber>) {
        guard keys.count - references.count > limit else { return }
        let keep = pinned()
        for ino in Array(keys.keys) where references[ino] == nil && !keep.contains(ino) { drop(ino) }
    }

    private mutating func drop(_ ino: InodeNumber) {
        guard !permanent.contains(ino), let key = keys.removeValue(forKey: ino) else { return }
        numbers[key] = nil
    }
}
