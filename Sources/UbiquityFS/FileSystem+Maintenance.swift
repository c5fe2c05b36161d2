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
        var after: String?
        repeat {
            let page = try withMeta { (m) throws(StoreError) -> Store.PruneResult in
                let result = try m.store.prune(policy: policy, now: now, under: under, after: after, dryRun: dryRun)
                try m.store.commitBatch()
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
    }

    /// How long a chunk nobody names is kept after it was last written or claimed: covers
    /// a commit that claimed chunks and has not recorded its version yet, and readers of a
    /// version pruned while they read it.
    public static let gcGrace: Nanos = 3_600 * 1_000_000_000

    /// Deletes the chunks no version names and nobody wrote or claimed within `grace`.
    /// `progress(phase, done, total)` is called now and then.
    public func collectGarbage(grace: Nanos = FileSystem.gcGrace,
                               progress: ((String, Int, Int) -> Void)? = nil) throws(Errno) -> GcReport {
        var report = GcReport()
        let markStart = nowNanos()
        let total = meta.withLock { $0.store.versionRowCount }
        var marked: Set<ChunkID> = []
        // Chunks open files and views read from (a pruned version's view stays readable).
        meta.withLock { m in
            for case .file(_, let open, _) in m.handles.values { marked.formUnion(open.content.baseChunks) }
            for case .view(let content) in m.handles.values { marked.formUnion(content.baseChunks) }
        }
        var after: Int64 = 0
        while true {
            let last = try withMeta { (m) throws(StoreError) -> Int64? in
                try m.store.markChunks(afterRow: after, limit: 2_000, into: &marked)
            }
            guard let last else { break }
            report.versionsRead += 2_000
            progress?("marking", min(report.versionsRead, total), total)
            after = last
        }
        report.versionsRead = min(report.versionsRead, total)
        let ids = chunks.allChunkIDs()
        let unusedSince = markStart.subtractingReportingOverflow(grace).overflow ? .min : markStart - grace
        for (i, id) in ids.enumerated() {
            report.chunksChecked += 1
            if !marked.contains(id), let freed = chunks.sweep(id, unusedSince: unusedSince) {
                report.chunksDeleted += 1
                report.bytesFreed += freed
            }
            if i % 4096 == 0 || i == ids.count - 1 { progress?("sweeping", i + 1, ids.count) }
        }
        return report
    }
}
