import Glibc
import UbiquityStore
import UbiquitySystem

/// Prune and gc on a live filesystem (or a store no mount uses: the CLI builds a
/// FileSystem over it). Both work in pages, taking the metadata lock per page, so the
/// mount keeps serving reads and writes while they run.
extension FileSystem {
    public struct PruneReport: Sendable {
        public var versions: [Store.PrunedVersion] = []
        public var histories = 0
        public var bytes: Int64 { versions.reduce(0) { $0 + $1.size } }
    }

    /// Drops the versions `policy` does not keep at `now` (only those shown at `under` or
    /// below, "" for all); with `dryRun`, only says which.
    public func prune(policy: RetentionPolicy, now: Nanos, under: String = "", dryRun: Bool) throws(Errno) -> PruneReport {
        var report = PruneReport()
        var after: FileID?
        repeat {
            // Where histories are shown decides `under`: moves settled without the locks first.
            try storeCall { () throws(StoreError) in try store.settleMoves() }
            let page = try withMetaSlice { (_, store) throws(StoreError) -> Store.PruneResult in
                let result = try store.prune(policy: policy, now: now, under: under, after: after, dryRun: dryRun)
                try store.commitBatch()
                return result
            }
            report.versions += page.versions
            report.histories += page.histories
            after = page.resumeAfter
        } while after != nil
        return report
    }

    public struct GcReport: Sendable {
        public var versionsRead = 0
        public var chunksChecked = 0
        public var chunksDeleted = 0
        public var bytesFreed: Int64 = 0
        /// Content (unique chunk bytes) of the versions files show now.
        public var currentBytes: Int64 = 0
        /// Content only older versions use.
        public var historyBytes: Int64 = 0
        /// Of that, what a prune by the policy gc was given would free (with the gc after it).
        public var prunableBytes: Int64 = 0
        /// Disk space of the chunk files kept (small chunks are in their database).
        public var chunkFileBytes: Int64 = 0
        /// Unreferenced chunks kept because they were written or used within `grace`.
        public var held = GraceHeld()
        /// The grace this gc ran with.
        public var grace: Nanos = 0

        /// The store setting `space` that `ubiquity status` prints.
        func spaceSetting(at time: Nanos) -> String {
            "measured=\(time) current=\(currentBytes) history=\(historyBytes) prunable=\(prunableBytes) chunk_files=\(chunkFileBytes)"
        }
    }

    /// How long a chunk nobody names is kept after it was last written or claimed: covers
    /// a commit that claimed chunks and has not recorded its version yet, and readers of a
    /// version pruned while they read it.
    public static let gcGrace: Nanos = 3_600 * 1_000_000_000
    /// The least grace gc uses, whatever it is asked for (`--grace 0s` means this).
    public static let minimumGrace: Nanos = 1_000_000_000

