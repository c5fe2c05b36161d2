import Testing
import TinyPix

@Suite("Errors say what is wrong")
struct TinyPixErrorTests {
    let rows = smileyGrid.split(separator: "\n").map(String.init)

    func grid(_ lines: [String]) -> String { lines.joined(separator: "\n") + "\n" }

    @Test func sevenLines() throws {
        let error = try #require(encodeError(grid(Array(rows.prefix(7)))))
        #expect(error.description == "expected 8 lines, found 7")
        #expect(error.reason == .wrongLineCount(found: 7))
        #expect(error.line == nil && error.column == nil)
    }

    @Test func nineLines() throws {
        let error = try #require(encodeError(grid(rows + ["#......."])))
        #expect(error.description == "expected 8 lines, found 9")
        #expect(error == TinyPixError(.wrongLineCount(found: 9)))
    }

    @Test func noLines() throws {
        #expect(encodeError([])?.description == "expected 8 lines, found 0")
        #expect(encodeError("\n\n\r\n")?.description == "expected 8 lines, found 0")
    }

    @Test func sevenCellLine() throws {
        var lines = rows
        lines[2] = "#.#..#."
        let error = try #require(encodeError(grid(lines)))
        #expect(error.description == "line 3 has 7 cells, expected 8")
        #expect(error.line == 3)
    }

    @Test func sevenCellsAndCarriageReturn() throws {
        var lines = rows
        lines[6] = ".#....#\r"
        #expect(encodeError(grid(lines))?.description == "line 7 has 7 cells, expected 8")
    }

    @Test func nineCellLine() throws {
        var lines = rows
        lines[4] = "#.#..#.##"
        let error = try #require(encodeError(grid(lines)))
        #expect(error.description == "line 5 has 9 cells, expected 8")
        #expect(error.reason == .wrongCellCount(line: 5, found: 9))
    }

    @Test func emptyLineInTheMiddle() throws {
        var lines = rows
        lines.insert("", at: 3)
        #expect(encodeError(grid(lines))?.description == "line 4 has 0 cells, expected 8")
    }

    @Test func badCharacter() throws {
        var lines = rows
        lines[2] = "#.#.Q..#"
        let error = try #require(encodeError(grid(lines)))
        #expect(error.description == "line 3, column 5: unexpected character 'Q' (use '#' for on, '.' for off)")
        #expect(error.line == 3 && error.column == 5)
    }

    @Test func badCharacterAfterEightCells() throws {
        var lines = rows
        lines[7] = "..####..;"
        #expect(encodeError(grid(lines))?.description
            == "line 8, column 9: unexpected character ';' (use '#' for on, '.' for off)")
    }

    @Test func tabInsideCells() throws {
        var lines = rows
        lines[0] = "..##\t..."
        #expect(encodeError(grid(lines))?.description
            == "line 1, column 5: unexpected character '\\x09' (use '#' for on, '.' for off)")
    }

    @Test func nonPrintableAndNonASCIICharactersArePrintedSafely() throws {
        var bytes = utf8(smileyGrid)
        bytes[9 + 3] = 0x01                                     // line 2, column 4
        #expect(encodeError(bytes)?.description
            == "line 2, column 4: unexpected character '\\x01' (use '#' for on, '.' for off)")
        bytes[9 + 3] = 0xFF                                     // invalid UTF-8
        #expect(encodeError(bytes)?.description
            == "line 2, column 4: unexpected character '\\xFF' (use '#' for on, '.' for off)")
        bytes[9 + 3] = 0x7F
        #expect(encodeError(bytes)?.description
            == "line 2, column 4: unexpected character '\\x7F' (use '#' for on, '.' for off)")

        let block = "..█...#.\n" + smileyGrid.split(separator: "\n").dropFirst().joined(separator: "\n")
        #expect(encodeError(block)?.description
            == "line 1, column 3: unexpected character '█' (U+2588) (use '#' for on, '.' for off)")
        let truncated = utf8("..") + [0xE2, 0x96] + utf8("...#.\n")
        #expect(encodeError(truncated)?.description
            == "line 1, column 3: unexpected character '\\xE2' (use '#' for on, '.' for off)")
        let nbsp = utf8("..") + [0xC2, 0xA0] + utf8("...#.\n")
        #expect(encodeError(nbsp)?.description
            == "line 1, column 3: unexpected character '\\xC2\\xA0' (use '#' for on, '.' for off)")
    }

    @Test func quotesAndBackslashesAreEscaped() {
        #expect(encodeError("'.......\n")?.description
            == "line 1, column 1: unexpected character '\\'' (use '#' for on, '.' for off)")
        #expect(encodeError("\\.......\n")?.description
            == "line 1, column 1: unexpected character '\\\\' (use '#' for on, '.' for off)")
    }

    @Test func firstProblemIsReported() {
        // A bad character on line 2 wins over the line count.
        let text = "........\n...Z....\n"
        #expect(encodeError(text)?.description
            == "line 2, column 4: unexpected character 'Z' (use '#' for on, '.' for off)")
    }

    @Test func singularCell() {
        #expect(encodeError("#\n")?.description == "line 1 has 1 cell, expected 8")
    }
}
