import Crypto
import UbiquitySystem

/// AWS Signature Version 4 for S3 requests, with the payload's SHA-256 signed
/// (`x-amz-content-sha256`; over TLS a body goes unsigned: `payloadHash(_:overTLS:)`), as
/// AWS documents it ("Signature Calculations for the Authorization Header"). Pure: the
/// time comes in, so tests pin it (golden vectors from botocore in SigV4Tests) and clock
/// skew is corrected by the caller.
struct SigV4 {
    struct Credentials: Sendable {
        let accessKey: String
        let secretKey: String
        let sessionToken: String?
    }

    let credentials: Credentials
    let region: String
    let service = "s3"

    /// The headers to add to a request: `x-amz-date`, `x-amz-content-sha256`,
    /// `x-amz-security-token` (with temporary credentials) and `Authorization`.
    /// `path` is the URI path already encoded as it goes on the wire; `query` the
    /// parameters, not encoded; `headers` those that are signed besides the ones added
    /// here (host at least), names in any case.
    func sign(method: String, path: String, query: [(String, String)], headers: [(String, String)],
              payloadHash: String, time: UTCTime) -> [(String, String)] {
        let amzDate = time.amzDate
        let day = String(amzDate.prefix(8))
        var signed = headers.map { ($0.0.lowercased(), Self.trim($0.1)) }
        signed.append(("x-amz-date", amzDate))
        signed.append(("x-amz-content-sha256", payloadHash))
        if let token = credentials.sessionToken { signed.append(("x-amz-security-token", token)) }
        signed.sort { $0.0 < $1.0 }
        let canonicalHeaders = signed.map { "\($0.0):\($0.1)\n" }.joined()
        let signedNames = signed.map(\.0).joined(separator: ";")
        let encoded: [(String, String)] = query.map { (Self.encode($0.0, slash: true), Self.encode($0.1, slash: true)) }
        let sortedQuery = encoded.sorted { (a: (String, String), b: (String, String)) -> Bool in a.0 == b.0 ? a.1 < b.1 : a.0 < b.0 }
        let canonicalQuery = sortedQuery.map { "\($0.0)=\($0.1)" }.joined(separator: "&")
        let canonical = [method, path, canonicalQuery, canonicalHeaders, signedNames, payloadHash].joined(separator: "\n")
        let scope = "\(day)/\(region)/\(service)/aws4_request"
        let toSign = "AWS4-HMAC-SHA256\n\(amzDate)\n\(scope)\n\(Self.hex(SHA256.hash(data: Array(canonical.utf8))))"
        var key = SymmetricKey(data: Array(("AWS4" + credentials.secretKey).utf8))
        for part in [day, region, service, "aws4_request"] {
            key = SymmetricKey(data: Array(HMAC<SHA256>.authenticationCode(for: Array(part.utf8), using: key)))
        }
        let signature = Self.hex(HMAC<SHA256>.authenticationCode(for: Array(toSign.utf8), using: key))
        var added = [("x-amz-date", amzDate), ("x-amz-content-sha256", payloadHash)]
        if let token = credentials.sessionToken { added.append(("x-amz-security-token", token)) }
        added.append(("Authorization",
                      "AWS4-HMAC-SHA256 Credential=\(credentials.accessKey)/\(scope), SignedHeaders=\(signedNames), Signature=\(signature)"))
        return added
    }

    static func payloadHash(_ bytes: [UInt8]) -> String { hex(SHA256.hash(data: bytes)) }

    static let unsignedPayload = "UNSIGNED-PAYLOAD"

    /// What `x-amz-content-sha256` says of a body. Over TLS a body goes unsigned: TLS keeps
    /// it intact on the way, and signing it would cost a second SHA-256 pass over every
    /// pack, whose chunks were hashed for their ids already. Over plain HTTP the signature
    /// is what keeps a body from being swapped on the way, so it is hashed. An empty body
    /// is always hashed (nothing to save, and every server takes it).
    static func payloadHash(_ bytes: [UInt8], overTLS: Bool) -> String {
        overTLS && !bytes.isEmpty ? unsignedPayload : payloadHash(bytes)
    }

    /// URI encoding as SigV4 wants it: every byte but A-Z a-z 0-9 - _ . ~ as %XY (upper
    /// case); `/` kept in paths, encoded in query parameters.
    static func encode(_ s: String, slash: Bool) -> String {
        var out = ""
        out.reserveCapacity(s.utf8.count)
        for b in s.utf8 {
            switch b {
            case UInt8(ascii: "A")...UInt8(ascii: "Z"), UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "0")...UInt8(ascii: "9"),
                 UInt8(ascii: "-"), UInt8(ascii: "_"), UInt8(ascii: "."), UInt8(ascii: "~"):
                out.unicodeScalars.append(Unicode.Scalar(b))
            case UInt8(ascii: "/") where !slash:
                out.append("/")
            default:
                let digits = Array("0123456789ABCDEF".utf8)
                out.append("%")
                out.unicodeScalars.append(Unicode.Scalar(digits[Int(b >> 4)]))
                out.unicodeScalars.append(Unicode.Scalar(digits[Int(b & 15)]))
            }
        }
        return out
    }

    /// Header values: leading and trailing spaces dropped, inner runs of spaces as one.
    static func trim(_ value: String) -> String {
        value.split(separator: " ", omittingEmptySubsequences: true).joined(separator: " ")
    }

    static func hex<D: Sequence>(_ digest: D) -> String where D.Element == UInt8 { Hex.encode(digest) }
}

/// A UTC time in whole seconds, with the two forms S3 speaks: `20130524T000000Z` (SigV4)
/// and the HTTP `Date` header's, which the server's clock is read from.
struct UTCTime: Equatable, Sendable {
    /// Seconds since the Unix epoch.
    let seconds: Int64

    init(seconds: Int64) { self.seconds = seconds }

    private var civil: (year: Int64, month: Int64, day: Int64, hour: Int64, minute: Int64, second: Int64) {
        let days = seconds >= 0 ? seconds / 86400 : (seconds - 86399) / 86400
        let rest = seconds - days * 86400
        let (year, month, day) = CivilDate.civil(fromDays: days)
        return (year, month, day, rest / 3600, rest % 3600 / 60, rest % 60)
    }

    var amzDate: String {
        let c = civil
        func two(_ v: Int64) -> String { v < 10 ? "0\(v)" : "\(v)" }
        return "\(c.year)\(two(c.month))\(two(c.day))T\(two(c.hour))\(two(c.minute))\(two(c.second))Z"
    }

    /// Parses an HTTP date (`Sun, 06 Nov 1994 08:49:37 GMT`); nil for anything else, or a
    /// year outside 1970...9999 (a server's answer is checked before it is used).
    init?(httpDate text: String) {
        let parts = text.split(separator: " ")
        guard parts.count == 6, parts[5] == "GMT", let day = Int64(parts[1]), (1...31).contains(day),
              let month = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"]
                .firstIndex(of: String(parts[2])), let year = Int64(parts[3]), (1970...9999).contains(year) else { return nil }
        let clock = parts[4].split(separator: ":")
        guard clock.count == 3, let h = Int64(clock[0]), let m = Int64(clock[1]), let s = Int64(clock[2]),
              (0..<24).contains(h), (0..<60).contains(m), (0...60).contains(s) else { return nil }
        let days = CivilDate.days(fromCivil: year, Int64(month) + 1, day)
        seconds = days * 86400 + h * 3600 + m * 60 + s
    }
}
