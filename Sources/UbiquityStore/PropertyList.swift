import UbiquitySystem

/// A property-list value (what the container's key-value store holds), and its text form
/// for arrays and dictionaries: JSON, with data and dates as one-key objects
/// (`{"$data":"<base64>"}`, `{"$date":"2026-11-24T08:00:00.000Z"}`) and integers told from
/// doubles by their spelling (`2` is an integer, `2.0` a double). JSON has no null; a
/// property list has none either, so `null` is refused.
///
/// Why a hand-written codec and not Foundation's JSONEncoder/JSONDecoder (which the control
/// socket and the CLI use): this text is stored and synced (docs/FORMAT.md, "Key-value
/// store"), and it must spell an integer and a double apart. Foundation cannot: its decoder
/// reads `2.0` (and `1e3`) as an integer, and its encoder writes the double 2.0 as `2`
/// (PropertyListTests pins both, so a Foundation that changes is noticed). This codec is
/// used for that stored form only.
public indirect enum PropertyList: Equatable, Sendable {
    case string(String)
    case integer(Int64)
    case double(Double)
    case bool(Bool)
    case data([UInt8])
    /// Milliseconds since the epoch (the precision the text form keeps).
    case date(Int64)
    case array([PropertyList])
    /// Keys in byte order (a dictionary has no order; one spelling keeps values comparable).
    case dictionary([(String, PropertyList)])

    public static func == (a: PropertyList, b: PropertyList) -> Bool {
        switch (a, b) {
        case let (.string(x), .string(y)): x == y
        case let (.integer(x), .integer(y)): x == y
        case let (.double(x), .double(y)): x == y
        case let (.bool(x), .bool(y)): x == y
        case let (.data(x), .data(y)): x == y
        case let (.date(x), .date(y)): x == y
        case let (.array(x), .array(y)): x == y
        case let (.dictionary(x), .dictionary(y)): x.count == y.count && zip(x, y).allSatisfy { $0.0 == $1.0 && $0.1 == $1.1 }
        default: false
        }
    }

    public struct ParseError: Error, Equatable, CustomStringConvertible {
        public let description: String
        init(_ description: String) { self.description = description }
    }

    /// Nesting deeper than this is refused (the parser recurses).
    public static let maxDepth = 64

    // MARK: JSON text

    /// Parses JSON text (surrounding whitespace allowed).
    public static func parseJSON(_ bytes: [UInt8]) throws(ParseError) -> PropertyList {
        var parser = JSONParser(bytes: bytes)
        let value = try parser.value(depth: 0)
        parser.skipSpace()
        guard parser.at == bytes.count else { throw ParseError("text after the value at byte \(parser.at)") }
        return value
    }

    /// The canonical JSON text.
    public var json: String {
        var out = ""
        write(to: &out)
        return out
    }

    private func write(to out: inout String) {
        switch self {
        case .string(let s): Self.quote(s, into: &out)
        case .integer(let i): out += String(i)
        case .double(let d): out += Self.spell(d)
        case .bool(let b): out += b ? "true" : "false"
        case .data(let bytes): out += "{\"$data\":\"" + Base64.encode(bytes) + "\"}"
        case .date(let millis): out += "{\"$date\":\"" + ISODate.format(millis: millis) + "\"}"
        case .array(let items):
            out += "["
            for (i, item) in items.enumerated() {
                if i > 0 { out += "," }
                item.write(to: &out)
            }
            out += "]"
        case .dictionary(let pairs):
            out += "{"
            for (i, (key, value)) in pairs.enumerated() {
                if i > 0 { out += "," }
                Self.quote(key, into: &out)
                out += ":"
                value.write(to: &out)
            }
            out += "}"
        }
    }

    /// A double as text that reads back as the same double and never as an integer.
    public static func spell(_ d: Double) -> String {
        let text = "\(d)"
        return text.contains(where: { $0 == "." || $0 == "e" || $0 == "E" }) ? text : text + ".0"
    }

    private static func quote(_ s: String, into out: inout String) {
        out += "\""
        for scalar in s.unicodeScalars {
            switch scalar {
            case "\"": out += "\\\""
            case "\\": out += "\\\\"
            case "\n": out += "\\n"
            case "\r": out += "\\r"
            case "\t": out += "\\t"
            case _ where scalar.value < 0x20:
                out += "\\u00" + Hex.encode([UInt8(scalar.value)])
            default: out.unicodeScalars.append(scalar)
            }
        }
        out += "\""
    }
}

/// A strict JSON reader over bytes (RFC 8259, without null); every failure names a byte.
private struct JSONParser {
    let bytes: [UInt8]
    var at = 0

