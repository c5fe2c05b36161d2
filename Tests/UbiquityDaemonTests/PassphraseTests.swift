import Glibc
import Testing
import TestSupport
@testable import UbiquityDaemon

/// Where a passphrase comes from: the first line of a file or a command's output, never
/// an empty one, a bounded read, a failing command refused; and a passphrase never prints.
@Suite struct PassphraseTests {
    @Test func aPassphraseIsTheFirstLineOfItsSource() throws {
        let dir = TempDirectory()
        defer { dir.cleanup() }
        let file = dir.path + "/pw"
        try Array("correct horse\nsecond line\n".utf8).write(to: file)
        #expect(try PassphraseSource(file: file).read(purpose: "test").bytes == Array("correct horse".utf8))
        #expect(try PassphraseSource(command: "printf 'battery staple\\r\\n'").read(purpose: "test").bytes == Array("battery staple".utf8))
        #expect("\(try PassphraseSource(file: file).read(purpose: "test"))" == "Passphrase(…)", "a passphrase never prints")

        try Array("\n".utf8).write(to: file)
        #expect(throws: (any Error).self, "an empty passphrase") { try PassphraseSource(file: file).read(purpose: "test") }
        try [UInt8](repeating: 0x61, count: PassphraseSource.maxLength + 1).write(to: file)
        #expect(throws: (any Error).self, "a file too long to be a passphrase") { try PassphraseSource(file: file).read(purpose: "test") }
        #expect(throws: (any Error).self, "a missing file") { try PassphraseSource(file: dir.path + "/none").read(purpose: "test") }
        #expect(throws: (any Error).self, "a failing command") { try PassphraseSource(command: "echo pw; exit 3").read(purpose: "test") }
        #expect(throws: (any Error).self, "a command that never stops talking") {
            try PassphraseSource(command: "yes").read(purpose: "test")
        }
    }
}

private extension Array where Element == UInt8 {
    func write(to path: String) throws {
        let fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0o600)
        guard fd >= 0 else { throw WriteFailed() }
        defer { close(fd) }
        _ = withUnsafeBytes { Glibc.write(fd, $0.baseAddress, $0.count) }
    }
}
private struct WriteFailed: Error {}
