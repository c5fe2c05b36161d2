import UbiquitySystem

/// The tree's working set in memory, behind a lock of its own so that lookup and getattr
/// need not take the store's: the inodes read lately (`InodeCache`), the names of the
/// directories looked up lately (`DirectoryCache`) and the inode count.
///
/// Whatever it holds is the tree as it is now (SQLite with the overlay's changes on top):
/// the store puts every change here as it makes it (`Store.record`), under the store's
/// lock and then this one (`LockRank.tree`), and empties it after a rollback. A reader
/// takes only this lock, for a few dictionary lookups, so it never waits for a hold of
/// the store's lock (a sync slice, a fold's bookkeeping, a request that waits for the
/// SQLite connection). What it does not find here it asks the store for, under the
/// store's lock, which fills this.
///
/// A reader sees each change whole, and several changes of one operation (a rename: a
/// name out, a name in, the inode) as they are made, one by one. The kernel keeps a
/// lookup out of a directory while a request changes it, so that is seen only of changes
/// that sync makes, each of which is a state the tree may be in. A change that fails
/// halfway is rolled back and this emptied: a reader meanwhile saw it as if made and
/// undone.
public final class TreeCache: Sendable {
    struct State {
        var inodes: InodeCache
        var directories: DirectoryCache
        /// Inodes in the store, once counted (statfs); kept by create and forget.
        var inodeTotal: Int?
        /// Whether an absent name may be remembered by the kernel (a negative entry):
        /// while the operation log works (`Store.writesAhead`, which sets it).
        var answersAbsence = false
    }

    private let state: Locked<State>

    init(inodes: Int, names: Int) {
        state = Locked(State(inodes: InodeCache(capacity: inodes), directories: DirectoryCache(budget: names)), rank: .tree)
    }

    /// For the store, which holds its own lock (the one writer).
    func withLock<R>(_ body: (inout State) -> R) -> R { state.withLock(body) }

    /// What a lookup found in memory.
    public enum Lookup<Extra> {
        /// The entry's inode, its primary name, and what `holding` returned.
        case found(Inode, primaryName: String?, Extra)
        /// The directory has no such name. `remembered`: the kernel may keep that.
        case absent(remembered: Bool)
    }

    /// `name` in directory `parent`, if the directory's names and the entry's inode are
    /// here (nil: ask the store). `holding` runs under this lock with the inode found, for
    /// what must happen before a change to it can: the kernel's reference is counted
    /// there, so a sync change that removes the entry either finds it counted or was made
    /// before the lookup, which then does not find it.
    public func lookUp<Extra>(_ parent: InodeNumber, _ name: String, holding: (InodeNumber) -> Extra) -> Lookup<Extra>? {
        state.withLock { s -> Lookup<Extra>? in
            guard let known = s.directories.lookUp(parent, NameKey(name)) else { return nil }
            guard let id = known else { return .absent(remembered: s.answersAbsence) }
            guard let node = s.inodes.get(id) else { return nil }
            return .found(node.inode, primaryName: node.link?.name, holding(id))
        }
    }

    /// Inode `id` and its primary name, if it is here (nil: ask the store); `holding` as
    /// in `lookUp`.
    public func inode<Extra>(_ id: InodeNumber, holding: (InodeNumber) -> Extra) -> (Inode, primaryName: String?, Extra)? {
        state.withLock { s in s.inodes.get(id).map { ($0.inode, $0.link?.name, holding(id)) } }
    }

    /// Directory `parent`'s entries, sorted by name bytes (the order of a listing from
    /// SQLite), if its names and all their inodes are here (nil: ask the store).
    /// `holding` as in `lookUp`, once per entry.
    public func listing<Extra>(_ parent: InodeNumber, holding: (InodeNumber) -> Extra)
        -> [(name: String, inode: Inode, primaryName: String?, extra: Extra)]? {
        // Sorted outside the lock, and as positions into concrete types: a sort of the
        // generic tuples moves each one through value witnesses, O(n log n) of them.
        let found = state.withLock { s -> (nodes: [(name: String, node: TreeNode)], extras: [Extra])? in
            guard let names = s.directories.listing(parent) else { return nil }
            var nodes: [(name: String, node: TreeNode)] = []
            var extras: [Extra] = []
            nodes.reserveCapacity(names.count)
            extras.reserveCapacity(names.count)
            for (key, id) in names {
                guard let node = s.inodes.get(id) else { return nil }
                nodes.append((key.name, node))
                extras.append(holding(id))
            }
            return (nodes, extras)
        }
        guard let (nodes, extras) = found else { return nil }
        let order = nodes.indices.sorted { nodes[$0].name.utf8.lexicographicallyPrecedes(nodes[$1].name.utf8) }
        return order.map { (nodes[$0].name, nodes[$0].node.inode, nodes[$0].node.link?.name, extras[$0]) }
    }

    /// The inode count, once the store has counted (nil: ask the store).
    public var inodeTotal: Int? { state.withLock { $0.inodeTotal } }
}