    typealias ParseError = PropertyList.ParseError

    mutating func skipSpace() {
        while at < bytes.count, [0x20, 0x09, 0x0A, 0x0D].contains(bytes[at]) { at += 1 }
    }

    mutating func value(depth: Int) throws(ParseError) -> PropertyList {
        guard depth <= PropertyList.maxDepth else { throw ParseError("nested deeper than \(PropertyList.maxDepth)") }
        skipSpace()
        guard at < bytes.count else { throw ParseError("a value is missing at the end") }
        switch bytes[at] {
        case UInt8(ascii: "{"): return try object(depth: depth)
        case UInt8(ascii: "["): return try array(depth: depth)
        case UInt8(ascii: "\""): return .string(try string())
        case UInt8(ascii: "t"): try literal("true"); return .bool(true)
        case UInt8(ascii: "f"): try literal("false"); return .bool(false)
        case UInt8(ascii: "n"): throw ParseError("null at byte \(at): a property list has no null")
        default: return try number()
        }
    }

    private mutating func literal(_ word: String) throws(ParseError) {
        let w = Array(word.utf8)
        guard at + w.count <= bytes.count, Array(bytes[at..<at + w.count]) == w else { throw ParseError("unexpected text at byte \(at)") }
        at += w.count
    }

    private mutating func expect(_ c: UInt8) throws(ParseError) {
        skipSpace()
        guard at < bytes.count, bytes[at] == c else { throw ParseError("expected '\(Character(Unicode.Scalar(c)))' at byte \(at)") }
        at += 1
    }

    private mutating func array(depth: Int) throws(ParseError) -> PropertyList {
        at += 1
        var items: [PropertyList] = []
        skipSpace()
        if at < bytes.count, bytes[at] == UInt8(ascii: "]") { at += 1; return .array([]) }
        while true {
            items.append(try value(depth: depth + 1))
            skipSpace()
            guard at < bytes.count else { throw ParseError("unterminated array") }
            if bytes[at] == UInt8(ascii: "]") { at += 1; return .array(items) }
            try expect(UInt8(ascii: ","))
        }
    }

    private mutating func object(depth: Int) throws(ParseError) -> PropertyList {
        at += 1
        var pairs: [String: PropertyList] = [:]
        skipSpace()
        if at < bytes.count, bytes[at] == UInt8(ascii: "}") { at += 1; return .dictionary([]) }
        while true {
            skipSpace()
            guard at < bytes.count, bytes[at] == UInt8(ascii: "\"") else { throw ParseError("expected a key at byte \(at)") }
            let key = try string()
            try expect(UInt8(ascii: ":"))
            let item = try value(depth: depth + 1)
            guard pairs[key] == nil else { throw ParseError("key \"\(key)\" given twice") }
            pairs[key] = item
            skipSpace()
            guard at < bytes.count else { throw ParseError("unterminated object") }
            if bytes[at] == UInt8(ascii: "}") { at += 1; break }
            try expect(UInt8(ascii: ","))
        }
        // The spellings of data and dates.
        if pairs.count == 1, let (key, item) = pairs.first, key == "$data" || key == "$date" {
            guard case .string(let text) = item else { throw ParseError("\(key) takes a string") }
            if key == "$data" {
                guard let bytes = Base64.decode(text) else { throw ParseError("$data is not base64") }
                return .data(bytes)
            }
            guard let millis = ISODate.parse(text) else { throw ParseError("$date is not an ISO 8601 time (2026-11-24T08:00:00Z)") }
            return .date(millis)
        }
        return .dictionary(pairs.sorted { $0.key.utf8.lexicographicallyPrecedes($1.key.utf8) })
    }

