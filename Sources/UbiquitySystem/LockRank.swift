import CUbiquity

/// The lock order of a mount, in one place: a thread takes a ranked lock only while every
/// ranked lock it holds has a lower rank. Debug builds check it at every acquisition
/// (`Locked(_:rank:)`, the index's lock, which counts as held across calls until it is
/// let go) and trap on a violation; release builds check nothing.
///
/// 1. `content`: a `FileContent`'s lock (per open file: its data and commits).
/// 2. `filesystem`: `FileSystem.state`, the filesystem's own state.
/// 3. `store`: `SharedStore`'s lock, the namespace; its holder uses the index's
///    connection whenever no one holds 4.
/// 4. `index`: the index's lock (`Index`, `IndexLock`): the group commit's folder holds it
///    while it writes a part outside the store's lock, as does a barrier's commit; the
///    store's holder that needs the connection meanwhile waits on it.
/// 5. `tree`: the tree's working set in memory (`TreeCache`): the store's holder takes it
///    for the moment of a change; lookup and getattr take it alone, without 2 or 3.
/// 6. `packUpkeep`: local packs' compactions and punches (`LocalPacks`), one at a time,
///    taken under no other lock (they write and flush); appends go on meanwhile.
/// 7. `packAppend`: local packs' appends (`LocalPacks`), held around the write of a record,
///    which then takes the packs' index (a leaf).
/// 8. `keyValues`: the key-value store's database (`KeyValueTable`), taken under the
///    filesystem's lock (`.kv/`) or alone (the key-value sync); nothing is taken under it.
/// 9. `versionLog`: the versions' reader (`VersionLog`), taken under the filesystem's lock
///    (`.versions/`) or alone, never with the store's; nothing is taken under it.
/// 10. `leaf`: locks under which no other ranked lock is taken but a file's summary (the
///    busy files, the handle table, the open files, the kernel's references, the small
///    chunks' database, the local packs' index).
/// 11. `summary`: a `FileContent`'s summary (its size and whether it changed), which the
///    busy files read under their lock.
public enum LockRank: Int, Sendable {
    case content = 1
    case filesystem = 2
    case store = 3
    case index = 4
    case tree = 5
    case packUpkeep = 6
    case packAppend = 7
    case keyValues = 8
    case versionLog = 9
    case leaf = 10
    case summary = 11

    /// Notes that the calling thread takes a lock of this rank (debug builds: traps when
    /// it holds one of this rank or above), until `released`.
    @inline(__always)
    public func acquiring() {
        #if DEBUG
        let held = ubq_lock_ranks_held()
        precondition(held >> UInt32(rawValue) == 0,
                     "lock order: taking a lock of rank \(self) while holding ranks \(Self.describe(held))")
        ubq_set_lock_ranks_held(held | 1 << UInt32(rawValue))
        #endif
    }

    /// The lock of this rank taken by `acquiring` is released. Only its own rank is let
    /// go: a lock taken under it and held across calls (the index's, lent under the
    /// store's lock, which goes first) stays noted, so what the thread takes before it
    /// lets that one go is checked against it too.
    @inline(__always)
    public func released() {
        #if DEBUG
        ubq_set_lock_ranks_held(ubq_lock_ranks_held() & ~(1 << UInt32(rawValue)))
        #endif
    }

    /// Debug builds: traps when the calling thread could not take a lock of this rank now
    /// (a wait on one, such as a claim of the index's connection).
    @inline(__always)
    public func checkMayWait() {
        acquiring()
        released()
    }

    private static func describe(_ held: UInt32) -> String {
        (1..<32).filter { held & 1 << UInt32($0) != 0 }.compactMap { LockRank(rawValue: $0).map { "\($0)" } }.joined(separator: ", ")
    }
}
