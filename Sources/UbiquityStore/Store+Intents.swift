import Glibc
import UbiquitySystem

/// Saves secured by the intent log (`IntentLog`) until the metadata batch commits.
extension Store {
    /// After `commit` recorded a version inside the open batch: the save is appended to
    /// the intent log, and the batch notes its sequence (`intent_applied`), so the next open
    /// knows whether the batch made it to the database. Without group commit (a store used
    /// outside a mount) the version is committed already and nothing is logged.
    func secure(_ id: InodeNumber, content: ChunkList, path: String, version: VersionID) throws(StoreError) {
        guard db.batching, let inode = try node(id)?.inode else { return }
        do {
            try append(Intent(sequence: 0, version: version, path: path, mode: inode.mode, uid: inode.uid, gid: inode.gid,
                           mtime: inode.mtime, content: content, chunkBytes: chunks.uncommittedSmallChunks(content.ids)))
        } catch {
            // No log (a full disk, a save too big for a frame): commit the batch now, so
            // the save is in the database when close() returns.
            try commitBatch()
        }
    }

    /// Largest content `logDurably` carries in one frame; a bigger file's fsync runs the
    /// durability barrier instead.
    static let durableFrameLimit: Int64 = 1 << 20

    /// fsync(2) of a file of up to `durableFrameLimit` bytes: one frame carrying its
    /// current version with all its bytes, so that one fdatasync of the log (the caller's,
    /// on the descriptor returned, which it closes, outside the store's lock) makes the
    /// save durable, where the barrier fsyncs the chunk files, their directories and both
    /// databases' WALs. Nil when the barrier is needed: a bigger file, one with extended
    /// attributes (the frame does not carry them), or one whose current version came
    /// from another device (replay would record it as this device's, under its id).
    public func logDurably(_ id: InodeNumber) throws(StoreError) -> Int32? {
        guard db.batching, let inode = try node(id)?.inode, inode.kind == .file, let head = inode.head,
              let version = try version(row: head), version.deviceID == deviceID,
              try currentXattrs(id).isEmpty else { return nil }
        let content = try chunkList(row: head)
        guard content.storedBytes <= Self.durableFrameLimit else { return nil }
        var bytes: [ChunkID: [UInt8]] = [:]
        for (id, _) in content.chunks {
            // A chunk of a file not downloaded stays where it is (no fetch under the
            // filesystem's lock): the barrier makes such a save durable instead. (Inline
            // chunks travel in the frame's list.)
            guard chunks.isLocal(id) else { return nil }
            bytes[id] = try chunks.read(id)
        }
        // Its path now (a rename since the save is not in the version yet).
        try append(Intent(sequence: 0, version: version.id, path: try treePath(of: id) ?? version.path, mode: inode.mode,
                          uid: inode.uid, gid: inode.gid, mtime: inode.mtime, content: content, chunkBytes: bytes))
        return try intents.durableDescriptor()
    }

    /// Appends `intent` with the next sequence, which the open batch records as applied.
    private func append(_ intent: Intent) throws(StoreError) {
        var intent = intent
        intent.sequence = intentSequence + 1
        try intents.append(intent)
        intentSequence += 1
    }

    /// At open, before anything else changes the tree: records again the saves of the
    /// log that the database does not have (the process was killed before its batch
    /// committed, or the power went before a barrier made it durable). Each goes to its
    /// path (directories made as needed), as a new version of the file there, or of a new
    /// file, with the id it had. A save whose chunks are missing (a power loss dropped
    /// them: they were never fsynced) is logged and skipped: the file keeps its version
    /// before it. Returns the paths recovered.
    ///
    /// The log is kept for the next barrier, which makes what it holds durable elsewhere
    /// before it lets it go (the saves the operation log brought back are in the overlay
    /// until the group commit folds them); the open does not wait for that flush.
    /// - Parameter logged: the log's frames and where the last whole one ends, read once
    ///   at open (`IntentLog.frames`).
    func replayIntents(_ logged: (intents: [Intent], end: Int64)) throws(StoreError) -> [String] {
        let found = logged.intents
        try intents.keepExisting(wholeBytes: logged.end)
        let applied = Int64(try setting("intent_applied") ?? "0") ?? 0
        intentSequence = max(applied, found.map(\.sequence).max() ?? 0)
        var recovered: [String] = []
        let unfolded = unfoldedSaves
        for intent in found where intent.sequence > applied {
            do {
                // Its record came back from the operation log (or an fsync wrote a second
                // frame); its small chunks were put back before the recovery
                // (`restoreChunksOfLoggedSaves`).
                if try isLogged(intent, unfolded: unfolded) { continue }
                if try replay(intent) { recovered.append(intent.path) }
            } catch {
                log("ubiquity: \(intent.path): the save the intent log kept could not be recorded again: \(error)")
            }
        }
        withdrawnAtOpen = []
        // What was recorded again was written straight to SQLite: the barrier makes it
        // durable now (and lets the log go).
        if !recovered.isEmpty {
            try chunks.sync()
            try markDurable()
        }
        for path in recovered {
            log("ubiquity: \(path): a save the daemon acknowledged before it stopped was recorded again from the intent log")
        }
        return recovered
    }

