import ArgumentParser
import Glibc
import UbiquityBacking
import UbiquityDaemon
import UbiquitySync
import UbiquitySystem

/// Which backing store a command works on without a mount: `--container` and `--backing`
/// as `ubiquity mount` takes them.
struct BackingOptions: ParsableArguments {
    @Option(help: "Container name: selects the default backing directory.")
    var container = "default"

    @Option(help: ArgumentHelp("The backing store: a directory or s3://BUCKET[/PREFIX]. Default: as `ubiquity mount` picks it ($UBIQUITY_BACKING, else $XDG_DATA_HOME/ubiquity/<container>/backing).",
                               valueName: "DIR|s3://BUCKET[/PREFIX]"))
    var backing: String?

    var location: String { Paths.backing(container: container, named: backing) }

    /// The store below any encryption (FORMAT and keys/ are in the clear there).
    func open(create: Bool = false) throws -> any BackingStore {
        let location = location
        if create && !BackingChoice.isURL(location) { try makeDirectoriesForCLI(location) }
        return try BackingChoice.open(location, check: true)
    }
}

struct InitCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "init",
        abstract: "Make an empty backing store a container, encrypted or not.",
        discussion: """
        A first `ubiquity mount` does this by itself; `init` does it without mounting. With \
        --encrypt every object but FORMAT and keys/ is sealed (AES-256-GCM) under a random \
        key that only the container's passphrases open: the backing store (a shared disk, \
        an S3 provider) sees sizes and times, never contents, names or device names. \
        Encryption is chosen here, once: it cannot be switched on or off later.

          ubiquity init --encrypt --backing s3://my-bucket/cloud
          ubiquity mount ~/Cloud --backing s3://my-bucket/cloud     # asks for the passphrase

        Keep a passphrase somewhere safe: without one, nobody can read the container, \
        not even its devices after a restart.
        """)

    @OptionGroup var where_: BackingOptions
    @Flag(help: "Encrypt the container (a passphrase is asked for, or read as --password-file or --password-command say).")
    var encrypt = false
    @OptionGroup var password: PasswordOptions

    func run() throws {
        let store = try where_.open(create: true)
        let ring = KeyRing(store)
        guard try ring.kind() == .empty else { throw CLIError("\(store.location) is a container already") }
        if encrypt {
            let unlocked = try ContainerUnlock.create(ring, source: password.source)
            print("Created an encrypted container at \(store.location) (key \(unlocked.keyID)). Keep its passphrase safe: nothing else opens it.")
        } else {
            try ring.createPlain()
            print("Created a container at \(store.location) (not encrypted).")
        }
    }
}

struct KeyCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "key",
        abstract: "List, add, remove and change the passphrases of an encrypted container.",
        discussion: """
        Each passphrase wraps the container's key in its own key file (keys/<id> in the \
        backing store); any one of them opens the container. Changing passphrases changes \
        no other object, and mounted devices keep working. Every subcommand asks for a \
        passphrase that opens the container (--password-file, --password-command, a \
        systemd credential, or the terminal); new ones come from --new-password-file or \
        the terminal (asked twice).

          ubiquity key list
          ubiquity key add                      # another passphrase
          ubiquity key remove 3f1c0a9e5b7d2468  # not the one you opened it with
          ubiquity key passwd                   # add a new one, remove the one given
        """,
        subcommands: [KeyList.self, KeyAdd.self, KeyRemove.self, KeyPasswd.self])
}

/// What every `key` subcommand shares: where, and the passphrase that opens it.
struct KeyAccess: ParsableArguments {
    @OptionGroup var where_: BackingOptions
    @OptionGroup var password: PasswordOptions

    func unlock(_ command: String) throws -> (KeyRing, ContainerUnlock.Unlocked) {
        let ring = KeyRing(try where_.open())
        guard try ring.kind() == .encrypted else { throw CLIError("\(ring.store.location) is not an encrypted container (`ubiquity init --encrypt` makes one of an empty backing store)") }
        return (ring, try exitingOnRefusal(command) { try ContainerUnlock.open(ring, source: password.source) })
    }
}

struct NewPasswordOption: ParsableArguments {
    @Option(help: ArgumentHelp("Read the new passphrase from FILE (else it is asked on the terminal, twice).", valueName: "FILE"))
    var newPasswordFile: String?

    /// Opens the container with `access`, then adds the new passphrase: a key file.
    func add(_ access: KeyAccess, _ command: String) throws -> (KeyRing, ContainerUnlock.Unlocked, String) {
        let (ring, unlocked) = try access.unlock(command)
        let passphrase = try PassphraseSource(file: newPasswordFile).read(purpose: "New passphrase for \(ring.store.location)", confirm: true)
        return (ring, unlocked, try ring.add(unlocked.key, passphrase: passphrase.bytes, cost: try ContainerUnlock.newKeyCost()))
    }
}

struct KeyList: ParsableCommand {
    static let configuration = CommandConfiguration(commandName: "list", abstract: "List the container's passphrase keys (* marks the one this passphrase opened).")
    @OptionGroup var access: KeyAccess

    func run() throws {
        let (ring, unlocked) = try access.unlock("key list")
        let (entries, malformed) = try ring.list()
        for entry in entries {
            let memory = entry.cost.n * entry.cost.r * 128
            print("\(entry.id == unlocked.keyID ? "*" : " ") \(entry.id)  scrypt N=\(entry.cost.n) r=\(entry.cost.r) p=\(entry.cost.p) (\(byteText(Int64(memory))))")
        }
        for line in malformed { print("! \(line)") }
    }
}

struct KeyAdd: ParsableCommand {
    static let configuration = CommandConfiguration(commandName: "add", abstract: "Add a passphrase that opens the container.")
    @OptionGroup var access: KeyAccess
    @OptionGroup var new: NewPasswordOption

    func run() throws {
        let (_, _, id) = try new.add(access, "key add")
        print("Added key \(id).")
    }
}

struct KeyRemove: ParsableCommand {
    static let configuration = CommandConfiguration(commandName: "remove", abstract: "Remove a passphrase (by its key id, from `ubiquity key list`).")
    @OptionGroup var access: KeyAccess
    @Argument(help: "The key id (16 hex digits).")
    var id: String

    func run() throws {
        let (ring, unlocked) = try access.unlock("key remove")
        try ring.remove(id, current: unlocked.keyID)
        print("Removed key \(id).")
    }
}

struct KeyPasswd: ParsableCommand {
    static let configuration = CommandConfiguration(commandName: "passwd", abstract: "Change the passphrase: add the new one, then remove the one given.")
    @OptionGroup var access: KeyAccess
    @OptionGroup var new: NewPasswordOption

    func run() throws {
        // The new key is written (whole) before the old one goes: a crash in between
        // leaves both passphrases working, never neither.
        let (ring, unlocked, id) = try new.add(access, "key passwd")
        try ring.removeAfterReplacing(unlocked.keyID, by: id)
        print("Changed the passphrase: key \(id) replaces \(unlocked.keyID).")
    }
}
