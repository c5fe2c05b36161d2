// TinyPix: a pure codec between the stored form of an 8x8 one-bit picture
// (exactly 8 bytes) and its human-readable ASCII grid (8 lines of 8 cells).
// No dependencies, not even Foundation; everything works on bytes.

/// The TinyPix codec.
///
/// ## Stored form
/// Exactly 8 bytes, no header. Byte `r` is row `r`, top row first. Bit `1 << c`
/// is column `c`, and column `c` is drawn at position `7 - c`, so each row reads
/// as its byte in binary with the high bit on the left.
///
/// ## Grid form
/// 8 lines of 8 cells, each line ending in `\n` (72 bytes in all). ``render(_:)``
/// always writes `#` for on and `.` for off. ``encode(_:)`` is lenient about what
/// it reads:
///
/// - On cells: `#`, `X`, `x`, `1`, `*`.
/// - Off cells: `.`, `0`, `-`, `_`, and space. A space is a cell only within the
///   first 8 columns, so `#      #` is a valid row; spaces after the 8th column
///   are ignored.
/// - Lines may end in `\n` or `\r\n`; the final newline may be missing.
/// - Trailing whitespace (spaces, tabs, `\r`) after the 8 cells of a line is ignored.
///   Tabs and `\r` are never cells.
/// - Empty lines (or lines of only tabs and `\r`) at the end are ignored, as are
///   lines of only whitespace after the 8th line.
/// - A UTF-8 byte order mark at the very start is ignored.
///
/// A written buffer of exactly 8 bytes is always taken as the stored form, as is:
/// a valid grid can never be 8 bytes long.
public enum TinyPix {
    /// Bytes of the stored form.
    public static let storedSize = 8
    /// Bytes of the rendered grid: 8 lines of 8 cells plus a newline each.
    public static let gridSize = 72
    /// The picture a new file starts with: a diagonal from the top-right corner
    /// to the bottom-left.
    public static let newPicture: [UInt8] = [0x01, 0x02, 0x04, 0x08, 0x10, 0x20, 0x40, 0x80]

    /// The byte ``render(_:)`` writes for an on cell (`#`).
    public static let onCell: UInt8 = 0x23
    /// The byte ``render(_:)`` writes for an off cell (`.`).
    public static let offCell: UInt8 = 0x2E

    /// The grid for exactly 8 stored bytes: 8 lines of 8 cells (`#` on, `.` off),
    /// each ending in `\n`, 72 bytes in all. Returns nil for any other length
    /// (callers show such content as is).
    public static func render(_ stored: some Collection<UInt8>) -> [UInt8]? {
        guard stored.count == storedSize else { return nil }
        var grid = [UInt8]()
        grid.reserveCapacity(gridSize)
        for row in stored {
            var mask: UInt8 = 0x80
            while mask != 0 {
                grid.append(row & mask != 0 ? onCell : offCell)
                mask >>= 1
            }
            grid.append(newline)
        }
        return grid
    }

    /// What a writer handed us, turned into the 8 stored bytes.
    ///
    /// - Exactly 8 bytes are the stored form and are returned as they are, even
    ///   if they happen to look like text.
    /// - Anything else is parsed as a grid. On cells are `#`, `X`, `x`, `1`, `*`;
    ///   off cells are `.`, `0`, `-`, `_` and space (a space is a cell only within
    ///   the first 8 columns). `\r\n` line ends, a missing final newline, trailing
    ///   whitespace after the 8 cells, trailing blank lines and a leading UTF-8
    ///   byte order mark are all accepted. Exactly 8 lines of exactly 8 cells are
    ///   required.
    ///
    /// Total: never traps, whatever the input (empty, huge, binary, invalid UTF-8).
    /// On failure the error names the line (1-based) and column, or the line count.
    public static func encode(_ written: some Collection<UInt8>) -> Result<[UInt8], TinyPixError> {
        if let result = written.withContiguousStorageIfAvailable({ encode(buffer: $0) }) {
            return result
        }
        return Array(written).withUnsafeBufferPointer { encode(buffer: $0) }
    }

    // MARK: - Parsing

    static let newline: UInt8 = 0x0A
    static let carriageReturn: UInt8 = 0x0D
    static let tab: UInt8 = 0x09
    static let space: UInt8 = 0x20

    /// 1 for an on cell, 0 for an off cell, nil for anything else.
    @inline(__always)
    static func cellValue(_ byte: UInt8) -> UInt8? {
        switch byte {
        case 0x23, 0x58, 0x78, 0x31, 0x2A: return 1 // # X x 1 *
        case 0x2E, 0x30, 0x2D, 0x5F, 0x20: return 0 // . 0 - _ space
        default: return nil
        }
    }

