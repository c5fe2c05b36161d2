import Testing
@testable import UbiquityFS
@testable import UbiquityStore

@Suite struct VersionNameTests {
    /// Regression: two versions committed in the same millisecond were told apart by the
    /// first 8 digits of their ids, which since ids begin with the time (`ID128.new`) are
    /// the same for both: two entries of `.versions/` had one name.
    @Test func versionsOfOneMillisecondGetDistinctNames() {
        // Ids as `ID128.new` makes them in one millisecond: the same first 12 digits.
        let ids = [0x1111, 0x2222, 0x3333].map { VersionID(ID128(high: 0x019a_c3f0_1234_0000 | $0, low: UInt64($0) * 77)) }
        let versions = ids.map { id in
            Version(row: 1, id: id, node: .file(.zero), parents: [], deviceID: DeviceID(hex: "0123456789abcdef")!, deviceName: "laptop",
                    committed: 1_795_800_000_123_000_000, mtime: 0, mode: 0o644, size: 0, isTombstone: false, isLocal: false,
                    path: "a.txt")
        }
        let names = VersionName.names(versions, extension: ".txt")
        #expect(Set(names).count == 3, "\(names)")
        #expect(names[0] == "2026-11-27T17.20.00.123Z@laptop.txt")
        #expect(names[1] == "2026-11-27T17.20.00.123Z@laptop~000000.txt")
        #expect(names[2] == "2026-11-27T17.20.00.123Z@laptop~000000-\(ids[2].hex.suffix(8)).txt")
    }

    /// Saves fast enough to share a millisecond: the names sort in commit order, whatever
    /// the ids (the suffix is the nanoseconds within the millisecond, not the id).
    @Test func versionsOfOneMillisecondSortInCommitOrder() {
        let ids = [0x9999, 0x5555, 0x1111].map { VersionID(ID128(high: 0x019a_c3f0_1234_0000 | $0, low: UInt64($0))) }
        let versions = ids.enumerated().map { i, id in
            Version(row: Int64(i), id: id, node: .file(.zero), parents: [], deviceID: DeviceID(hex: "0123456789abcdef")!,
                    deviceName: "laptop", committed: 1_795_800_000_123_000_000 + Int64(i) * 40_000, mtime: 0, mode: 0o644,
                    size: 0, isTombstone: false, isLocal: false, path: "a.txt")
        }
        let names = VersionName.names(versions, extension: ".txt")
        #expect(names == names.sorted(), "\(names)")
        #expect(names[2] == "2026-11-27T17.20.00.123Z@laptop~080000.txt")
    }
}
