/// Which paths are local-only: stored, never kept as history, never synced (DESIGN §1.1).
/// One rule, used for every decision about it.
public enum LocalOnly {
    /// `path` is relative to the container root ("a/b/c").
    public static func contains(_ path: String) -> Bool {
        let components = path.split(separator: "/")
        if components.contains(where: { $0.hasSuffix(".nosync") }) { return true }
        guard let name = components.last else { return false }
        return isEditorScratch(name)
    }

    /// vim swap files and its write test file `4913`, backup files, Emacs lock files,
    /// GNOME's atomic-save temp files.
    public static func isEditorScratch(_ name: Substring) -> Bool {
        name.hasSuffix(".swp") || name.hasSuffix(".swx") || name.hasSuffix("~") || name.hasPrefix(".#")
            || name == "4913" || name.hasPrefix(".goutputstream-")
    }
}