    /// Deletes the chunks no version names and nobody wrote or claimed within `grace`.
    /// `progress(phase, done, total)` is called now and then.
    /// With `policy`, it also measures what a prune by it would free (a dry run first).
    public func collectGarbage(grace: Nanos = FileSystem.gcGrace, policy: RetentionPolicy? = nil,
                               progress: ((String, Int, Int) -> Void)? = nil) throws(Errno) -> GcReport {
        var report = GcReport()
        var prunable: Set<Int64> = []
        if let policy {
            progress?("measuring what prune would free", 0, 1)
            let now = meta.withLock { $1.clock() }
            prunable = Set(try prune(policy: policy, now: now, dryRun: true).versions.map(\.row))
        }
        // The mark reads the versions' reader, without the filesystem's or the store's
        // lock; each page after the index was brought up to it (`prepareVersionReads`), so
        // a page sees every save made before it, as a read through the gate did.
        let versions = store.versions
        func upToNow() throws(Errno) { try storeCall { () throws(StoreError) in try store.prepareVersionReads() } }
        var current: Set<Int64> = [], inode: InodeNumber? = .zero
        while let after = inode {
            try upToNow()
            inode = try storeCall { () throws(StoreError) in try versions.currentVersionRows(afterInode: after, limit: 2_000, into: &current) }
        }
        let putAtStart = chunks.fileBytesPut
        let markStart = nowNanos()
        let total = try storeCall { () throws(StoreError) in try versions.versionRowCount() }
        var marked: Set<ChunkID> = []
        // Chunks open files and views read from (a pruned version's view stays readable).
        // Their content locks come before the metadata lock (FileSystem.swift), so the
        // contents are read after it is released.
        let open = meta.withLock { m, _ in
            m.handles.values.compactMap { handle -> FileContent? in
                switch handle {
                case .file(_, let open, _): return open.content
                case .view(let content): return content
                case .directory, .keyValue: return nil
                }
            }
        }
        for content in open { marked.formUnion(content.baseChunks) }
        // For the space report: each chunk's size, and which chunks the current versions,
        // the versions a prune keeps and the ones it drops name.
        var sizes: [ChunkID: Int] = [:]
        var shown: Set<ChunkID> = [], kept: Set<ChunkID> = [], dropped: Set<ChunkID> = []
        var after: Int64 = 0
        while true {
            // The reader's lock is held only to read a page of chunk lists; the sets are
            // filled after it is released.
            var lists: [(row: Int64, list: ChunkList)] = []
            try upToNow()
            let page = try storeCall { () throws(StoreError) -> (last: Int64, rows: Int)? in
                try versions.markChunks(afterRow: after, limit: 500) { row, list in lists.append((row, list)) }
            }
            guard let page else { break }
            for (row, list) in lists {
                // Inline chunks (store format 14) are content too, in the space report, but
                // nothing in the chunk store keeps them.
                for i in 0..<list.count where !list.isHole(i) {
                    let id = list.ids[i]
                    if !list.isInline(i) { marked.insert(id) }
                    sizes[id] = Int(list.size(i))
                    if current.contains(row) {
                        shown.insert(id)
                    } else if prunable.contains(row) {
                        dropped.insert(id)
                    } else {
                        kept.insert(id)
                    }
                }
            }
            report.versionsRead += page.rows
            progress?("marking", min(report.versionsRead, total), total)
            after = page.last
        }
        let ids = chunks.allChunkIDs()
        // At least a second: the kernel stamps file times with a coarse clock, so a chunk
        // claimed just after the mark began may carry a time a little before it.
        let margin = max(grace, Self.minimumGrace)
        let unusedSince = markStart.subtractingClamped(margin)
        report.grace = margin
        // In batches: the small chunks' rows of a batch go in one transaction, which a
        // save's small chunk waits for; 128 rows keep that wait short.
        var start = 0
        while start < ids.count {
            let batch = ids[start..<min(start + 128, ids.count)]
            report.chunksChecked += batch.count
            let freed = chunks.sweep(batch.filter { !marked.contains($0) }, unusedSince: unusedSince, held: &report.held)
            report.chunksDeleted += freed.count
            report.bytesFreed += freed.values.reduce(0, +)
            start += batch.count
            progress?("sweeping", start, ids.count)
            chunks.yieldToWaiters() // saves and readers of small chunks wait for the same lock
        }
        if report.chunksDeleted > 0 { try storeCall { () throws(StoreError) in try chunks.compact() } }
        // The metadata's free pages, a step per hold of the filesystem's lock.
        while try withMetaSlice({ (_, store) throws(StoreError) in try store.compactDatabaseStep() }) {}
        func bytes(_ set: Set<ChunkID>) -> Int64 { set.reduce(0) { $0 + Int64(sizes[$1] ?? 0) } }
        report.currentBytes = bytes(shown)
        report.historyBytes = bytes(kept.union(dropped).subtracting(shown))
        report.prunableBytes = bytes(dropped.subtracting(shown).subtracting(kept))
        report.chunkFileBytes = chunks.chunkFileBytes()
        let setting = report.spaceSetting(at: nowNanos())
        try withMeta { (_, store) throws(StoreError) in try store.setSetting("space", setting) }
        space.withLock { $0.chunkFiles = report.chunkFileBytes; $0.putAtLastMeasure = putAtStart }
        return report
    }
}

// MARK: control through the mount root (`ubiquity prune`, `ubiquity gc`)

/// What maintenance reports on the mount root: `user.ubiquity.prune` and
/// `user.ubiquity.gc` hold the last run's report, or `<command>: running ...` (with gc's
/// progress) while one runs.
struct MaintenanceReports {
    var prune = ""
    var gc = ""
    /// Runs started through the control attribute, by command (one at a time each); the
    /// filesystem joins them before it stops (`drain`).
    var jobs: [String: JoinableThread] = [:]
    var running: Set<String> = []
}

extension FileSystem {
    public static let pruneAttribute = "user.ubiquity.prune"
    public static let gcAttribute = "user.ubiquity.gc"

