import UbiquitySystem

/// The ranges fallocate reserved in a file (store format 9, table `reserves`): local
/// allocation state, never synced or versioned, like ext4's unwritten extents. They count
/// in st_blocks while they are holes; a file's row goes with the inode, and with content
/// another device replaced.
extension Store {
    /// The file's reserved ranges. The table is small (a row per file with a reserve not
    /// written yet), so it is held in memory: opening a file reads no SQLite. A row that
    /// does not parse (it never should: this program writes them) is logged and read as
    /// none, not trusted.
    public func reservedRanges(_ id: InodeNumber) throws(StoreError) -> [Range<Int64>] {
        if let reserves { return reserves[id] ?? [] }
        var loaded: [InodeNumber: [Range<Int64>]] = [:]
        for (inode, text) in try db.rows("SELECT inode, ranges FROM reserves", [], { ($0.inode(0), $0.text(1)) }) {
            // Kept as none, so the row still goes with its file.
            guard let ranges = Self.decodeRanges(text) else {
                log("ubiquity: inode \(inode): unreadable reserved ranges '\(text.prefix(80))' ignored")
                loaded[inode] = []
                continue
            }
            loaded[inode] = ranges
        }
        reserves = loaded
        return loaded[id] ?? []
    }

    public func setReservedRanges(_ id: InodeNumber, _ ranges: [Range<Int64>]) throws(StoreError) {
        if ranges.isEmpty {
            try dropReservedRanges(id)
        } else {
            try db.query("REPLACE INTO reserves(inode, ranges) VALUES(?, ?)",
                         [.inode(id), .text(ranges.map { "\($0.lowerBound)-\($0.upperBound)" }.joined(separator: ","))])
            reserves?[id] = ranges
        }
    }

    func dropReservedRanges(_ id: InodeNumber) throws(StoreError) {
        // Most files have none: nothing to delete, and no statement.
        if let reserves, reserves[id] == nil { return }
        try db.query("DELETE FROM reserves WHERE inode = ?", [.inode(id)])
        releaseReserve(id)
    }

    /// Lets go of inode `id`'s reserve in memory and in the reservation file, once its row
    /// is deleted (here, or by the index as it drops the inode).
    func releaseReserve(_ id: InodeNumber) {
        reserves?[id] = nil
        reservation.release(id)
    }

    /// The reserved holes of every file with a reserve, as committed (the mount sizes the
    /// reservation file to them: `SpaceReservation.start`).
    public func reservedHoleLevels() throws(StoreError) -> [InodeNumber: Int64] {
        _ = try reservedRanges(Self.rootInode) // the table in memory, read once
        var levels: [InodeNumber: Int64] = [:]
        for id in (reserves ?? [:]).keys { levels[id] = try openContent(id).reservedHoleBytes }
        return levels
    }

    /// "a-b,c-d": sorted, disjoint, non-empty ranges within 0...maxFileSize; nil otherwise.
    static func decodeRanges(_ text: String) -> [Range<Int64>]? {
        var out: [Range<Int64>] = []
        for item in text.split(separator: ",", omittingEmptySubsequences: false) {
            let parts = item.split(separator: "-", omittingEmptySubsequences: false)
            guard parts.count == 2, let lower = Int64(parts[0]), let upper = Int64(parts[1]),
                  lower >= 0, lower < upper, upper <= maxFileSize, lower >= (out.last?.upperBound ?? 0) else { return nil }
            out.append(lower..<upper)
        }
        return out.isEmpty ? nil : out
    }
}
