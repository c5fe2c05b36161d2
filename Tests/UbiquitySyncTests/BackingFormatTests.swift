import Glibc
import Testing
import TestSupport
import UbiquityStore
import UbiquitySystem
@testable import UbiquitySync

/// The backing directory's FORMAT (docs/FORMAT.md, "Versions of this format"): an older
/// directory is upgraded when a device first opens it, a newer one is refused.
@Suite struct BackingFormatTests {
    static func format(_ dir: String) -> String {
        (try? readFile(dir + "/FORMAT", limit: 100)).flatMap { $0 }.map { String(decoding: $0, as: UTF8.self) } ?? ""
    }

    @Test(arguments: [1, 2, 3]) func anOlderDirectoryIsUpgraded(from version: Int) throws {
        let dir = TempDirectory()
        defer { dir.cleanup() }
        try writeFileAtomically(dir.path + "/FORMAT", Array("ubiquity-backing \(version)\n".utf8), tempPrefix: ".tmp")
        try Backing(directory: dir.path, deviceID: "0123456789abcdef").open()
        #expect(Self.format(dir.path) == "ubiquity-backing 4\n")
    }

    @Test func aNewerDirectoryIsRefused() throws {
        let dir = TempDirectory()
        defer { dir.cleanup() }
        try writeFileAtomically(dir.path + "/FORMAT", Array("ubiquity-backing 5\n".utf8), tempPrefix: ".tmp")
        #expect(throws: StoreError.self) { try Backing(directory: dir.path, deviceID: "0123456789abcdef").open() }
        #expect(Self.format(dir.path) == "ubiquity-backing 5\n")
    }
}
