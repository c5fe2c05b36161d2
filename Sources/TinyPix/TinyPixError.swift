/// Why written bytes are not a TinyPix grid. Its ``description`` says exactly
/// what is wrong, for example
/// `line 3, column 5: unexpected character 'Q' (use '#' for on, '.' for off)`.
public struct TinyPixError: Error, Equatable, Hashable, Sendable, CustomStringConvertible {
    public enum Reason: Equatable, Hashable, Sendable {
        /// The grid does not have exactly 8 lines (trailing blank lines not counted).
        case wrongLineCount(found: Int)
        /// A line (1-based) does not have exactly 8 cells.
        case wrongCellCount(line: Int, found: Int)
        /// A character that is not a cell, at a 1-based line and column. `bytes` is
        /// the whole UTF-8 sequence when it is valid, otherwise the single byte.
        case unexpectedCharacter(line: Int, column: Int, bytes: [UInt8])
    }

    public let reason: Reason

    public init(_ reason: Reason) {
        self.reason = reason
    }

    /// The 1-based line the problem is on, if it is on one line.
    public var line: Int? {
        switch reason {
        case .wrongLineCount: return nil
        case .wrongCellCount(let line, _), .unexpectedCharacter(let line, _, _): return line
        }
    }

    /// The 1-based column of an unexpected character.
    public var column: Int? {
        if case .unexpectedCharacter(_, let column, _) = reason { return column }
        return nil
    }

    public var description: String {
        switch reason {
        case .wrongLineCount(let found):
            return "expected 8 lines, found \(found)"
        case .wrongCellCount(let line, let found):
            return "line \(line) has \(found) \(found == 1 ? "cell" : "cells"), expected 8"
        case .unexpectedCharacter(let line, let column, let bytes):
            return "line \(line), column \(column): unexpected character "
                + "\(Self.quoted(bytes)) (use '#' for on, '.' for off)"
        }
    }

    /// A character printed safely in single quotes: printable ASCII as itself
    /// (`'` and `\` escaped), a valid printable non-ASCII character as itself with
    /// its code point, anything else as `\xNN` per byte.
    static func quoted(_ bytes: [UInt8]) -> String {
        if bytes.count == 1 {
            let byte = bytes[0]
            switch byte {
            case 0x27: return "'\\''"
            case 0x5C: return "'\\\\'"
            case 0x20...0x7E: return "'" + String(Unicode.Scalar(byte)) + "'"
            default: return "'" + hex(byte) + "'"
            }
        }
        if let scalar = decodeScalar(bytes), isPrintable(scalar) {
            return "'" + String(scalar) + "' (U+" + hexDigits(scalar.value, minimum: 4) + ")"
        }
        return "'" + bytes.map(hex).joined() + "'"
    }

    static func hex(_ byte: UInt8) -> String {
        "\\x" + hexDigits(UInt32(byte), minimum: 2)
    }

    static func hexDigits(_ value: UInt32, minimum: Int) -> String {
        let digits = String(value, radix: 16, uppercase: true)
        return String(repeating: "0", count: max(0, minimum - digits.count)) + digits
    }

    /// The one scalar `bytes` encode in UTF-8, or nil if they are not exactly one
    /// valid scalar.
    static func decodeScalar(_ bytes: [UInt8]) -> Unicode.Scalar? {
        var iterator = bytes.makeIterator()
        var decoder = Unicode.UTF8()
        guard case .scalarValue(let scalar) = decoder.decode(&iterator) else { return nil }
        guard case .emptyInput = decoder.decode(&iterator) else { return nil }
        return scalar
    }

    static func isPrintable(_ scalar: Unicode.Scalar) -> Bool {
        switch scalar.properties.generalCategory {
        case .control, .format, .surrogate, .privateUse, .unassigned,
             .lineSeparator, .paragraphSeparator, .spaceSeparator,
             .nonspacingMark, .enclosingMark, .spacingMark:
            return false
        default:
            return true
        }
    }
}
