import Glibc
import UbiquitySystem

/// Recovery after an unclean stop. A version is `durable` once a durability barrier ran
/// after it was written (`markDurable`); a clean stop runs one, so versions that are not
/// durable at open were written just before a crash or a power loss. A crash of the
/// process loses nothing (the kernel still writes its page cache), but a power loss drops
/// every write that was not fsynced, so such a version may name chunks that never reached
/// the disk. Each is checked (its chunks read and hashed): a good one is made durable; a
/// damaged one of this device that never left it is rolled back to its parent (the file
/// shows its previous version, or is empty when it had none), and the log says so. One
/// that came from another device, or that was uploaded, is left for
/// `ubiquity fsck --repair`, which fetches its chunks from the backing directory.
///
/// A chunk that is not here but whose place in the backing store is known (a file not
/// downloaded, files on demand) is remote, not damage.
///
/// The cost is proportional to what was written since the last barrier (at most about
/// ten seconds of writes, as the mount runs one every 10 s), found by the partial index
/// `versions_pending`.
///
/// Only a power loss drops writes: when the machine has not restarted since the last
/// serving open (the kernel's boot id is the one that open stored, `bootKey`), a crash of
/// the process left every write in the page cache, so nothing is read back. The next
/// barrier then flushes the whole store, not only what this process wrote, before it
/// marks those versions durable.
extension Store {
    public struct RecoveryReport: Sendable, Equatable {
        /// Versions checked.
        public var checked = 0
        /// "path: version <id> → <what it shows now>" for each version rolled back.
        public var rolledBack: [String] = []
        /// Damaged versions left for `fsck --repair`.
        public var damaged: [String] = []
    }

    /// Runs at open (serving stores only). Does nothing after a clean stop.
    ///
    /// The versions the operation log's replay holds (all written after the last barrier,
    /// which folds) are checked where they are, without a fold, so the open serves at
    /// once and the group commit folds them later. They stay marked as not durable until
    /// the next barrier. Only damage, which needs a rollback in SQLite, folds first.
    func recoverUndurableVersions() throws(StoreError) -> RecoveryReport {
        if let boot = Self.bootID(), try setting(Self.bootKey) == boot {
            // Nothing is read back, so only the count is read (a crash in the middle of a
            // join leaves up to a row per file not durable).
            let stored = try db.aroundGate { () throws(StoreError) in
                try db.rows("SELECT count(*) FROM versions WHERE durable = 0", []) { Int($0.int(0)) }.first ?? 0
            }
            let count = stored + overlay.saves.count + overlay.tombstones.count
            guard count > 0 else { return RecoveryReport() }
            log("ubiquity: recovery: \(count) version(s) written since the last durability barrier (a crash of the process; the machine kept running, so none lost a write): the next barrier flushes them")
            chunks.leaveDeadProcessWritesToNextBarrier()
            return RecoveryReport()
        }
        let stored = try db.aroundGate { () throws(StoreError) in
            try db.rows("SELECT row, kind = \(NodeKind.file.rawValue) AND tombstone = 0 FROM versions WHERE durable = 0", []) {
                (row: $0.int(0), hasChunks: $0.int(1) != 0)
            }
        }
        let unfolded = overlay.saves.keys.sorted()
        if stored.isEmpty && unfolded.isEmpty && overlay.tombstones.isEmpty { return RecoveryReport() }
        let count = stored.count + unfolded.count + overlay.tombstones.count
        log("ubiquity: recovery: \(count) version(s) written since the last durability barrier (an unclean stop): checking their chunks")
        // What the crash left in the page cache is on disk after this; what a power loss
        // dropped is missing or damaged, and the reads below find it.
        try chunks.syncEverything()
        let rows = stored.filter(\.hasChunks).map(\.row) + unfolded
        for row in rows where damage(in: try chunkList(row: row)) != nil {
            try foldTree()
            return try rollBackDamagedVersions()
        }
        var report = RecoveryReport()
        report.checked = rows.count
        return report
    }

