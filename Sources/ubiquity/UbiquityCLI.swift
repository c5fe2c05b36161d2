import ArgumentParser

@main
struct Ubiquity: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "ubiquity",
        abstract: "A versioned, synced folder you mount and edit with any tool.",
        discussion: """
        Every save of a file becomes a version kept in content-addressed chunks; browse them \
        under MOUNTPOINT/.versions/. Start with:

          ubiquity mount ~/Cloud
          echo hello > ~/Cloud/notes.txt
          ls ~/Cloud/.versions/notes.txt/
          ubiquity unmount ~/Cloud

        Devices that share a backing store (a directory or an S3 bucket) sync on their own; \
        `ubiquity sync` waits for a full cycle, `ubiquity pause`/`resume` switch it off and on, and files edited \
        on two devices at once show up in `ubiquity conflicts` until `ubiquity resolve` \
        settles them. `man ubiquity` has every command; docs/ in the source tree has the rest.
        """,
        subcommands: [MountCommand.self, UnmountCommand.self, StatusCommand.self,
                      SyncCommand.self, PauseCommand.self, ResumeCommand.self,
                      ConflictsCommand.self, ResolveCommand.self,
                      VersionsCommand.self, RestoreCommand.self, PruneCommand.self, GcCommand.self,
                      FsckCommand.self, TinyPixCommand.self, KeyValueCommand.self, QueryCommand.self,
                      DownloadCommand.self, EvictCommand.self, PinCommand.self, UnpinCommand.self,
                      InitCommand.self, KeyCommand.self])
}
