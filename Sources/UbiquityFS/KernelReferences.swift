import UbiquityStore
import UbiquitySystem

/// What the kernel holds of the tree: each inode's lookup count (a reference given with
/// every entry a lookup, create or readdirplus replies with, dropped by forget), and the
/// inodes that lost their last name but stay while referenced or open.
///
/// A leaf lock of its own, not the filesystem's: a lookup that the tree's working set
/// answers counts its reference under the working set's lock alone (`TreeCache.lookUp`),
/// and a forget takes nothing else unless the inode is to go.
final class KernelReferences: Sendable {
    private struct State {
        var lookups: [InodeNumber: UInt64] = [:]
        var unlinked: Set<InodeNumber> = []
    }
    private let state = Locked(State(), rank: .leaf)

    func add(_ ino: InodeNumber) { state.withLock { $0.lookups[ino, default: 0] += 1 } }

    func add(_ inos: [InodeNumber]) {
        state.withLock { s in for ino in inos { s.lookups[ino, default: 0] += 1 } }
    }

    /// The kernel dropped `count` references. Returns whether `ino` may go now: no
    /// reference is left and no name (the caller checks again under the filesystem's lock).
    func forget(_ ino: InodeNumber, count: UInt64) -> Bool {
        state.withLock { s in
            guard let current = s.lookups[ino] else { return false }
            if current <= count { s.lookups[ino] = nil } else { s.lookups[ino] = current - count }
            return s.lookups[ino] == nil && s.unlinked.contains(ino)
        }
    }

    /// Those of `inos` the kernel has a reference to (the root always).
    func known(_ inos: some Sequence<InodeNumber>) -> Set<InodeNumber> {
        state.withLock { s in Set(inos.filter { $0 == Store.rootInode || s.lookups[$0] != nil }) }
    }

    /// `ino` lost its last name.
    func noteUnlinked(_ ino: InodeNumber) { _ = state.withLock { $0.unlinked.insert(ino) } }

    /// Whether unlinked `ino` has no reference left; if so it is no longer noted as
    /// unlinked (its caller drops it).
    func takeUnreferenced(_ ino: InodeNumber) -> Bool {
        state.withLock { s in
            guard s.unlinked.contains(ino), s.lookups[ino] == nil else { return false }
            s.unlinked.remove(ino)
            return true
        }
    }
}
