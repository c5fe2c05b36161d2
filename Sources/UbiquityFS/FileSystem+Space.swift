import Glibc
import UbiquityStore
import UbiquitySystem

/// Space pressure. When the store's filesystem has less free space than the policy's
/// `min-free` (default 2 %), or the store has grown past its `size-limit`, the local
/// copies of files the backing store holds go first, least recently used first
/// (FileSystem+Cache), then history goes oldest-first (Time Machine does the same): a page of the oldest versions nothing
/// protects is pruned, then gc frees their chunks, until the pressure is gone or only
/// current and conflict versions are left. Every dropped version is logged. So on a full
/// disk, deleting files frees space: their history goes first.
///
/// A reserve file (`STORE/reserve`, 16 MiB) holds back space for the moment the disk is
/// full: it is deleted then, so metadata commits, gc and unmount can still finish, and
/// made again when there is room.
extension FileSystem {
    static let reserveBytes: Int64 = 16 << 20

    /// Why the store is under pressure and how many bytes it should free (nil: it is not).
    func spacePressure() -> (reason: String, bytes: Int64)? {
        if let (free, total) = Self.freeSpace(of: store.directory) {
            let minimum = options.retention.minFree.bytes(ofFilesystem: total)
            if free < minimum {
                return ("the store's filesystem has \(byteText(free)) free, less than min-free \(byteText(minimum))", minimum - free)
            }
        }
        if let limit = options.retention.sizeLimit {
            let size = storeBytes()
            if size > limit { return ("the store holds \(byteText(size)), more than its size-limit \(byteText(limit))", size - limit) }
        }
        return nil
    }

    /// What writes can still use, from the store filesystem's `st`: its free space for
    /// this user beyond min-free (and beyond the reserve file while it is released), at
    /// most what size-limit leaves, rounded down to whole blocks of `f_bsize`. statfs
    /// reports it as `f_bavail` and the space check refuses past it, as ext4 leaves its
    /// reserved blocks out of both.
    func writableBytes(_ st: statvfs) -> Int64 {
        let unit = Int64(clamping: st.f_frsize), block = max(Int64(clamping: st.f_bsize), 1)
        let free = Int64(clamping: st.f_bavail).multipliedClamped(by: unit)
        let total = Int64(clamping: st.f_blocks).multipliedClamped(by: unit)
        var available = free.subtractingClamped(options.retention.minFree.bytes(ofFilesystem: total))
        if access(store.directory + "/reserve", F_OK) != 0 { available = available.subtractingClamped(Self.reserveBytes) }
        if let limit = options.retention.sizeLimit { available = min(available, limit.subtractingClamped(storeBytes())) }
        return max(available, 0) / block * block
    }

    /// Free bytes (for this user) and total bytes of the filesystem holding `path`, from
    /// statvfs (clamped: the kernel's numbers are unsigned).
    static func freeSpace(of path: String) -> (free: Int64, total: Int64)? {
        var fs = statvfs()
        guard statvfs(path, &fs) == 0 else { return nil }
        let unit = Int64(clamping: fs.f_frsize)
        return (Int64(clamping: fs.f_bavail).multipliedClamped(by: unit), Int64(clamping: fs.f_blocks).multipliedClamped(by: unit))
    }

    /// The store's size: its databases now, plus its chunk files as last measured (by gc,
    /// or once here when none has) and what was written since, plus the space fallocate
    /// set aside.
    func storeBytes() -> Int64 {
        let (metadata, small) = store.databaseBytes
        let put = chunks.fileBytesPut
        func measure(_ s: inout SpaceState) -> Int64? { s.chunkFiles.map { $0.addingClamped(put.subtractingClamped(s.putAtLastMeasure)) } }
        var measured = space.withLock { measure(&$0) }
        if measured == nil {
            // The last gc's measure, kept in the store: read once per mount (statfs and
            // fallocate call this; no SQL statement on their path after that).
            let setting = (try? store.setting("space")) ?? nil
            measured = space.withLock { s -> Int64? in
                if s.chunkFiles == nil { s.chunkFiles = setting.flatMap(Self.chunkFileBytes(inSpaceSetting:)) }
                return measure(&s)
            }
        }
        let files: Int64
        if let measured {
            files = measured
        } else {
            // Never measured: walk the chunk files once (then gc keeps the measure).
            files = chunks.chunkFileBytes()
            space.withLock { $0.chunkFiles = files; $0.putAtLastMeasure = put }
        }
        return metadata.addingClamped(small).addingClamped(files).addingClamped(store.reservation.bytes)
    }

    static func chunkFileBytes(inSpaceSetting text: String) -> Int64? {
        text.split(separator: " ").first { $0.hasPrefix("chunk_files=") }
            .flatMap { Int64($0.dropFirst("chunk_files=".count)) }.map { Swift.max($0, 0) }
    }

    /// Runs at mount (before the first request: the reserve is made then), from the
    /// maintenance loop (every 10 s): relieves pressure, and keeps the reserve.
    public func relieveSpacePressure(now: Nanos = nowNanos()) {
        // One at a time (the maintenance loop's, a save's that met a full disk): the
        // second sees what the first freed instead of pruning for the same need again.
        relief.withLock { _ in relieveSpacePressureAlone(now: now) }
    }

