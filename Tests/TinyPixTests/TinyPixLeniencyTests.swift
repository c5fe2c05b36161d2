import Testing
import TinyPix

@Suite("Lenient grid parsing")
struct TinyPixLeniencyTests {
    @Test func crlfLineEnds() {
        let crlf = smileyGrid.split(separator: "\n").joined(separator: "\r\n") + "\r\n"
        #expect(encoded(crlf) == smileyBytes)
        let noFinal = smileyGrid.split(separator: "\n").joined(separator: "\r\n")
        #expect(encoded(noFinal) == smileyBytes)
    }

    @Test func missingFinalNewline() {
        #expect(encoded(String(smileyGrid.dropLast())) == smileyBytes)
    }

    @Test func trailingWhitespaceAfterCells() {
        let lines = smileyGrid.split(separator: "\n")
        let padded = lines.enumerated().map { i, line in
            line + ["   ", "\t", " \t ", "\r", "", " ", "\t\t  \r", "      "][i]
        }.joined(separator: "\n") + "\n"
        #expect(encoded(padded) == smileyBytes)
    }

    @Test func alternativeCharacters() {
        let grid = """
            __XXXX__
            -x----x-
            1.*00*.1
            #000000#
            X-X__x-*
            1  11  1
            .*....*.
            __####__
            """
        #expect(encoded(grid) == smileyBytes)
    }

    @Test func spacesAreOffCellsWithinEightColumns() {
        let grid = [
            "#      #",
            "########",
            "        ",
            "#       ",
            "       #",
            " #    # ",
            "........",
            "#      #",
        ].joined(separator: "\n")
        #expect(encoded(grid) == [0x81, 0xFF, 0x00, 0x80, 0x01, 0x42, 0x00, 0x81])
        // Spaces beyond column 8 are trailing whitespace, not cells.
        #expect(encoded(grid.split(separator: "\n").map { $0 + "   " }.joined(separator: "\n"))
            == [0x81, 0xFF, 0x00, 0x80, 0x01, 0x42, 0x00, 0x81])
    }

    @Test func lastRowOfSpaces() {
        let grid = String(repeating: "#.#.#.#.\n", count: 7) + "        \n"
        #expect(encoded(grid) == [0xAA, 0xAA, 0xAA, 0xAA, 0xAA, 0xAA, 0xAA, 0x00])
        #expect(encoded(String(grid.dropLast())) == [0xAA, 0xAA, 0xAA, 0xAA, 0xAA, 0xAA, 0xAA, 0x00])
    }

    @Test func trailingBlankLines() {
        for tail in ["\n", "\n\n\n", "\r\n\r\n", "\n\t\n", "\n    \n\n", "\n        \n", "\n \t \r\n  "] {
            #expect(encoded(smileyGrid + tail) == smileyBytes, "tail \(Array(tail.utf8))")
        }
    }

    @Test func byteOrderMark() {
        #expect(encoded([0xEF, 0xBB, 0xBF] + utf8(smileyGrid)) == smileyBytes)
    }

    @Test func eightBytesAreRawEvenIfTheyLookLikeText() {
        #expect(encoded("########") == utf8("########"))
        #expect(encoded("#.\n#.\n#.") == utf8("#.\n#.\n#."))
    }

    @Test func normalizedRenderOfLenientGrid() throws {
        let messy = "__XXXX__\r\n-x----x-  \n1.*00*.1\n#000000#\nX-X__x-*\n1  11  1\n.*....*.\n__####__"
        let stored = try TinyPix.encode(utf8(messy)).get()
        #expect(TinyPix.render(stored) == utf8(smileyGrid))
    }
}
