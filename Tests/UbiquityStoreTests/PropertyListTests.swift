import FoundationEssentials
import Testing
import UbiquityStore

/// Why the key-value store's stored text form keeps its own JSON codec (PropertyList)
/// while everything else uses Foundation's: the form spells integers and doubles apart
/// (`2` and `2.0`), and Foundation's coders do not. These tests pin Foundation's behaviour
/// that forces the choice; should one fail, Foundation now keeps the distinction and
/// PropertyList's codec can go (reading old stored values as before).
@Suite struct PropertyListTests {
    /// How a reader that tells the two apart decodes a number: an integer if it can be one.
    enum Number: Decodable, Equatable {
        case integer(Int64)
        case double(Double)

        init(from decoder: any Decoder) throws {
            let c = try decoder.singleValueContainer()
            if let i = try? c.decode(Int64.self) { self = .integer(i) } else { self = .double(try c.decode(Double.self)) }
        }
    }

    @Test func foundationsDecoderReadsAWholeDoubleAsAnInteger() throws {
        let numbers = try JSONDecoder().decode([Number].self, from: Data("[2, 2.0, 1e3, 2.5]".utf8))
        #expect(numbers == [.integer(2), .integer(2), .integer(1000), .double(2.5)])
    }

    @Test func foundationsEncoderWritesAWholeDoubleWithoutItsFraction() throws {
        let text = String(decoding: try JSONEncoder().encode([2.0, 2.5]), as: UTF8.self)
        #expect(text == "[2,2.5]")
    }

    /// What the stored form needs, and PropertyList does.
    @Test func propertyListKeepsIntegersAndDoublesApart() throws {
        let value = try PropertyList.parseJSON(Array("[2, 2.0, 1e3, 2.5]".utf8))
        #expect(value == .array([.integer(2), .double(2), .double(1000), .double(2.5)]))
        #expect(value.json == "[2,2.0,1000.0,2.5]")
        #expect(try PropertyList.parseJSON(Array(value.json.utf8)) == value)
    }
}
