/// The synced view: what every device shows, computed from the set of records alone
/// (docs/FORMAT.md, "Meaning"). Devices holding the same records compute the same tree
/// and the same conflicts, whatever order the records came in; that is the whole
/// convergence argument, so every rule here must depend on the set only.
///
/// A record is a non-local version row: file versions, tombstones, and the records of
/// directories and symlinks (nodes `dir:<path>`, `link:<path>`). Kept in memory, rebuilt
/// from the versions table at start; guarded by whatever guards the store.
struct Replica {
    struct Record: Equatable {
        let row: Int64
        let id: String
        let node: String
        let parents: [String]
        let kind: NodeKind
        let isTombstone: Bool
        let mtime: Nanos
        let device: String
        let path: String

        /// The winner rule: later mtime, then greater device id, then greater record id.
        func beats(_ other: Record) -> Bool {
            if mtime != other.mtime { return mtime > other.mtime }
            if device != other.device { return device.utf8.lexicographicallyPrecedes(other.device.utf8) == false }
            return other.id.utf8.lexicographicallyPrecedes(id.utf8)
        }
    }

    /// What a path shows.
    enum Shown: Equatable {
        case none
        case directory(mode: UInt32)
        case node(Record)
    }

    private(set) var records: [String: Record] = [:]
    private var nodeRecords: [String: [String]] = [:]
    /// Record ids some record of the same node names as a parent.
    private var superseded: Set<String> = []
    /// Each live node's current record.
    private(set) var current: [String: Record] = [:]
    /// Live nodes by the path their current record names.
    private var nodesAt: [NameKey: Set<String>] = [:]
    /// Number of live nodes strictly below each path (a path with any is a directory).
    private var below: [NameKey: Int] = [:]

    static func dirNode(_ path: String) -> String { "dir:" + path }
    static func linkNode(_ path: String) -> String { "link:" + path }

    /// Adds a record; returns the paths whose view may have changed.
    mutating func add(_ r: Record) -> [String] {
        guard records[r.id] == nil else { return [] }
        records[r.id] = r
        nodeRecords[r.node, default: []].append(r.id)
        for p in r.parents where records[p]?.node == r.node { superseded.insert(p) }
        // A parent that arrives after its child is superseded already.
        if nodeRecords[r.node]!.contains(where: { records[$0]!.parents.contains(r.id) }) { superseded.insert(r.id) }
        return recompute(r.node)
    }

    /// The node's heads: records no record of the node descends from.
    func heads(_ node: String) -> [Record] {
        (nodeRecords[node] ?? []).compactMap { superseded.contains($0) ? nil : records[$0] }
    }

    func liveHeads(_ node: String) -> [Record] { heads(node).filter { !$0.isTombstone } }

    private mutating func recompute(_ node: String) -> [String] {
        let old = current[node]
        let new = liveHeads(node).max { $1.beats($0) }
        current[node] = new
        var changed: [String] = []
        if let old {
            nodesAt[NameKey(old.path)]?.remove(node)
            forEachAncestor(old.path) { below[$0, default: 0] -= 1 }
            changed += withAncestors(old.path)
        }
        if let new {
            nodesAt[NameKey(new.path), default: []].insert(node)
            forEachAncestor(new.path) { below[$0, default: 0] += 1 }
            changed += withAncestors(new.path)
        }
        return changed
    }

    private func forEachAncestor(_ path: String, _ body: (NameKey) -> Void) {
        var prefix = Substring(path)
        while let slash = prefix.lastIndex(of: "/") {
            prefix = prefix[..<slash]
            body(NameKey(String(prefix)))
        }
    }

    private func withAncestors(_ path: String) -> [String] {
        var result = [path]
        forEachAncestor(path) { result.append($0.name) }
        return result
    }

    func isDirectory(_ path: String) -> Bool {
        (below[NameKey(path)] ?? 0) > 0 || (nodesAt[NameKey(path)] ?? []).contains { $0.hasPrefix("dir:") }
    }

    /// What `path` shows, and its conflict versions (live heads not shown, newest first).
    func state(at path: String) -> (shown: Shown, conflicts: [Record]) {
        let nodes = (nodesAt[NameKey(path)] ?? []).sorted()
        let others = nodes.filter { !$0.hasPrefix("dir:") }
        if isDirectory(path) {
            let dirs = nodes.compactMap { $0.hasPrefix("dir:") ? current[$0] : nil }
            let dirMode = dirs.max { $1.beats($0) }.map { mode(of: $0) } ?? 0o755
            return (.directory(mode: dirMode), sortedConflicts(others.flatMap(liveHeads)))
        }
        guard let winner = others.compactMap({ current[$0] }).max(by: { $1.beats($0) }) else { return (.none, []) }
        let losers = others.flatMap(liveHeads).filter { $0.id != winner.id }
        return (.node(winner), sortedConflicts(losers))
    }

    private func sortedConflicts(_ list: [Record]) -> [Record] { list.sorted { $0.beats($1) } }

    /// Modes of directory records and targets of symlink records (the view needs them;
    /// file records' attributes stay in the versions table).
    var modes: [String: UInt32] = [:]
    var targets: [String: String] = [:]
    private func mode(of r: Record) -> UInt32 { modes[r.id] ?? 0o755 }

    /// Paths that have conflicts (for `.conflicts/`).
    func conflictedPaths() -> [String] {
        nodesAt.keys.map(\.name).filter { !state(at: $0).conflicts.isEmpty }.sorted { $0.utf8.lexicographicallyPrecedes($1.utf8) }
    }
}
