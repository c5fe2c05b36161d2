import Glibc
import UbiquityStore

/// Names shown under `.versions/<path>/`: `2026-11-22T13.45.01.123Z@laptop.txt`. They sort
/// by commit time and keep the file's extension so viewers still recognise the type.
enum VersionName {
    static func make(_ version: Version, extension ext: String) -> String {
        var seconds = time_t(version.committed / 1_000_000_000)
        var parts = tm()
        gmtime_r(&seconds, &parts)
        let millis = Int(version.committed / 1_000_000 % 1000)
        let stamp = String(format4(Int(parts.tm_year) + 1900)) + "-" + pad2(Int(parts.tm_mon) + 1) + "-" + pad2(Int(parts.tm_mday))
            + "T" + pad2(Int(parts.tm_hour)) + "." + pad2(Int(parts.tm_min)) + "." + pad2(Int(parts.tm_sec))
            + "." + pad3(millis) + "Z"
        return stamp + "@" + safeDevice(version.deviceName) + ext
    }

    /// Names for a history's versions (oldest first); a name that repeats (two commits in
    /// one millisecond) gets the commit's nanoseconds within that millisecond appended
    /// (six digits), so the names still sort in commit order, and, should those repeat too,
    /// the version id's last 8 digits, so each is unique and stable. Not the id's first:
    /// ids begin with the time in milliseconds (`ID128.new`), which such versions share.
    static func names(_ versions: [Version], extension ext: String) -> [String] {
        var seen: Set<String> = []
        return versions.map { v in
            var name = make(v, extension: ext)
            if seen.contains(name) {
                let base = String(name.dropLast(ext.count)) + "~" + pad6(Int(v.committed % 1_000_000))
                name = base + ext
                if seen.contains(name) { name = base + "-" + v.id.hex.suffix(8) + ext }
            }
            seen.insert(name)
            return name
        }
    }

    private static func pad6(_ n: Int) -> String {
        let digits = String(max(0, n))
        return String(repeating: "0", count: max(0, 6 - digits.count)) + digits
    }

    /// The millisecond (since the epoch) a version name starts with, or nil when the name
    /// does not start with a stamp `make` writes (a lookup then lists the history).
    static func millisecond(of name: String) -> Int64? {
        // YYYY-MM-DDTHH.MM.SS.mmmZ@
        let b = Array(name.utf8.prefix(25))
        guard b.count == 25, b[4] == 0x2D, b[7] == 0x2D, b[10] == 0x54, b[13] == 0x2E, b[16] == 0x2E, b[19] == 0x2E,
              b[23] == 0x5A, b[24] == 0x40 else { return nil }
        func number(_ range: Range<Int>) -> Int32? {
            var value: Int32 = 0
            for i in range {
                guard b[i] >= 0x30 && b[i] <= 0x39 else { return nil }
                value = value * 10 + Int32(b[i] - 0x30)
            }
            return value
        }
        guard let year = number(0..<4), let month = number(5..<7), let day = number(8..<10), let hour = number(11..<13),
              let minute = number(14..<16), let second = number(17..<19), let millis = number(20..<23) else { return nil }
        var parts = tm()
        parts.tm_year = year - 1900; parts.tm_mon = month - 1; parts.tm_mday = day
        parts.tm_hour = hour; parts.tm_min = minute; parts.tm_sec = second
        let seconds = timegm(&parts)
        return Int64(seconds) * 1000 + Int64(millis)
    }

    /// The extension of a path's last component, with its dot ("" if none).
    static func fileExtension(_ path: String) -> String {
        let name = path.split(separator: "/").last.map(String.init) ?? path
        guard let dot = name.lastIndex(of: "."), dot != name.startIndex else { return "" }
        return String(name[dot...])
    }

    private static func safeDevice(_ name: String) -> String {
        String(name.map { $0 == "/" || $0 == "\0" ? "_" : $0 }.prefix(64))
    }
    private static func pad2(_ n: Int) -> String { n < 10 ? "0\(n)" : "\(n)" }
    private static func pad3(_ n: Int) -> String { n < 10 ? "00\(n)" : n < 100 ? "0\(n)" : "\(n)" }
    private static func format4(_ n: Int) -> String { n < 1000 ? String(repeating: "0", count: 4 - String(n).count) + "\(n)" : "\(n)" }
}