    /// For each save of the intent log whose version the database or the overlay has
    /// (the operation log replayed it), the chunks the frame carries that are not here:
    /// small chunks whose batch of small.sqlite the crash lost, or an fsynced save's
    /// chunk files that a power loss took. Every frame counts, applied or not: the log
    /// holds only what the last barrier did not make durable, and `intent_applied` may
    /// reach the disk (a checkpoint) before the chunk files do. (Committed, not flushed:
    /// the log keeps them until the next barrier.)
    func restoreChunksOfLoggedSaves(_ logged: [Intent]) throws(StoreError) {
        let unfolded = unfoldedSaves
        for intent in logged where try isLogged(intent, unfolded: unfolded) {
            try restoreChunks(intent)
        }
    }

    /// The versions of the saves the overlay holds: the open's replay, not folded yet.
    private var unfoldedSaves: Set<VersionID> { Set(overlay.saves.values.map(\.id)) }

    /// Whether the operation log's replay accounted for this save: its version is in the
    /// overlay (`unfolded`, taken before anything here folds it) or the database, or it
    /// was withdrawn (an editor's temp file, whose content another save took: not
    /// recorded again, but its chunks are put back, as that save may need them).
    private func isLogged(_ intent: Intent, unfolded: Set<VersionID>) throws(StoreError) -> Bool {
        if withdrawnAtOpen.contains(intent.version) || unfolded.contains(intent.version) { return true }
        return try db.aroundGate { () throws(StoreError) in try index.versionExists(intent.version) }
    }

    /// Puts back the chunks the frame carries that are not here.
    private func restoreChunks(_ intent: Intent) throws(StoreError) {
        for (id, bytes) in intent.chunkBytes where !chunks.contains(id) && ChunkID(hashing: bytes) == id {
            try chunks.put(id, bytes)
        }
    }

    private func replay(_ intent: Intent) throws(StoreError) -> Bool {
        for (id, bytes) in intent.chunkBytes where ChunkID(hashing: bytes) == id {
            try chunks.put(id, bytes)
        }
        for (id, _) in intent.content.chunks {
            // A chunk of a file not downloaded (its place in the backing store is known)
            // is fetched when read, as it was before the save.
            if chunks.contains(id) { continue }
            guard try chunkPlaces([id])[id] != nil else {
                log("ubiquity: \(intent.path): version saved at \(intent.mtime / 1_000_000_000) not recovered: chunk \(id) is missing (it was never fsynced and the power went); rolled back to the version before it")
                return false
            }
        }
        // Permission bits only: the frame came from disk, and no other bit of a mode is a
        // file's to take from it.
        let mode = intent.mode & 0o7777
        let names = PathBytes.components(intent.path)
        guard let name = names.last else { return false }
        var parent = Store.rootInode
        for directory in names.dropLast() {
            if let child = try childID(parent, directory) {
                guard try node(child)?.inode.kind == .directory else {
                    log("ubiquity: \(intent.path): not recovered: \(directory) is no longer a directory")
                    return false
                }
                parent = child
            } else {
                parent = try create(parent: parent, name: directory, kind: .directory, mode: 0o755, uid: intent.uid, gid: intent.gid).id
            }
        }
        let id: InodeNumber
        if let existing = try childID(parent, name) {
            guard try node(existing)?.inode.kind == .file else {
                log("ubiquity: \(intent.path): not recovered: the name is no longer a file")
                return false
            }
            id = existing
        } else {
            id = try create(parent: parent, name: name, kind: .file, mode: mode, uid: intent.uid, gid: intent.gid).id
            // As a new file at a deleted file's path continues its history (FileSystem).
            if !LocalOnly.contains(intent.path), let dead = try deadHistory(at: intent.path) {
                try continueHistory(id, dead)
            }
        }
        guard var inode = try node(id)?.inode else { return false }
        inode.mode = mode
        inode.mtime = intent.mtime
        inode.ctime = intent.mtime
        try update(inode)
        try commit(id, content: intent.content, path: intent.path, local: LocalOnly.contains(intent.path), versionID: intent.version)
        return true
    }
}