    private func relieveSpacePressureAlone(now: Nanos) {
        guard var pressure = spacePressure() else {
            collectWhatPressureDropped(now: now)
            keepReserve()
            return
        }
        releaseReserve(because: pressure.reason)
        // Local copies of what the backing store holds go before any history. (The
        // released reserve alone does not count as relief: it is for what must finish.)
        let evicted = evictLeastRecentlyUsed(now: now) { spacePressure() == nil }
        if evicted.files > 0 {
            log("ubiquity: space pressure: \(pressure.reason): evicted the local copies of \(evicted.files) file(s) "
                + "least recently used (\(byteText(evicted.bytes)); they are fetched again when read)")
            guard let still = spacePressure() else { return }
            pressure = still
        }
        log("ubiquity: space pressure: \(pressure.reason): pruning history oldest-first")
        var dropped: [Store.PrunedVersion] = [], freed: Int64 = 0, after: Int64 = 0
        var needed = pressure.bytes
        rounds: for _ in 0..<8 {
            // Prune until the dropped versions' sizes cover what is needed (they overstate
            // what gc frees, as versions share chunks; the next round makes up for it).
            var covered: Int64 = 0
            while covered < needed {
                let page: (versions: [Store.PrunedVersion], resumeAfter: Int64?)
                do {
                    page = try withMetaSlice { (_, store) throws(StoreError) in
                        let page = try store.pruneOldest(limit: 200, bytes: needed - covered, after: after)
                        try store.commitBatch()
                        return page
                    }
                } catch {
                    log("ubiquity: space pressure: pruning failed: \(error)")
                    break rounds
                }
                dropped += page.versions
                covered += page.versions.reduce(0) { $0 + $1.size }
                guard let next = page.resumeAfter else { break }
                after = next
            }
            let gc: GcReport
            do { gc = try collectGarbage(grace: options.pressureGrace) } catch {
                log("ubiquity: space pressure: gc failed: \(error)")
                break
            }
            freed += gc.bytesFreed
            guard let still = spacePressure() else { break }
            if covered == 0 { break } // nothing left to prune
            needed = still.bytes
        }
        // Chunks gc had to keep for the grace are freed by a gc once it has passed.
        if !dropped.isEmpty { space.withLock { $0.collectAfter = now + options.pressureGrace + 1_000_000_000 } }
        for v in dropped.prefix(50) {
            log("ubiquity: space pressure: dropped \(v.path) version of \(isoTime(v.committed)) (\(byteText(v.size)))")
        }
        if dropped.count > 50 { log("ubiquity: space pressure: ... and \(dropped.count - 50) more versions") }
        let still = spacePressure()
        log("ubiquity: space pressure: dropped \(dropped.count) version(s), gc freed \(byteText(freed))"
            + (still.map { "; still: \($0.reason) (only current and conflict versions are left; delete files to free space)" } ?? ""))
    }

    /// The gc that frees what pruning under pressure dropped, once gc's grace has passed.
    private func collectWhatPressureDropped(now: Nanos) {
        guard let due = space.withLock({ $0.collectAfter }), now >= due else { return }
        space.withLock { $0.collectAfter = nil }
        do {
            let gc = try collectGarbage(grace: options.pressureGrace)
            log("ubiquity: space pressure: gc after the grace freed \(byteText(gc.bytesFreed))")
        } catch {
            log("ubiquity: space pressure: gc failed: \(error)")
        }
    }

    private var reservePath: String { store.directory + "/reserve" }

    /// Runs a save (close, fsync); if it fails while the store's disk is full and the
    /// reserve is still there, relieves the pressure at once (the reserve goes first: it
    /// is for what must finish) and runs it again, rather than failing until the
    /// maintenance loop notices.
    func onFullDisk<T>(_ save: () throws(Errno) -> T) throws(Errno) -> T {
        do { return try save() } catch {
            guard access(reservePath, F_OK) == 0, let (free, _) = Self.freeSpace(of: store.directory),
                  free < Self.reserveBytes / 16 else { throw error }
            relieveSpacePressure()
            return try save()
        }
    }

    /// Deletes the reserve so what must finish can (metadata commits, unmount).
    func releaseReserve(because reason: String) {
        if Glibc.unlink(reservePath) == 0 { log("ubiquity: space pressure: released the \(byteText(Self.reserveBytes)) reserve (\(reason))") }
    }

    /// Makes the reserve when it is missing and there is room for it beyond min-free.
    private func keepReserve() {
        let path = reservePath
        var st = stat()
        if stat(path, &st) == 0 && Int64(st.st_size) == Self.reserveBytes { return }
        guard let (free, total) = Self.freeSpace(of: path.dropLastComponent),
              free > (Self.reserveBytes * 2).addingClamped(options.retention.minFree.bytes(ofFilesystem: total)) else { return }
        let fd = Glibc.open(path, O_WRONLY | O_CREAT | O_CLOEXEC, 0o600)
        guard fd >= 0 else { return }
        defer { close(fd) }
        if posix_fallocate(fd, 0, off_t(Self.reserveBytes)) != 0 { Glibc.unlink(path) }
    }
}

/// What space pressure remembers between checks (guarded by its own lock).
struct SpaceState {
    /// The chunk files' disk space when last measured (gc, or a walk when none has), and
    /// `ChunkStore.fileBytesPut` then.
    var chunkFiles: Int64?
    var putAtLastMeasure: Int64 = 0
    /// When to run the gc that frees what pruning under pressure dropped (nil: none due).
    var collectAfter: Nanos?
    /// The contents here when a walk for files to evict last ended short, and when.
    var evictionExhausted: (state: FileSystem.EvictionState, at: Nanos)?
}

private extension String {
    var dropLastComponent: String {
        guard let slash = lastIndex(of: "/") else { return "." }
        return String(self[..<slash])
    }
}
