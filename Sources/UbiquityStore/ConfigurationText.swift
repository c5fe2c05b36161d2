/// The text form of the per-container configuration files (retention, key-value limits):
/// `key = value` lines, `#` starts a comment, blank lines are skipped. Returns each
/// setting with its line number; a line that is not `key = value` is an error naming it.
public func configurationSettings(_ text: String) throws(StoreError) -> [(line: Int, key: String, value: String)] {
    var settings: [(line: Int, key: String, value: String)] = []
    for (number, raw) in text.split(separator: "\n", omittingEmptySubsequences: false).enumerated() {
        let line = raw.split(separator: "#", maxSplits: 1, omittingEmptySubsequences: false).first.map(String.init) ?? ""
        let trimmed = line.trimmingASCIISpace
        if trimmed.isEmpty { continue }
        let parts = trimmed.split(separator: "=", maxSplits: 1).map { String($0).trimmingASCIISpace }
        guard parts.count == 2 else { throw .invalidConfiguration("line \(number + 1): expected `key = value`, found `\(trimmed)`") }
        settings.append((number + 1, parts[0], parts[1]))
    }
    return settings
}

extension String {
    /// Without leading and trailing spaces, tabs and line ends (compared as bytes, so a
    /// CRLF line end goes too).
    var trimmingASCIISpace: String {
        let u = Array(utf8)
        let space: (UInt8) -> Bool = { $0 == 0x20 || $0 == 0x09 || $0 == 0x0A || $0 == 0x0D }
        guard let first = u.firstIndex(where: { !space($0) }), let last = u.lastIndex(where: { !space($0) }) else { return "" }
        return String(decoding: u[first...last], as: UTF8.self)
    }
}