    /// After a power loss damaged a version (the overlay folded): checks each version not
    /// durable again, rolls back the damaged ones of this device that never left it, and
    /// runs the barrier.
    private func rollBackDamagedVersions() throws(StoreError) -> RecoveryReport {
        var report = RecoveryReport()
        let pending = try db.rows("""
            SELECT row, id, file_id, parents, device_id, uploaded, local, kind, tombstone, path, mtime, device_id, mode, target
            FROM \(Store.versionsWithDevices) WHERE durable = 0 ORDER BY row DESC
            """, []) { r in
            (record: Replica.Record(row: r.int(0), id: r.versionID(1), node: r.nodeID(2), parents: r.versionIDs(3),
                                    kind: NodeKind(rawValue: r.int(7)) ?? .file, isTombstone: r.int(8) != 0,
                                    mtime: r.int(10), device: r.deviceID(11), path: r.text(9),
                                    mode: UInt32(truncatingIfNeeded: r.int(12)), target: r.isNull(13) ? nil : r.text(13)),
             mine: r.deviceID(4) == deviceID, uploaded: r.int(5) != 0, local: r.int(6) != 0)
        }
        for version in pending where version.record.kind == .file && !version.record.isTombstone {
            report.checked += 1
            let list = try chunkList(row: version.record.row)
            guard let problem = damage(in: list) else { continue }
            let name = "\(version.record.path): version \(version.record.id)"
            guard version.mine && !version.uploaded else {
                report.damaged.append("\(name) (\(problem))")
                log("ubiquity: recovery: \(name) is damaged (\(problem)); `ubiquity fsck --repair` fetches it from the backing directory")
                continue
            }
            let shows = try rollBack(version.record, local: version.local)
            report.rolledBack.append("\(name) → \(shows)")
            log("ubiquity: recovery: \(name) lost its bytes in the crash (\(problem)); rolled back, the file shows \(shows)")
        }
        try markDurable()
        return report
    }

    /// Where a serving open notes the boot it ran in (after its recovery).
    static let bootKey = "boot_id"

    /// The kernel's id of this boot (nil where there is none to read). One read(2): a
    /// file of /proc has no size to read by.
    static func bootID() -> String? {
        let fd = open("/proc/sys/kernel/random/boot_id", O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { return nil }
        defer { close(fd) }
        var buffer = [UInt8](repeating: 0, count: 64)
        let count = buffer.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
        guard count > 0 else { return nil }
        let text = String(decoding: buffer.prefix(count).filter { $0 != UInt8(ascii: "\n") }, as: UTF8.self)
        return text.isEmpty ? nil : text
    }

    /// After the recovery: later opens in this boot know that the page cache still holds
    /// what this process writes.
    func noteBoot() throws(StoreError) {
        guard let boot = Self.bootID(), try setting(Self.bootKey) != boot else { return }
        try setSetting(Self.bootKey, boot)
    }

    /// The first problem with a chunk of the list, nil when every chunk reads back whole.
    private func damage(in list: ChunkList) -> String? {
        for (id, size) in list.chunks {
            do throws(StoreError) {
                let bytes = try chunks.read(id)
                if bytes.count != size { return "chunk \(id) has \(bytes.count) bytes, not \(size)" }
            } catch {
                // Not here but in the backing store (files on demand): remote, not damage.
                if case .missingChunk(let id) = error, (try? chunkPlaces([id]))?[id] != nil { continue }
                return "\(error)"
            }
        }
        return nil
    }

    /// Deletes the version and points what showed it at its parent. Returns what the file
    /// shows now, for the log.
    private func rollBack(_ record: Replica.Record, local: Bool) throws(StoreError) -> String {
        try db.transaction { () throws(StoreError) -> String in
            var parents: [(row: Int64, committed: Nanos)] = []
            for id in record.parents {
                parents += try db.rows("SELECT row, committed FROM versions WHERE id = ? AND file_id = ?",
                                       [.id(id), .node(record.node)]) { ($0.int(0), $0.int(1)) }
            }
            let parent = parents.max { $0.committed < $1.committed }?.row
            try db.query("DELETE FROM versions WHERE row = ?", [.int(record.row)])
            if !local { _ = try replica.remove(record) }
            let previous = try parent.flatMap { (row) throws(StoreError) in try version(row: row) }
            let content = try parent.map { (row) throws(StoreError) in try chunkList(row: row) } ?? ChunkList()
            let showing = try db.rows("SELECT id FROM inodes WHERE head = ?", [.int(record.row)], { $0.inode(0) })
            for id in showing {
                guard var inode = try node(id)?.inode else { continue }
                inode.head = parent
                inode.size = content.totalSize
                inode.allocated = content.storedBytes
                inode.absent = absentBytes(content)
                if let previous { inode.mtime = previous.mtime }
                try save(inode)
            }
            if let fileID = record.node.fileID,
               try db.rows("SELECT 1 FROM versions WHERE file_id = ? AND local = 0 LIMIT 1", [.id(fileID)], { _ in true }).isEmpty {
                try dropHistory(fileID)
            }
            if showing.isEmpty { return "its current version still (the lost one was an older version)" }
            return previous.map { "its version \($0.id) of \(isoTime($0.committed))" } ?? "no content (it had no earlier version)"
        }
    }
}
