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
    /// Each node's heads: its records that no record of the same node names as a parent.
    private var headIDs: [String: Set<String>] = [:]
    /// Ids named as a parent before they arrived, with the nodes of the records naming
    /// them (a parent that arrives after its child is superseded at once).
    private var awaitedParents: [String: Set<String>] = [:]
    /// Each live node's current record.
    private(set) var current: [String: Record] = [:]
    /// Live nodes by the path their current record names.
    private var nodesAt: [NameKey: Set<String>] = [:]
    /// Number of live nodes strictly below each path (a path with any is a directory).
    private var below: [NameKey: Int] = [:]
    /// For each path, the paths directly below it that have live nodes at or below them:
    /// a subtree of the view is walked in proportion to its size.
    private var childPaths: [NameKey: Set<NameKey>] = [:]
    /// Conflict versions per path that has any, and their total: kept up to date by
    /// `add`, so status and `.conflicts/` never walk every path.
    private(set) var conflictCounts: [NameKey: Int] = [:]
    private(set) var totalConflicts = 0
    /// Work done (records and heads visited), for tests that check costs stay
    /// proportional to the change.
    private(set) var work = 0

    static func dirNode(_ path: String) -> String { "dir:" + path }
    static func linkNode(_ path: String) -> String { "link:" + path }

    /// Adds a record in O(parents + the heads of its node); returns the paths whose view
    /// may have changed.
    mutating func add(_ r: Record) -> [String] {
        guard records[r.id] == nil else { return [] }
        records[r.id] = r
        for p in r.parents {
            work += 1
            if let parent = records[p] {
                if parent.node == r.node { headIDs[r.node]?.remove(p) }
            } else {
                awaitedParents[p, default: []].insert(r.node)
            }
        }
        if awaitedParents.removeValue(forKey: r.id)?.contains(r.node) != true {
            headIDs[r.node, default: []].insert(r.id)
        }
        let changed = recompute(r.node)
        updateConflicts(changed)
        return changed
    }

    /// The node's heads: records no record of the node descends from.
    func heads(_ node: String) -> [Record] {
        (headIDs[node] ?? []).compactMap { records[$0] }
    }

    func liveHeads(_ node: String) -> [Record] { heads(node).filter { !$0.isTombstone } }

    private mutating func recompute(_ node: String) -> [String] {
        let old = current[node]
        let new = liveHeads(node).max { $1.beats($0) }
        current[node] = new
        var changed: [String] = []
        if let old {
            nodesAt[NameKey(old.path)]?.remove(node)
            if nodesAt[NameKey(old.path)]?.isEmpty == true { nodesAt[NameKey(old.path)] = nil }
            forEachAncestor(old.path) { below[$0, default: 0] -= 1; if below[$0] == 0 { below[$0] = nil } }
            unlinkIfEmpty(old.path)
            changed += withAncestors(old.path)
        }
        if let new {
            nodesAt[NameKey(new.path), default: []].insert(node)
            forEachAncestor(new.path) { below[$0, default: 0] += 1 }
            linkPath(new.path)
            changed += withAncestors(new.path)
        }
        return changed
    }

    /// Records `path` and its ancestors in `childPaths`.
    private mutating func linkPath(_ path: String) {
        var child = Substring(path)
        while true {
            let parent = child.lastIndex(of: "/").map { child[..<$0] } ?? ""
            let inserted = childPaths[NameKey(String(parent)), default: []].insert(NameKey(String(child))).inserted
            if !inserted || parent.isEmpty { return }
            child = parent
        }
    }

    /// Drops `path` and then its ancestors from `childPaths` while nothing is at or below them.
    private mutating func unlinkIfEmpty(_ path: String) {
        var child = Substring(path)
        while !child.isEmpty {
            let key = NameKey(String(child))
            guard nodesAt[key] == nil, below[key] == nil else { return }
            let parent = child.lastIndex(of: "/").map { child[..<$0] } ?? ""
            let parentKey = NameKey(String(parent))
            childPaths[parentKey]?.remove(key)
            if childPaths[parentKey]?.isEmpty == true { childPaths[parentKey] = nil }
            child = parent
        }
    }

    /// The current records of live nodes at `path` or below it.
    func currentRecords(atOrBelow path: String) -> [Record] {
        var result: [Record] = []
        var pending = [NameKey(path)]
        while let key = pending.popLast() {
            for node in nodesAt[key] ?? [] { if let r = current[node] { result.append(r) } }
            pending += childPaths[key] ?? []
        }
        return result
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

    /// Paths that have conflicts (for `.conflicts/`), in byte order.
    func conflictedPaths() -> [String] {
        conflictCounts.keys.map(\.name).sorted { $0.utf8.lexicographicallyPrecedes($1.utf8) }
    }

    private mutating func updateConflicts(_ paths: [String]) {
        for path in paths {
            let key = NameKey(path)
            let count = state(at: path).conflicts.count
            work += 1
            totalConflicts += count - (conflictCounts[key] ?? 0)
            conflictCounts[key] = count == 0 ? nil : count
        }
    }
}