    /// Reads of the maintenance reports, answered without the metadata lock.
    func maintenanceReport(_ ino: InodeNumber, name: String) -> [UInt8]? {
        guard ino == Store.rootInode else { return nil }
        switch name {
        case Self.pruneAttribute: return Array(reports.withLock { $0.prune }.utf8)
        case Self.gcAttribute: return Array(reports.withLock { $0.gc }.utf8)
        default: return nil
        }
    }

    /// `prune [dry-run] [keep-within=D] [keep-deleted-within=D] [path=P]` (the path last:
    /// it may hold spaces) and `gc [grace=D]`, written to the control attribute. The run
    /// starts in a thread of its own and the write returns at once: while a setxattr is
    /// answered the kernel holds the mount root's inode lock, so a run answered when done
    /// would stall every path lookup through the root for all of it (seconds, for a gc of
    /// many chunks). The report attribute says when it is done. EBUSY while one runs. False for
    /// text that is not a maintenance command.
    func maintenanceControl(_ text: String) throws(Errno) -> Bool {
        var text = Substring(text)
        var path = ""
        if let at = text.firstRange(of: " path=") {
            path = String(text[at.upperBound...])
            text = text[..<at.lowerBound]
        }
        let words = text.split(separator: " ").map(String.init)
        guard let command = words.first, command == "prune" || command == "gc" else { return false }
        if command == "gc" && !path.isEmpty { throw .invalid }
        var options: [String: String] = [:]
        for word in words.dropFirst() {
            let parts = word.split(separator: "=", maxSplits: 1).map(String.init)
            options[parts[0]] = parts.count == 2 ? parts[1] : ""
        }
        if command == "gc" {
            var grace = Self.gcGrace
            if let text = options.removeValue(forKey: "grace") {
                guard let d = RetentionPolicy.duration(text) else { throw .invalid }
                grace = d
            }
            guard options.isEmpty else { throw .invalid }
            try startJob("gc") { [self, grace] () throws(Errno) -> String in
                let progress = { @Sendable [reports] (phase: String, done: Int, total: Int) in
                    reports.withLock { $0.gc = "gc: running: \(phase) \(done)/\(total)\n" }
                }
                let local = try collectGarbage(grace: grace, policy: self.options.retention, progress: progress).summary
                return local + "\n" + collectBacking(progress: progress)
            }
            return true
        }
        var policy = self.options.retention
        let dryRun = options.removeValue(forKey: "dry-run") != nil
        func duration(_ key: String) throws(Errno) -> Nanos? {
            guard let value = options.removeValue(forKey: key) else { return nil }
            guard let d = RetentionPolicy.duration(value) else { throw .invalid }
            return d
        }
        policy.apply(keepWithin: try duration("keep-within"), keepDeletedWithin: try duration("keep-deleted-within"))
        guard options.isEmpty else { throw .invalid }
        let now = meta.withLock { $1.clock() }
        try startJob("prune") { [self, policy, path] () throws(Errno) -> String in
            try prune(policy: policy, now: now, under: path, dryRun: dryRun).text(dryRun: dryRun, limit: 400)
        }
        return true
    }

    /// Runs `body` in a thread of its own; its report (or `<command>: failed: ...`) goes
    /// to the command's attribute when it ends.
    private func startJob(_ command: String, _ body: @escaping @Sendable () throws(Errno) -> String) throws(Errno) {
        let reports = self.reports
        @Sendable func set(_ r: inout MaintenanceReports, _ text: String) {
            if command == "gc" { r.gc = text } else { r.prune = text }
        }
        try reports.withLock { (r) throws(Errno) in
            guard !r.running.contains(command) else { throw Errno(EBUSY) }
            r.running.insert(command)
            set(&r, "\(command): running\n")
            r.jobs[command]?.join() // the previous run, ended already
            r.jobs[command] = JoinableThread {
                lowerThreadPriority()
                let text: String
                do throws(Errno) { text = try body() } catch { text = "\(command): failed: \(errnoText(error.code))\n" }
                reports.withLock { r in
                    set(&r, text.hasSuffix("\n") ? text : text + "\n")
                    r.running.remove(command)
                }
            }
        }
    }

    /// Waits for the runs started through the control attribute (before the store closes).
    func joinMaintenanceJobs() {
        let jobs = reports.withLock { r in defer { r.jobs = [:] }; return Array(r.jobs.values) }
        for job in jobs { job.join() }
    }
}

