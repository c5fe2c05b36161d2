import Glibc
import UbiquityStore
import UbiquitySystem

/// Collects the backing directory's objects (backing format 4, docs/FORMAT.md "Collecting
/// the backing directory"), with no server and no lock any device must wait for: after
/// Duplicacy's two-step "fossil collection", an object no journal names is first renamed
/// to a fossil, and only deleted when it has been a fossil for `fossilAge` and still no
/// journal names it. Whoever needs it meanwhile finds it again: readers read fossils,
/// writers upload it again (they look for the exact name), and the next run renames back
/// every fossil a journal names.
struct BackingCollector {
    let backing: Backing
    /// Seconds an object must exist before it may become a fossil: a device writes its
    /// objects before the records that name them, and may be in between.
    var objectGrace: Int64 = 86_400
    /// Seconds a fossil waits before it is deleted: far longer than any device takes
    /// from checking that an object is there to appending the record that names it (the
    /// engine checks again if that took over an hour: `SyncEngine.Options.objectCheckValidity`).
    var fossilAge: Int64 = 7 * 86_400

    struct Report: Sendable {
        var journals = 0
        var records = 0
        var referenced = 0
        var objects = 0
        var fossilized = 0
        var restored = 0
        var deleted = 0
        var bytesDeleted: Int64 = 0
        var fossils = 0
        var tempsDeleted = 0

        var summary: String {
            if journals == 0 && objects == 0 { return "no objects to collect (small files travel in their records)" }
            return "read \(records) records in \(journals) journals (\(referenced) objects named); checked \(objects) objects: "
                + "\(fossilized) became fossils, \(restored) fossils named again were restored, "
                + "\(deleted) fossils deleted (\(byteText(bytesDeleted)) freed), \(fossils) fossils wait"
                + (tempsDeleted > 0 ? "; \(tempsDeleted) unfinished uploads removed" : "")
        }
    }

    /// One run. `now` in seconds since the epoch. Throws without deleting anything if a
    /// journal cannot be read (its references would be missing).
    func run(now: Int64, progress: ((String, Int, Int) -> Void)? = nil) throws(StoreError) -> Report {
        let lockPath = backing.directory + "/gc.lock"
        let lock = open(lockPath, O_RDWR | O_CREAT | O_CLOEXEC, 0o644)
        if lock < 0 { throw .io(errno: errno, "open \(lockPath)") }
        defer { close(lock) }
        // Two runs at once would only repeat each other's renames; the lock saves the work.
        // A shared directory without flock (some network filesystems) runs unlocked.
        if flock(lock, LOCK_EX | LOCK_NB) != 0 && errno == EWOULDBLOCK {
            throw .io(errno: EBUSY, "another gc of \(backing.directory) is running (gc.lock)")
        }
        var report = Report()
        let prefixes = try backing.list(backing.directory + "/objects")
            .filter { $0.utf8.count == 2 && Hex.isLowercase($0, count: 2) }.sorted()
        // A container of small files has no objects (their chunks travel in the records):
        // then there is nothing to collect and the journals need not be read.
        guard prefixes.contains(where: { !((try? directoryEntries(backing.directory + "/objects/" + $0))?.isEmpty ?? true) }) else {
            return report
        }
        let referenced = try references(&report, progress: progress)
        report.referenced = referenced.count
        for (i, prefix) in prefixes.enumerated() {
            try collect(backing.directory + "/objects/" + prefix, referenced: referenced, now: now, into: &report)
            progress?("collecting objects", i + 1, prefixes.count)
        }
        return report
    }

    /// Every object some journal line names (chunks not carried inline). Reads every
    /// generation present; one that vanishes while read was rewritten by its device, whose
    /// directory is then listed again.
    private func references(_ report: inout Report, progress: ((String, Int, Int) -> Void)?) throws(StoreError) -> Set<ChunkID> {
        var referenced: Set<ChunkID> = []
        let devices = try backing.list(backing.directory + "/devices").filter { Hex.isLowercase($0, count: 16) }.sorted()
        for (i, device) in devices.enumerated() {
            var done: Set<Int64> = []
            listing: while true {
                let generations = try backing.generations(of: device).filter { !done.contains($0) }
                if generations.isEmpty { break listing }
                for generation in generations {
                    var offset: Int64 = 0
                    while true {
                        guard let batch = try backing.lines(of: device, generation: generation, from: offset) else {
                            done.insert(generation)
                            continue listing
                        }
                        for line in batch.lines {
                            guard case .success(let record) = RecordCodec.decode(line.bytes, journalDevice: device) else { continue }
                            report.records += 1
                            for (id, _) in record.chunks.chunks where record.inline[id] == nil { referenced.insert(id) }
                        }
                        offset = batch.end
                        if batch.atEnd { break }
                    }
                    done.insert(generation)
                    report.journals += 1
                }
            }
            progress?("reading journals", i + 1, devices.count)
        }
        return referenced
    }

    private func collect(_ dir: String, referenced: Set<ChunkID>, now: Int64, into report: inout Report) throws(StoreError) {
        let names: [String]
        do { names = try directoryEntries(dir) } catch { return } // not a directory: ignored
        let present = Set(names)
        for name in names {
            let path = dir + "/" + name
            if let id = ChunkID(hex: name) {
                report.objects += 1
                guard !referenced.contains(id), let age = age(path, now: now), age >= objectGrace else { continue }
                try move(path, to: path + Backing.fossilMark + String(now))
                report.fossilized += 1
                report.fossils += 1
            } else if let range = name.firstRange(of: Backing.fossilMark), let id = ChunkID(hex: String(name[..<range.lowerBound])),
                      let stamp = Int64(name[range.upperBound...]) {
                let original = dir + "/" + String(name[..<range.lowerBound])
                if referenced.contains(id) {
                    if present.contains(String(name[..<range.lowerBound])) {
                        try remove(path) // uploaded again meanwhile
                    } else {
                        try move(path, to: original)
                    }
                    report.restored += 1
                } else if now.subtractingClamped(max(stamp, changed(path) ?? stamp)) >= fossilAge {
                    // Aged by the later of the stamp (the renaming device's clock) and the
                    // rename's ctime (the shared filesystem's): one clock far behind does
                    // not shorten the week.
                    var st = stat()
                    let size = stat(path, &st) == 0 ? Int64(st.st_size) : 0
                    try remove(path)
                    report.deleted += 1
                    report.bytesDeleted = report.bytesDeleted.addingClamped(size)
                } else {
                    report.fossils += 1
                }
            } else if name.hasPrefix(".tmp-"), let age = age(path, now: now), age >= objectGrace {
                try remove(path) // an upload that never finished
                report.tempsDeleted += 1
            }
        }
    }

    private func age(_ path: String, now: Int64) -> Int64? {
        var st = stat()
        guard stat(path, &st) == 0 else { return nil }
        return now.subtractingClamped(Int64(st.st_mtim.tv_sec))
    }

    private func changed(_ path: String) -> Int64? {
        var st = stat()
        return stat(path, &st) == 0 ? Int64(st.st_ctim.tv_sec) : nil
    }

    private func move(_ from: String, to: String) throws(StoreError) {
        if rename(from, to) != 0 && errno != ENOENT { throw .io(errno: errno, "rename \(from)") }
    }

    private func remove(_ path: String) throws(StoreError) {
        if unlink(path) != 0 && errno != ENOENT { throw .io(errno: errno, "unlink \(path)") }
    }
}
