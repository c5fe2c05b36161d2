import UbiquityStore

extension FileSystem {
    /// A request on the views (`.versions/`, `.conflicts/`) about `ino` (the node, or the
    /// parent of a lookup). `.versions/` is read through the versions' reader
    /// (`SharedStore.versions`) once the index is brought up to now, under the filesystem's
    /// lock alone: no fold, settling of moves or statement runs under the store's lock for
    /// it, and no request waits for its reads (ARCHITECTURE.md "The Store split", step 5).
    /// `.conflicts/` reads the synced view, which the store's lock still guards: those
    /// requests run under both locks, as before.
    func withViews<R>(about ino: InodeNumber, _ body: (inout Meta, VirtualViews.Source) throws(Errno) -> R) throws(Errno) -> R {
        try storeCall { () throws(StoreError) in try store.prepareVersionReads() }
        let root = try rootInode()
        let source = VirtualViews.Source(versions: store.versions, conflicts: nil, root: root, chunks: store.chunks,
                                         stagingDirectory: store.stagingDirectory)
        let outcome = try state.withLock { (m) throws(Errno) -> ViewOutcome<R> in
            if m.views.readsSyncedView(ino) { return .needsStore }
            return .done(try body(&m, source))
        }
        if case .done(let result) = outcome { return result }
        return try meta.withLock { (m, store) throws(Errno) -> R in
            guard let root = store.inode(Store.rootInode) else { throw .notFound }
            return try body(&m, VirtualViews.Source(store: store, root: root))
        }
    }

    /// The root's inode, whose owner and time the views and the key-value door show: from
    /// the working set, else from the store.
    func rootInode() throws(Errno) -> Inode {
        if let (root, _, _) = store.tree.inode(Store.rootInode, holding: { _ in () }) { return root }
        guard let root = meta.withLock({ _, store in store.inode(Store.rootInode) }) else { throw .notFound }
        return root
    }
}

private enum ViewOutcome<R> {
    case done(R)
    case needsStore
}
