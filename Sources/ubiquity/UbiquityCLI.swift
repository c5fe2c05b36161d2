import ArgumentParser

@main
struct Ubiquity: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "ubiquity",
        abstract: "A versioned, synced folder you mount and edit with any tool.",
        discussion: """
        Every save of a file becomes a version kept in content-addressed chunks; browse them
        under MOUNTPOINT/.versions/. Start with:

          ubiquity mount ~/Cloud
          echo hello > ~/Cloud/notes.txt
          ls ~/Cloud/.versions/notes.txt/
          ubiquity unmount ~/Cloud
        """,
        subcommands: [MountCommand.self, UnmountCommand.self, StatusCommand.self, VersionsCommand.self,
                      RestoreCommand.self, FsckCommand.self, TinyPixCommand.self])
}
