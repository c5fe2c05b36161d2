/// Paths of the container ("a/b/c"), split at their slashes by byte. A name may begin
/// with a combining mark, and Swift's `Character` joins a "/" with the mark after it:
/// `lastIndex(of: "/")` and `split(separator: "/")` on a `String` miss that slash, so
/// "a/\u{301}x" would be one name at the root. Every split of a path that sync decides
/// from goes through here.
public enum PathBytes {
    static let slash = UInt8(ascii: "/")

    /// (parent, name) of `path`; ("", path) at the root; nil for "".
    public static func split(_ path: String) -> (parent: String, name: String)? {
        guard !path.isEmpty else { return nil }
        let bytes = path.utf8
        guard let at = bytes.lastIndex(of: slash) else { return ("", path) }
        return (String(decoding: bytes[..<at], as: UTF8.self), String(decoding: bytes[bytes.index(after: at)...], as: UTF8.self))
    }

    /// The names along `path`; `keepingEmpty` keeps the empty ones ("a//b", a leading or
    /// trailing slash) for checks that refuse them.
    public static func components(_ path: String, keepingEmpty: Bool = false) -> [String] {
        path.utf8.split(separator: slash, omittingEmptySubsequences: !keepingEmpty).map { String(decoding: $0, as: UTF8.self) }
    }

    /// The directories above `path`, nearest first ("a/b/c": "a/b", "a").
    public static func ancestors(_ path: String) -> [String] {
        var result: [String] = []
        var rest = path
        while let (parent, _) = split(rest), !parent.isEmpty {
            result.append(parent)
            rest = parent
        }
        return result
    }
}

func splitPath(_ path: String) -> (String, String)? {
    PathBytes.split(path).map { ($0.parent, $0.name) }
}
