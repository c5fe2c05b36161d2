import Glibc

/// Which paths are local-only: stored, never kept as history, never synced (DESIGN §1.1).
/// One rule, used for every decision about it.
public enum LocalOnly {
    /// `path` is relative to the container root ("a/b/c"). Compared as UTF-8 bytes: every
    /// suffix and prefix here is ASCII, and a create asks this on its request path.
    public static func contains(_ path: String) -> Bool {
        var path = path
        return path.withUTF8 { bytes in
            var start = 0, last: Range<Int>? = nil
            for i in 0...bytes.count where i == bytes.count || bytes[i] == UInt8(ascii: "/") {
                defer { start = i + 1 }
                guard i > start else { continue }
                if UnsafeBufferPointer(rebasing: bytes[start..<i]).ends(with: ".nosync") { return true }
                last = start..<i
            }
            return last.map { isEditorScratch(UnsafeBufferPointer(rebasing: bytes[$0])) } ?? false
        }
    }

    /// Whether every path below directory `path` is local-only (a name on the way ends in
    /// `.nosync`): a file's own name decides the rest, so a directory's move leaves every
    /// file below as it was when this is the same at both paths.
    public static func coversBelow(_ path: String) -> Bool { contains(path.isEmpty ? "_" : path + "/_") }

    /// vim swap files and its write test file `4913`, backup files, Emacs lock files,
    /// GNOME's atomic-save temp files.
    static func isEditorScratch(_ name: UnsafeBufferPointer<UInt8>) -> Bool {
        name.ends(with: ".swp") || name.ends(with: ".swx") || name.ends(with: "~") || name.starts(with: ".#")
            || name.elementsEqual("4913".utf8) || name.starts(with: ".goutputstream-")
    }
}

extension UnsafeBufferPointer<UInt8> {
    fileprivate func ends(with suffix: StaticString) -> Bool {
        let n = suffix.utf8CodeUnitCount
        guard count >= n else { return false }
        return memcmp(baseAddress! + (count - n), suffix.utf8Start, n) == 0
    }

    fileprivate func starts(with prefix: StaticString) -> Bool {
        let n = prefix.utf8CodeUnitCount
        guard count >= n else { return false }
        return memcmp(baseAddress!, prefix.utf8Start, n) == 0
    }
}
