import Testing
import TinyPix

@Suite("Golden renderings")
struct TinyPixGoldenTests {
    @Test func constants() {
        #expect(TinyPix.storedSize == 8)
        #expect(TinyPix.gridSize == 72)
        #expect(TinyPix.newPicture == [0x01, 0x02, 0x04, 0x08, 0x10, 0x20, 0x40, 0x80])
    }

    @Test func newPictureRendersAsDiagonal() throws {
        let grid = try #require(TinyPix.render(TinyPix.newPicture))
        #expect(grid.count == 72)
        #expect(grid == utf8(diagonalGrid))
        #expect(String(decoding: grid, as: UTF8.self) == diagonalGrid)
    }

    @Test func newPictureGridEncodesBack() {
        #expect(encoded(diagonalGrid) == TinyPix.newPicture)
    }

    @Test func smileyRendersAndEncodesBack() throws {
        let grid = try #require(TinyPix.render(smileyBytes))
        #expect(String(decoding: grid, as: UTF8.self) == smileyGrid)
        #expect(encoded(grid) == smileyBytes)
        #expect(encoded(smileyGrid) == smileyBytes)
    }

    @Test func allOffAndAllOn() {
        let off = TinyPix.render([UInt8](repeating: 0, count: 8))
        #expect(off == utf8(String(repeating: "........\n", count: 8)))
        let on = TinyPix.render([UInt8](repeating: 0xFF, count: 8))
        #expect(on == utf8(String(repeating: "########\n", count: 8)))
    }

    @Test("Bit 1 << c of byte r is drawn at line r, position 7 - c", arguments: 0..<8, 0..<8)
    func singleBit(row: Int, column: Int) throws {
        var stored = [UInt8](repeating: 0, count: 8)
        stored[row] = 1 << column
        let grid = try #require(TinyPix.render(stored))
        let lines = grid.split(separator: UInt8(ascii: "\n"), omittingEmptySubsequences: false)
        #expect(lines.count == 9 && lines[8].isEmpty)
        for (r, line) in lines.prefix(8).enumerated() {
            #expect(line.count == 8)
            for (position, cell) in line.enumerated() {
                let on = r == row && position == 7 - column
                #expect(cell == UInt8(ascii: on ? "#" : "."), "line \(r), position \(position)")
            }
        }
        #expect(encoded(grid) == stored)
    }

    @Test("render is nil for any length but 8", arguments: [0, 1, 7, 9, 16, 72, 1000])
    func renderRejectsOtherLengths(length: Int) {
        #expect(TinyPix.render([UInt8](repeating: 0x55, count: length)) == nil)
    }

    @Test func renderTakesAnyCollection() {
        let reversed = TinyPix.newPicture.reversed()   // not contiguous
        let expected: [UInt8] = [0x80, 0x40, 0x20, 0x10, 0x08, 0x04, 0x02, 0x01]
        #expect(TinyPix.render(reversed) == TinyPix.render(expected))
        let slice = ([0xAA] + smileyBytes + [0xBB])[1...8]
        #expect(TinyPix.render(slice) == TinyPix.render(smileyBytes))
    }

    @Test func encodeTakesAnyCollection() throws {
        let lazyGrid = utf8(smileyGrid).lazy.map { $0 }   // not contiguous
        #expect(try TinyPix.encode(lazyGrid).get() == smileyBytes)
        let slice = ([0] + utf8(smileyGrid) + [0])[1...72]
        #expect(try TinyPix.encode(slice).get() == smileyBytes)
        #expect(try TinyPix.encode(smileyBytes[...]).get() == smileyBytes)
    }
}