    private mutating func string() throws(ParseError) -> String {
        at += 1
        var out: [UInt8] = []
        while true {
            guard at < bytes.count else { throw ParseError("unterminated string") }
            let c = bytes[at]
            at += 1
            switch c {
            case UInt8(ascii: "\""):
                guard let text = String(validating: out, as: UTF8.self) else { throw ParseError("a string is not UTF-8") }
                return text
            case UInt8(ascii: "\\"):
                guard at < bytes.count else { throw ParseError("unterminated string") }
                let e = bytes[at]
                at += 1
                switch e {
                case UInt8(ascii: "\""), UInt8(ascii: "\\"), UInt8(ascii: "/"): out.append(e)
                case UInt8(ascii: "b"): out.append(0x08)
                case UInt8(ascii: "f"): out.append(0x0C)
                case UInt8(ascii: "n"): out.append(0x0A)
                case UInt8(ascii: "r"): out.append(0x0D)
                case UInt8(ascii: "t"): out.append(0x09)
                case UInt8(ascii: "u"):
                    var scalar = try hex4()
                    if (0xD800...0xDBFF).contains(scalar) {
                        // A surrogate pair: the low half must follow.
                        guard at + 1 < bytes.count, bytes[at] == UInt8(ascii: "\\"), bytes[at + 1] == UInt8(ascii: "u") else {
                            throw ParseError("a lone surrogate at byte \(at)")
                        }
                        at += 2
                        let low = try hex4()
                        guard (0xDC00...0xDFFF).contains(low) else { throw ParseError("a lone surrogate at byte \(at)") }
                        scalar = 0x10000 + ((scalar - 0xD800) << 10) + (low - 0xDC00)
                    }
                    guard let u = Unicode.Scalar(scalar) else { throw ParseError("a lone surrogate at byte \(at)") }
                    out += Array(String(Character(u)).utf8)
                default: throw ParseError("unknown escape at byte \(at - 1)")
                }
            case 0..<0x20: throw ParseError("a control character in a string at byte \(at - 1)")
            default: out.append(c)
            }
        }
    }

    private mutating func hex4() throws(ParseError) -> UInt32 {
        guard at + 4 <= bytes.count else { throw ParseError("a short \\u escape") }
        var v: UInt32 = 0
        for c in bytes[at..<at + 4] {
            guard let d = Hex.value(c) else { throw ParseError("a bad \\u escape at byte \(at)") }
            v = v << 4 | UInt32(d)
        }
        at += 4
        return v
    }

    private mutating func number() throws(ParseError) -> PropertyList {
        let start = at
        var integral = true
        if at < bytes.count, bytes[at] == UInt8(ascii: "-") { at += 1 }
        while at < bytes.count {
            let c = bytes[at]
            if c >= 0x30 && c <= 0x39 { at += 1; continue }
            if c == UInt8(ascii: ".") || c == UInt8(ascii: "e") || c == UInt8(ascii: "E") || c == UInt8(ascii: "+") || c == UInt8(ascii: "-") {
                integral = false
                at += 1
                continue
            }
            break
        }
        let text = String(decoding: bytes[start..<at], as: UTF8.self)
        guard !text.isEmpty, text != "-" else { throw ParseError("unexpected text at byte \(start)") }
        if integral {
            guard let i = Int64(text) else { throw ParseError("integer \(text) out of range (64 bits)") }
            return .integer(i)
        }
        guard let d = Double(text), d.isFinite else { throw ParseError("\(text) is not a finite number") }
        return .double(d)
    }
}

/// Standard base64 (RFC 4648, with padding).
public enum Base64 {
    private static let alphabet = Array("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/".utf8)

    public static func encode(_ bytes: [UInt8]) -> String {
        var out: [UInt8] = []
        out.reserveCapacity((bytes.count + 2) / 3 * 4)
        var i = 0
        while i < bytes.count {
            let b0 = bytes[i], b1 = i + 1 < bytes.count ? bytes[i + 1] : 0, b2 = i + 2 < bytes.count ? bytes[i + 2] : 0
            out.append(alphabet[Int(b0 >> 2)])
            out.append(alphabet[Int((b0 & 3) << 4 | b1 >> 4)])
            out.append(i + 1 < bytes.count ? alphabet[Int((b1 & 15) << 2 | b2 >> 6)] : UInt8(ascii: "="))
            out.append(i + 2 < bytes.count ? alphabet[Int(b2 & 63)] : UInt8(ascii: "="))
            i += 3
        }
        return String(decoding: out, as: UTF8.self)
    }

    /// nil for anything but canonical padded base64 (whitespace is not skipped).
    public static func decode(_ text: String) -> [UInt8]? {
        let chars = Array(text.utf8)
        guard chars.count % 4 == 0 else { return nil }
        func value(_ c: UInt8) -> UInt8? {
            switch c {
            case 0x41...0x5A: c - 0x41
            case 0x61...0x7A: c - 0x61 + 26
            case 0x30...0x39: c - 0x30 + 52
            case UInt8(ascii: "+"): 62
            case UInt8(ascii: "/"): 63
            default: nil
            }
        }
        var out: [UInt8] = []
        out.reserveCapacity(chars.count / 4 * 3)
        var i = 0
        while i < chars.count {
            let last = i + 4 == chars.count
            let pad = last ? (chars[i + 3] == UInt8(ascii: "=") ? (chars[i + 2] == UInt8(ascii: "=") ? 2 : 1) : 0) : 0
            guard let v0 = value(chars[i]), let v1 = value(chars[i + 1]) else { return nil }
            out.append(v0 << 2 | v1 >> 4)
            if pad < 2 {
                guard let v2 = value(chars[i + 2]) else { return nil }
                out.append((v1 & 15) << 4 | v2 >> 2)
                if pad < 1 {
                    guard let v3 = value(chars[i + 3]) else { return nil }
                    out.append((v2 & 3) << 6 | v3)
                } else if v2 & 3 != 0 { return nil }
            } else if v1 & 15 != 0 { return nil }
            i += 4
        }
        return out
    }
}