    /// Tabs and `\r`: whitespace that is never a cell.
    @inline(__always)
    static func isNonCellBlank(_ byte: UInt8) -> Bool {
        byte == tab || byte == carriageReturn
    }

    @inline(__always)
    static func isBlank(_ byte: UInt8) -> Bool {
        byte == space || byte == tab || byte == carriageReturn
    }

    static func encode(buffer bytes: UnsafeBufferPointer<UInt8>) -> Result<[UInt8], TinyPixError> {
        if bytes.count == storedSize { return .success(Array(bytes)) }
        return parseGrid(bytes)
    }

    /// Start of the line that ends at `end` (exclusive) within `[start, end)`.
    @inline(__always)
    static func lineStart(_ bytes: UnsafeBufferPointer<UInt8>, from start: Int, endingAt end: Int) -> Int {
        var i = end
        while i > start && bytes[i - 1] != newline { i -= 1 }
        return i
    }

    static func parseGrid(_ bytes: UnsafeBufferPointer<UInt8>) -> Result<[UInt8], TinyPixError> {
        var start = 0
        if bytes.count >= 3 && bytes[0] == 0xEF && bytes[1] == 0xBB && bytes[2] == 0xBF {
            start = 3 // UTF-8 byte order mark
        }

        // The text is bytes[start..<end]; its lines are separated by "\n".
        // 1. Drop trailing lines that are empty or hold only tabs and "\r"
        //    (this also takes care of the final newline).
        var end = bytes.count
        while end > start {
            let ls = lineStart(bytes, from: start, endingAt: end)
            var i = ls
            while i < end && isNonCellBlank(bytes[i]) { i += 1 }
            guard i == end else { break }
            end = ls > start ? ls - 1 : start
        }

        // 2. Count the lines that are left.
        var lineCount = 0
        if end > start {
            lineCount = 1
            for i in start..<end where bytes[i] == newline { lineCount += 1 }
        }

        // 3. Beyond 8 lines, trailing lines of only whitespace are ignored too
        //    (within 8 lines a line of 8 spaces is an all-off row).
        while lineCount > 8 {
            let ls = lineStart(bytes, from: start, endingAt: end)
            var i = ls
            while i < end && isBlank(bytes[i]) { i += 1 }
            guard i == end else { break }
            end = ls - 1 // ls > start because there is more than one line
            lineCount -= 1
        }

        // 4. Parse the first (up to) 8 lines, reporting the first problem found.
        var stored = [UInt8](repeating: 0, count: storedSize)
        var pos = start
        for row in 0..<min(lineCount, storedSize) {
            var lineEnd = pos
            while lineEnd < end && bytes[lineEnd] != newline { lineEnd += 1 }
            switch parseRow(bytes, from: pos, to: lineEnd, line: row + 1) {
            case .success(let value): stored[row] = value
            case .failure(let error): return .failure(error)
            }
            pos = lineEnd + 1
        }
        guard lineCount == storedSize else {
            return .failure(TinyPixError(.wrongLineCount(found: lineCount)))
        }
        return .success(stored)
    }

    static func parseRow(
        _ bytes: UnsafeBufferPointer<UInt8>, from start: Int, to lineEnd: Int, line: Int
    ) -> Result<UInt8, TinyPixError> {
        // Trailing tabs and "\r" are dropped; trailing spaces only past column 8.
        var end = lineEnd
        while end > start {
            let byte = bytes[end - 1]
            guard isNonCellBlank(byte) || (byte == space && end - start > storedSize) else { break }
            end -= 1
        }
        var value: UInt8 = 0
        var i = start
        while i < end {
            let column = i - start
            guard let bit = cellValue(bytes[i]) else {
                return .failure(TinyPixError(.unexpectedCharacter(
                    line: line, column: column + 1,
                    bytes: characterBytes(bytes, at: i, end: lineEnd))))
            }
            if column < 8 { value |= bit << (7 - column) }
            i += 1
        }
        let cells = end - start
        guard cells == storedSize else {
            return .failure(TinyPixError(.wrongCellCount(line: line, found: cells)))
        }
        return .success(value)
    }

    /// The bytes of the character at `index`: a whole UTF-8 sequence when one is
    /// valid there, otherwise just the one byte.
    static func characterBytes(_ bytes: UnsafeBufferPointer<UInt8>, at index: Int, end: Int) -> [UInt8] {
        let lead = bytes[index]
        let length: Int
        switch lead {
        case 0xC2...0xDF: length = 2
        case 0xE0...0xEF: length = 3
        case 0xF0...0xF4: length = 4
        default: return [lead]
        }
        guard end - index >= length else { return [lead] }
        let sequence = Array(bytes[index..<(index + length)])
        return TinyPixError.decodeScalar(sequence) != nil ? sequence : [lead]
    }
}