extension FileSystem {
    /// The backing directory's half of gc, when the mount syncs: its report line (or why
    /// it did not run: a gc that freed the store's space has succeeded even when the
    /// backing directory is offline).
    func collectBacking(progress: ((String, Int, Int) -> Void)? = nil) -> String {
        guard let sync = hooks.withLock({ $0.sync }) else { return "backing directory: none (this mount does not sync)" }
        do {
            return try sync.collectBacking(now: Int64(time(nil)), progress: progress.map { p in { p("backing: " + $0, $1, $2) } })
        } catch {
            log("ubiquity: gc of the backing directory: \(error)")
            return "backing directory: not collected: \(error)"
        }
    }
}

extension FileSystem.GcReport {
    public var summary: String {
        var text = "gc: read \(versionsRead) versions, checked \(chunksChecked) chunks, deleted \(chunksDeleted) (\(byteText(bytesFreed)) freed); "
            + "content: \(byteText(currentBytes)) current, \(byteText(historyBytes)) only in history, "
            + "\(byteText(prunableBytes)) of it prunable by the retention policy"
        if let line = graceLine { text += "\n" + line }
        return text
    }

    /// What the grace held back, and when a gc frees it: nil when it held nothing.
    public var graceLine: String? {
        guard held.chunks > 0 else { return nil }
        let chunkWord = held.chunks == 1 ? "chunk" : "chunks"
        let window = RetentionPolicy.durationText(grace)
        let freeAfter = held.lastUse == .max ? "a gc once their times are in the past" : "a gc after \(isoTime(held.lastUse.addingClamped(grace)))"
        return "gc: \(held.chunks) \(chunkWord) (\(byteText(held.bytes))) unreferenced but written or used in the last \(window): "
            + "\(freeAfter) frees them, or now with `--grace 1s`"
    }
}

extension FileSystem.PruneReport {
    /// The report `ubiquity prune` prints: a summary line, then up to `limit` versions.
    public func text(dryRun: Bool, limit: Int) -> String {
        let verb = dryRun ? "would prune" : "pruned"
        var lines = ["\(verb) \(versions.count) version(s), \(byteText(bytes)) of file content"
            + (histories > 0 ? "; \(histories) deleted file(s) gone from .versions/" : "")
            + (dryRun ? "" : " (gc frees what no other version shares)")]
        for v in versions.sorted(by: { ($0.path, $0.committed) < ($1.path, $1.committed) }).prefix(limit) {
            lines.append("  \(v.path)  \(isoTime(v.committed))  \(byteText(v.size))")
        }
        if versions.count > limit { lines.append("  ... and \(versions.count - limit) more") }
        return lines.joined(separator: "\n") + "\n"
    }
}


extension FileSystem {
    /// Gives the metadata database's free pages back to the filesystem when there are many
    /// (`Store.hasMuchFreeSpace`), a step of 32 pages per hold of the lock (the maintenance
    /// loop, every 10 s).
    public func compactIfMuchFree() {
        do {
            guard try withMeta({ (_, store) throws(StoreError) in try store.hasMuchFreeSpace() }) else { return }
            while try withMetaSlice({ (_, store) throws(StoreError) in try store.compactDatabaseStep() }) {}
        } catch {
            log("ubiquity: giving free pages of the store back: \(error)")
        }
    }

    /// The daemon's own prune and gc, once per `Options.maintenanceInterval` (the time of
    /// the last run is kept in the store, so short sessions add up). Logs what it did.
    public func maintainIfDue(now: Nanos = nowNanos()) {
        let interval = options.maintenanceInterval
        guard interval > 0 else { return }
        let last: Nanos?
        do {
            last = try withMeta { (_, store) throws(StoreError) -> Nanos? in
                guard let last = try store.setting("last_maintenance").flatMap({ Nanos($0) }) else {
                    try store.setSetting("last_maintenance", String(now)) // a first mount: one interval from now
                    return nil
                }
                return last
            }
        } catch {
            log("ubiquity: maintenance: \(error)")
            return
        }
        guard let last, RetentionPolicy.age(last, now: now) >= interval else { return }
        do {
            let pruned = try prune(policy: options.retention, now: meta.withLock { $1.clock() }, dryRun: false)
            reports.withLock { $0.prune = pruned.text(dryRun: false, limit: 400) }
            let gc = try collectGarbage(policy: options.retention).summary + "\n" + collectBacking()
            reports.withLock { $0.gc = gc + "\n" }
            log("ubiquity: maintenance: \(pruned.text(dryRun: false, limit: 0).trimmingWhitespace); \(gc)")
        } catch {
            log("ubiquity: maintenance: \(error)")
        }
        do {
            try withMeta { (_, store) throws(StoreError) in try store.setSetting("last_maintenance", String(now)) }
        } catch {
            log("ubiquity: maintenance: \(error)")
        }
    }
}