/// ISO 8601 times in UTC with milliseconds, the text form of dates.
public enum ISODate {
    /// Milliseconds of years 1 to 9999.
    static let range: ClosedRange<Int64> = -62_135_596_800_000 ... 253_402_300_799_999

    public static func format(millis: Int64) -> String {
        let m = min(max(millis, range.lowerBound), range.upperBound)
        let (secs, ms) = floorDivide(m, 1000)
        let (days, daySecs) = floorDivide(secs, 86_400)
        let (y, mo, d) = CivilDate.civil(fromDays: days)
        func pad(_ v: Int64, _ width: Int) -> String {
            let s = String(v)
            return String(repeating: "0", count: max(0, width - s.count)) + s
        }
        return "\(pad(y, 4))-\(pad(mo, 2))-\(pad(d, 2))T\(pad(daySecs / 3600, 2)):\(pad(daySecs / 60 % 60, 2)):\(pad(daySecs % 60, 2)).\(pad(ms, 3))Z"
    }

    /// `YYYY-MM-DDTHH:MM:SS[.fraction](Z|±HH:MM)`; nil otherwise or outside years 1-9999.
    public static func parse(_ text: String) -> Int64? {
        let b = Array(text.utf8)
        func digits(_ from: Int, _ count: Int) -> Int64? {
            guard from + count <= b.count else { return nil }
            var v: Int64 = 0
            for c in b[from..<from + count] {
                guard c >= 0x30 && c <= 0x39 else { return nil }
                v = v * 10 + Int64(c - 0x30)
            }
            return v
        }
        guard b.count >= 20, let y = digits(0, 4), b[4] == UInt8(ascii: "-"), let mo = digits(5, 2), b[7] == UInt8(ascii: "-"),
              let d = digits(8, 2), b[10] == UInt8(ascii: "T") || b[10] == UInt8(ascii: " "), let h = digits(11, 2),
              b[13] == UInt8(ascii: ":"), let mi = digits(14, 2), b[16] == UInt8(ascii: ":"), let s = digits(17, 2) else { return nil }
        guard y >= 1, (1...12).contains(mo), d >= 1, d <= daysIn(month: mo, year: y), h < 24, mi < 60, s < 60 else { return nil }
        var i = 19
        var ms: Int64 = 0
        if i < b.count, b[i] == UInt8(ascii: ".") {
            i += 1
            var n = 0
            while i < b.count, b[i] >= 0x30, b[i] <= 0x39 {
                if n < 3 { ms = ms * 10 + Int64(b[i] - 0x30) }
                n += 1
                i += 1
            }
            guard n > 0, n <= 9 else { return nil }
            var scale = n
            while scale < 3 { ms *= 10; scale += 1 }
        }
        var offset: Int64 = 0
        guard i < b.count else { return nil }
        if b[i] == UInt8(ascii: "Z") {
            i += 1
        } else if b[i] == UInt8(ascii: "+") || b[i] == UInt8(ascii: "-") {
            guard let oh = digits(i + 1, 2), i + 3 < b.count, b[i + 3] == UInt8(ascii: ":"), let om = digits(i + 4, 2),
                  oh < 24, om < 60 else { return nil }
            offset = (oh * 60 + om) * 60 * (b[i] == UInt8(ascii: "-") ? -1 : 1)
            i += 6
        } else {
            return nil
        }
        guard i == b.count else { return nil }
        let secs = CivilDate.days(fromCivil: y, mo, d) * 86_400 + h * 3600 + mi * 60 + s - offset
        let millis = secs * 1000 + ms
        return range.contains(millis) ? millis : nil
    }

    private static func floorDivide(_ a: Int64, _ b: Int64) -> (Int64, Int64) {
        let q = a / b, r = a % b
        return r < 0 ? (q - 1, r + b) : (q, r)
    }

    private static func daysIn(month: Int64, year: Int64) -> Int64 {
        switch month {
        case 2: (year % 4 == 0 && year % 100 != 0) || year % 400 == 0 ? 29 : 28
        case 4, 6, 9, 11: 30
        default: 31
        }
    }

}
