import ArgumentParser
import Glibc
import UbiquityBacking
import UbiquityDaemon
import UbiquitySync

/// Where an encrypted container's passphrase comes from (`mount`, `init`, `key`, `fsck`).
struct PasswordOptions: ParsableArguments {
    @Option(help: ArgumentHelp("Read the container's passphrase from FILE (its first line; a FIFO or /dev/fd/N works too).", valueName: "FILE"))
    var passwordFile: String?

    @Option(help: ArgumentHelp("Run CMD with /bin/sh and take the first line of its output as the passphrase (e.g. 'pass show ubiquity').", valueName: "CMD"))
    var passwordCommand: String?

    var source: PassphraseSource { PassphraseSource(file: passwordFile, command: passwordCommand) }

    /// The backing store at `location`, unlocked when it is an encrypted container (a
    /// wrong or missing passphrase ends `ubiquity COMMAND` with status 2).
    func openUnlocked(_ location: String, check: Bool, command: String) throws -> any BackingStore {
        let clear = try BackingChoice.open(location, check: check)
        let ring = KeyRing(clear)
        guard try ring.kind() == .encrypted else { return clear }
        return try exitingOnRefusal(command) { try ContainerUnlock.open(ring, source: source) }.wrap(clear)
    }

    func validate() throws {
        if passwordFile != nil && passwordCommand != nil { throw ValidationError("give --password-file or --password-command, not both") }
    }
}

/// Runs `body`; a wrong or missing passphrase ends `ubiquity COMMAND` with status 2 and
/// says why.
func exitingOnRefusal<T>(_ command: String, _ body: () throws -> T) throws -> T {
    do { return try body() } catch let refused as ContainerUnlock.Refused {
        _ = fail(command, refused.description)
        throw ExitCode(2)
    }
}
