import UbiquityStore
import UbiquitySystem

/// The filesystem's lock and then the store's: the order every operation that needs both
/// takes them in (FileSystem's lock list). The sync engine takes only the store's.
struct MetaLock: Sendable {
    let state: Locked<FileSystem.Meta>
    let store: SharedStore

    /// Runs `body` with the filesystem's state and the store, each under its lock. The
    /// store comes only as this argument (`Meta` holds none), so it is used under its lock
    /// by construction, and only as what the filesystem may do to it (`FileSystemStore`).
    /// An existential of one class-bound protocol: a reference and a witness table, no
    /// allocation.
    func withLock<R, E: Error>(_ body: (inout FileSystem.Meta, any FileSystemStore) throws(E) -> R) throws(E) -> R {
        try state.withLock { (m) throws(E) -> R in
            try store.withNamespaceLock { (store) throws(E) -> R in try body(&m, store) }
        }
    }

    /// Between slices of background work: the locks go to whoever waited for them.
    func yieldToWaiters() {
        state.yieldToWaiters()
        store.yieldToWaiters()
    }
}

/// The files sync must not change now: open for writing, or with unsaved writes. Under
/// a leaf lock of its own, so a sync step asks while it holds the store's lock, without
/// the filesystem's (taken first everywhere else: asking for it there could deadlock).
/// The filesystem tells it of every open file and writable handle as they come and go.
final class BusyFiles: Sendable {
    private struct Entry {
        var content: FileContent?
        var writers = 0
    }
    private let entries = Locked<[InodeNumber: Entry]>([:], rank: .leaf)

    /// `ino` is open with `content` (nil: no longer open).
    func open(_ ino: InodeNumber, _ content: FileContent?) {
        entries.withLock { e in
            e[ino, default: Entry()].content = content
            if content == nil && e[ino]?.writers == 0 { e[ino] = nil }
        }
    }

    /// A handle that may write `ino` came (+1) or went (-1).
    func writers(_ ino: InodeNumber, _ delta: Int) {
        entries.withLock { e in
            let writers = max(0, e[ino, default: Entry()].writers + delta)
            e[ino, default: Entry()].writers = writers
            if writers == 0 && e[ino]?.content == nil { e[ino] = nil }
        }
    }

    func current() -> Set<InodeNumber> {
        entries.withLock { e in
            Set(e.compactMap { ino, entry in entry.writers > 0 || entry.content?.isChanged == true ? ino : nil })
        }
    }
}
