import UbiquitySystem

/// The synced view: what every device shows, computed from the set of records alone
/// (docs/FORMAT.md, "Meaning"). Devices holding the same records compute the same tree
/// and the same conflicts, whatever order the records came in; that is the whole
/// convergence argument, so every rule here must depend on the set only.
///
/// A record is a non-local version row: file versions, tombstones, and the records of
/// directories and symlinks (nodes `dir:<path>`, `link:<path>`), that the view has taken
/// in (`viewed = 1`, store format 21: this device's saves and tombstones a fold wrote
/// wait for the next sync step, `Index.viewOwnRecords`).
///
/// The view lives in the store's database (tables `view_*`, store format 4) and a record
/// updates it in the transaction that takes it in, so opening a store reads none of it,
/// memory does not grow with history, and a crash leaves the view matching the records. Adding a record costs O(its parents + its node's heads + the
/// depth of its path) indexed statements, whatever the size of the history.
/// Not thread-safe: guarded by whatever guards the store.
final class Replica {
    struct Record: Equatable {
        let row: Int64
        let id: VersionID
        let node: NodeID
        let parents: [VersionID]
        let kind: NodeKind
        let isTombstone: Bool
        let mtime: Nanos
        let device: DeviceID
        let path: String
        /// A directory record's mode (the view needs it; file records' attributes are read
        /// from their version row when shown).
        let mode: UInt32
        /// A symlink record's target.
        let target: String?
        /// Its dot and context (empty for records from before format 6 of the store).
        var lineage = Lineage()

        /// Whether this record supersedes `other` (of the same node) by its context.
        func covers(_ other: Record) -> Bool {
            other.id != id && lineage.contains(device: other.device, counter: other.lineage.dot)
        }

        /// The winner rule: later mtime, then greater device id, then greater record id.
        func beats(_ other: Record) -> Bool {
            if mtime != other.mtime { return mtime > other.mtime }
            if device != other.device { return other.device < device }
            return other.id < id
        }
    }

    /// What a path shows.
    enum Shown: Equatable {
        case none
        case directory(mode: UInt32)
        case node(Record)
    }

    /// The tables, each kept up to date by `add`:
    /// - `view_heads(node, row)`: each node's heads, its records that no record of the same
    ///   node names as a parent.
    /// - `view_awaited(id, node)`: ids named as a parent before they arrived, with the nodes
    ///   of the records naming them (a parent that arrives after its child is superseded).
    /// - `view_current(node, row, path)`: each live node's current record, by node and path.
    /// - `view_paths(path, parent, nodes, below)`: every path with live nodes at it (`nodes`)
    ///   or strictly below it (`below`; a path with any is a directory), so a subtree of
    ///   the view is walked in proportion to its size.
    /// - `view_conflicts(path, count)`: conflict versions per path that has any.
    static let schema = [
        "CREATE TABLE IF NOT EXISTS view_heads(node BLOB NOT NULL, row INTEGER NOT NULL, PRIMARY KEY(node, row)) WITHOUT ROWID",
        "CREATE TABLE IF NOT EXISTS view_awaited(id BLOB NOT NULL, node BLOB NOT NULL, PRIMARY KEY(id, node)) WITHOUT ROWID",
        "CREATE TABLE IF NOT EXISTS view_current(node BLOB PRIMARY KEY, row INTEGER NOT NULL, path TEXT NOT NULL) WITHOUT ROWID",
        "CREATE INDEX IF NOT EXISTS view_current_path ON view_current(path)",
        """
        CREATE TABLE IF NOT EXISTS view_paths(path TEXT PRIMARY KEY, parent TEXT NOT NULL, nodes INTEGER NOT NULL,
                                              below INTEGER NOT NULL) WITHOUT ROWID
        """,
        "CREATE INDEX IF NOT EXISTS view_paths_parent ON view_paths(parent)",
        "CREATE TABLE IF NOT EXISTS view_conflicts(path TEXT PRIMARY KEY, count INTEGER NOT NULL) WITHOUT ROWID",
    ]

    private let db: SQLiteDatabase
    /// Work done (records and paths visited), for tests that check costs stay
    /// proportional to the change.
    private(set) var work = 0
    /// Paths whose conflict count is due at the end of `deferringConflicts` (nil: none
    /// deferred, each change updates its paths at once).
    private var deferredConflicts: [String]?
    /// Of those, the paths that only lost nodes (`conflictsChanged`).
    private var deferredFewer: [String] = []
    /// The `below` of the directories a `deferringConflicts` batch changed, kept here and
    /// written once per directory at its end (nil outside one): a fold of 1,000 deletes in
    /// one directory, or a join of its 1,000 files, writes that directory's row and each
    /// of its ancestors' once, not 1,000 times.
    private var summedBelow: [NameKey: SummedBelow]?
    /// Set when a savepoint rolled back inside such a batch (an error caught there): the
    /// sums may hold what it undid, so the batch's end works out the `below` of every
    /// directory it touched from the table instead (`rolledBack`).
    private var summedBelowUnsure = false
    /// Every directory whose `below` the batch changed, written or not.
    private var belowTouched: [NameKey: String] = [:]

    private struct SummedBelow {
        let path: String
        let parent: String
        /// Not written yet.
        var delta: Int64
        /// What the table says plus `delta`.
        var now: Int64
    }
    /// Paths that gained a conflict version since `takeNewConflicts` (for watchers).
    private var newConflicts: [String] = []
    /// What the view's tables said, kept while `remembering` (nil otherwise). Each entry
    /// is kept up to date by the one place that changes what it remembers (all in this
    /// file), so it never answers with what was true before a change.
    private var memo: Memo?

    /// Keyed by bytes (`NameKey`), as paths and nodes are everywhere: two names that
    /// differ only in Unicode normalization are two files, and Swift's `String` equality
    /// would make them one.
    private struct Memo {
        /// What `state(at:)` found; emptied by every change of the view.
        var states: [NameKey: (shown: Shown, conflicts: [Record])] = [:]
        /// Each node's live heads as `add` left them (it works them out); `remove`
        /// forgets the node's.
        var liveHeads: [NodeID: [Record]] = [:]
        /// `below` of the paths `count` updated (what it read back).
        var below: [NameKey: Int64] = [:]
        /// Whether no id is awaited (nil: not asked yet); false once one is.
        var noneAwaited: Bool?
        /// Nodes known to have no heads here (so no current record either): those of a
        /// slice's records new to this device (`rememberNewNodes`) or of histories begun
        /// in a fold (`rememberFreshNodes`), until a head is added.
        var headless: Set<NodeID> = []
        /// The highest dot this device gave each node, as `own_dots` has it (0: no row),
        /// for the nodes `lineage` wrote or `rememberFreshNodes` named.
        var ownDots: [NodeID: Int64] = [:]
    }

    /// Runs `body` (one transaction: its rollback throws out of here) with what the view's
    /// tables said remembered: a pull slice counts the conflicts at each path its records
    /// touched and then reconciles those same paths; the state at a new file's path is
    /// worked out from what adding its record just wrote, not read back (reading them
    /// back would be several statements more per record of a join).
    func remembering<T>(_ body: () throws(StoreError) -> T) throws(StoreError) -> T {
        if memo != nil { return try body() } // nested: the outer call's memo goes on
        memo = Memo()
        defer { memo = nil }
        return try body()
    }

    /// The view changed at `paths` (nil: anywhere): what `state(at:)` remembered there goes.
    private func viewChanged(at paths: [String]? = nil) {
        guard let paths else { memo?.states = [:]; return }
        for path in paths { memo?.states[NameKey(path)] = nil }
    }

    /// The paths that gained a conflict version since the last call.
    func takeNewConflicts() -> [String] {
        defer { newConflicts = [] }
        return newConflicts
    }

    init(db: SQLiteDatabase) { self.db = db }

    /// Runs `body` (a batch of records added or removed, inside the caller's transaction)
    /// and updates the conflict counts of the paths it touched once, at the end. Per record
    /// it would be quadratic: 1,000 editor saves leave 1,000 temp-file nodes at one path
    /// until the sync step tombstones them, and each tombstone would recount all those
    /// still there.
    /// The directories' `below` counts are summed over the batch the same way (`count`).
    func deferringConflicts<T>(_ body: () throws(StoreError) -> T) throws(StoreError) -> T {
        if deferredConflicts != nil { return try body() } // nested: the outer call updates
        deferredConflicts = []
        deferredFewer = []
        summedBelow = [:]
        defer {
            deferredConflicts = nil
            deferredFewer = []
            summedBelow = nil
            summedBelowUnsure = false
            belowTouched = [:]
        }
        let result = try body()
        try writeSummedBelow()
        if summedBelowUnsure { try recountBelow(belowTouched.values) }
        try updateConflicts(deferredConflicts ?? [], fewer: deferredFewer)
        return result
    }

    // MARK: reading records

    private static let columns = "v.row, v.id, v.file_id, v.parents, v.kind, v.tombstone, v.mtime, device_id, v.path, v.mode, v.target, v.lineage"
    /// Each record's device id by its number (store format 13; `Store.versionsWithDevices`).
    private static let device = "JOIN devices ON number = v.device"

    private static func record(_ r: SQLRow) -> Record {
        Record(row: r.int(0), id: r.versionID(1), node: r.nodeID(2), parents: r.versionIDs(3),
               kind: NodeKind(rawValue: r.int(4)) ?? .file, isTombstone: r.int(5) != 0, mtime: r.int(6),
               device: r.deviceID(7), path: r.text(8), mode: UInt32(truncatingIfNeeded: r.int(9)),
               target: r.isNull(10) ? nil : r.text(10), lineage: Lineage.column(r.isNull(11) ? nil : r.text(11), device: r.deviceID(7)))
    }

    private func records(_ sql: String, _ params: [SQLValue]) throws(StoreError) -> [Record] {
        let found = try db.rows("SELECT \(Self.columns) \(sql)", params, Self.record)
        work += found.count
        return found
    }

    /// The records of a query over many keys (`SQLiteDatabase.rows(in:)`): `sql` follows
    /// the columns, with the page's placeholders for its `IN (…)`.
    private func records(in keys: [SQLValue], _ sql: (String) -> String) throws(StoreError) -> [Record] {
        guard !keys.isEmpty else { return [] }
        let found = try db.rows(in: keys, { "SELECT DISTINCT \(Self.columns) \(sql($0))" }, Self.record)
        work += found.count
        return found
    }

    /// What `add` reads of the view for each of `records`, which are taken in together in
    /// row order (a sync step's catch-up), read for all of them at once, by row: the
    /// parents (those in the batch from it, marked viewed), and the heads of each node
    /// with one record in the batch (a node with more has them change within it, and
    /// one new here has none). Two statements per 256 records instead of two per record.
    func known(for records: [Record]) throws(StoreError) -> [Int64: Known] {
        var byID: [VersionID: Record] = [:]
        for r in records { byID[r.id] = r }
        let outside = Set(records.flatMap(\.parents)).subtracting(byID.keys)
        for r in try self.records(in: outside.map { .id($0) }, {
            "FROM versions v \(Self.device) WHERE v.id IN (\($0)) AND v.local = 0 AND v.viewed = 1"
        }) { byID[r.id] = r }
        var counts: [NodeID: Int] = [:]
        for r in records { counts[r.node, default: 0] += 1 }
        let alone = counts.compactMap { $0.value == 1 && !isHeadless($0.key) ? $0.key : nil }
        var heads: [NodeID: [Record]] = [:]
        for node in alone { heads[node] = [] }
        for r in try self.records(in: alone.map { .node($0) }, {
            "FROM view_heads h JOIN versions v ON v.row = h.row \(Self.device) WHERE h.node IN (\($0))"
        }) { heads[r.node]?.append(r) }
        var result: [Int64: Known] = [:]
        for r in records {
            var known = Known()
            for p in r.parents { known.parents[p] = byID[p] }
            known.heads = heads[r.node].map { $0.sorted { $0.id < $1.id } }
            result[r.row] = known
        }
        return result
    }

    /// The record with this id (nil: none, or a local version, which is no record).
    func record(id: VersionID) throws(StoreError) -> Record? {
        try records("FROM versions v \(Self.device) WHERE v.id = ? AND v.local = 0", [.id(id)]).first
    }

    /// This device's records a fold wrote that the view has not taken in, in row order.
    func unviewed(limit: Int?) throws(StoreError) -> [Record] {
        try records("FROM versions v \(Self.device) WHERE v.viewed = 0 ORDER BY v.row LIMIT ?", [.int(Int64(limit ?? -1))])
    }

    /// The records at any of `paths` (tests).
    func records(atPaths paths: [String]) throws(StoreError) -> [Record] {
        var result: [Record] = []
        for path in paths { result += try records("FROM versions v \(Self.device) WHERE v.path = ? AND v.local = 0", [.text(path)]) }
        return result
    }

    /// Of `nodes` (a slice's), remembers those with no heads here, 256 nodes a statement:
    /// the first record of a node new to this device then looks for neither its heads
    /// nor its current record (two statements per record of a join).
    func rememberNewNodes(_ nodes: Set<NodeID>) throws(StoreError) {
        guard memo != nil, !nodes.isEmpty else { return }
        let known = try db.rows(in: nodes.map { SQLValue.node($0) }, { "SELECT DISTINCT node FROM view_heads WHERE node IN (\($0))" }) { $0.nodeID(0) }
        memo?.headless = nodes.subtracting(known)
    }

    /// Nodes of histories begun since the last fold (`TreeOverlay.isFresh`): the view has
    /// no heads of them and `own_dots` no row, so a fold of their first saves reads
    /// neither (three statements per file made).
    func rememberFreshNodes(_ nodes: Set<NodeID>) {
        memo?.headless.formUnion(nodes)
        for node in nodes { memo?.ownDots[node] = 0 }
    }

    /// `own_dots` lost the node's row (a history withdrawn or pruned away).
    func ownDotDropped(_ node: NodeID) { memo?.ownDots[node] = nil }

    private func isHeadless(_ node: NodeID) -> Bool { memo?.headless.contains(node) == true }

    /// Whether `node` is known to have no heads here (`rememberNewNodes`, `rememberFreshNodes`).
    func isNew(_ node: NodeID) -> Bool { isHeadless(node) }

    /// The node's heads: records no record of the node descends from.
    func heads(_ node: NodeID) throws(StoreError) -> [Record] {
        if isHeadless(node) { return [] }
        return try records("FROM view_heads h JOIN versions v ON v.row = h.row \(Self.device) WHERE h.node = ? ORDER BY v.id", [.node(node)])
    }

    func liveHeads(_ node: NodeID) throws(StoreError) -> [Record] {
        if let known = memo?.liveHeads[node] { return known }
        if isHeadless(node) { return [] }
        return try records("FROM view_heads h JOIN versions v ON v.row = h.row \(Self.device) WHERE h.node = ? AND v.tombstone = 0 ORDER BY v.id",
                    [.node(node)])
    }

    /// The live node's current record.
    func current(_ node: NodeID) throws(StoreError) -> Record? {
        if isHeadless(node) { return nil }
        return try records("FROM view_current c JOIN versions v ON v.row = c.row \(Self.device) WHERE c.node = ?", [.node(node)]).first
    }

    /// Every live node's current record (the whole-tree scan after an upgrade only).
    func allCurrent() throws(StoreError) -> [Record] {
        try records("FROM view_current c JOIN versions v ON v.row = c.row \(Self.device)", [])
    }

    /// The current records of live nodes at exactly `path`, by node.
    private func currentRecords(at path: String) throws(StoreError) -> [Record] {
        try records("FROM view_current c JOIN versions v ON v.row = c.row \(Self.device) WHERE c.path = ? ORDER BY c.node", [.text(path)])
    }

    /// The current records of live nodes at `path` or below it.
    func currentRecords(atOrBelow path: String) throws(StoreError) -> [Record] {
        try writeSummedBelow()
        var result: [Record] = []
        var pending = [path]
        while let next = pending.popLast() {
            result += try currentRecords(at: next)
            let children = try db.rows("SELECT path FROM view_paths WHERE parent = ?", [.text(next)]) { $0.text(0) }
            work += children.count
            pending += children
        }
        return result
    }

    // MARK: adding records

    /// Builds the view of a store from before format 4 (which computed it in memory at
    /// every start) from all its records: once, at the upgrade, in one transaction.
    /// `progress`: log each 10,000 records (the simulation rebuilds views to check them).
    static func build(_ db: SQLiteDatabase, progress: Bool = true) throws(StoreError) {
        let replica = Replica(db: db)
        try db.transaction { () throws(StoreError) in
            var last: Int64 = 0
            while true {
                let page = try replica.records("FROM versions v \(Self.device) WHERE v.local = 0 AND v.viewed = 1 AND v.row > ? ORDER BY v.row LIMIT 10000", [.int(last)])
                guard let end = page.last else { return }
                for record in page { _ = try replica.add(record) }
                last = end.row
                if progress { log("ubiquity: upgrading the store: synced view built up to record row \(last)") }
            }
        }
    }

    /// The lineage of a record this device makes now for `node` with `parents` (in the
    /// transaction that inserts it): a dot with the next counter of `device` for the node
    /// (above every dot of it it gave before, and every one the node's heads hold),
    /// and a context of the parents' dots and contexts. Parents of other nodes (a conflict
    /// taken from another node) do not count: counters are per node.
    ///
    /// Also returns what it read that `add` of the record reads again (`Known`).
    /// `heads`: the node's heads, when the caller has just read them.
    func lineage(node: NodeID, parents: [VersionID], device: DeviceID, heads known: [Record]? = nil) throws(StoreError) -> (Lineage, Known) {
        var lineage = Lineage()
        let heads: [Record]
        if let known { heads = known } else { heads = try self.heads(node) }
        var known = Known()
        for id in parents {
            var found = heads.first { $0.id == id }
            if found == nil { found = try record(id: id) }
            guard let parent = found else { continue }
            known.parents[id] = parent
            guard parent.node == node else { continue }
            lineage.formUnion(parent.lineage.context)
            lineage.insert(device: parent.device, counter: parent.lineage.dot)
        }
        // The highest dot this device gave the node is also kept (`own_dots`): heads alone
        // can lose it (a version rolled back after a power loss whose parent was pruned
        // leaves the node without heads here while other devices hold its dots).
        var highest: Int64
        if let remembered = memo?.ownDots[node] {
            highest = remembered
        } else {
            highest = try db.rows("SELECT dot FROM own_dots WHERE node = ?", [.node(node)]) { $0.int(0) }.first ?? 0
        }
        known.heads = heads
        for head in heads {
            if head.device == device { highest = max(highest, head.lineage.dot) }
            highest = max(highest, head.lineage.context[device]?.max ?? 0)
        }
        // Capped so the record stays valid (only a hostile context gets near it).
        lineage.dot = min(highest, Lineage.maxCounter - 1) + 1
        try db.query("REPLACE INTO own_dots(node, dot) VALUES(?, ?)", [.node(node), .int(lineage.dot)])
        memo?.ownDots[node] = lineage.dot
        // A context past the limit (a hostile parent's) could not be read back anywhere:
        // the record goes without lineage, superseding by its parents only.
        guard lineage.itemCount <= Lineage.maxItems else { return (Lineage(), known) }
        return (lineage, known)
    }

    /// What `lineage` read of the view for a record this device makes, for its `add` in
    /// the same transaction, with nothing changed in the view between the two (its
    /// insert into `versions` only): the parents found (by id) and the node's heads.
    /// So a save reads them once, not twice (the work tests count it).
    struct Known {
        var parents: [VersionID: Record] = [:]
        var heads: [Record]?
    }

    /// Adds a record already inserted in the versions table (same transaction); returns
    /// the paths whose view may have changed, whether `r` is its node's current record,
    /// whether it is then the only live node at its path, with nothing below it (so its
    /// path shows it), and whether its node is still live (has a live head).
    func add(_ r: Record, known: Known = Known()) throws(StoreError) -> (changed: [String], isCurrent: Bool, isAlone: Bool, isLive: Bool) {
        let wasHeadless = isHeadless(r.node) // so it had no current record either
        var dropped: Set<Int64> = [] // heads of the node deleted here (a parent is one)
        for p in r.parents {
            work += 1
            var found = known.parents[p].map { (row: $0.row, node: $0.node) }
            if found == nil {
                found = try db.rows("SELECT row, file_id FROM versions WHERE id = ? AND local = 0 AND viewed = 1", [.id(p)]) {
                    (row: $0.int(0), node: $0.nodeID(1))
                }.first
            }
            if let parent = found {
                if parent.node == r.node, dropped.insert(parent.row).inserted {
                    try db.query("DELETE FROM view_heads WHERE node = ? AND row = ?", [.node(r.node), .int(parent.row)])
                }
            } else {
                try db.query("INSERT OR IGNORE INTO view_awaited(id, node) VALUES(?, ?)", [.id(p), .node(r.node)])
                memo?.noneAwaited = false
            }
        }
        let awaitedBy = try awaiting(r.id)
        if !awaitedBy.isEmpty { try db.query("DELETE FROM view_awaited WHERE id = ?", [.id(r.id)]) }
        var superseded = awaitedBy.contains(r.node)
        // By lineage: the heads this record's context holds go; a head whose context holds
        // this record's dot supersedes it (the records between may be pruned). Heads are
        // enough: a record superseded by another is held by every context that holds that one.
        // The heads left are known here: the current record is worked out from them, not
        // read back.
        var left: [Record] = []
        let heads: [Record]
        if let knownHeads = known.heads { heads = knownHeads } else { heads = try self.heads(r.node) }
        for head in heads {
            if r.covers(head) {
                if dropped.insert(head.row).inserted {
                    try db.query("DELETE FROM view_heads WHERE node = ? AND row = ?", [.node(r.node), .int(head.row)])
                }
            } else {
                if head.covers(r) { superseded = true }
                left.append(head)
            }
        }
        if !superseded {
            try db.query("INSERT OR IGNORE INTO view_heads(node, row) VALUES(?, ?)", [.node(r.node), .int(r.row)])
            memo?.headless.remove(r.node)
            if !left.contains(where: { $0.row == r.row }) { left.append(r) }
        }
        let live = left.filter { !$0.isTombstone }
        memo?.liveHeads[r.node] = live
        let (changed, conflicts, current, alone) = try recompute(r.node, liveHeads: live, hadNoCurrent: wasHeadless)
        // What this changes is the node's old and new paths (its current record, its
        // conflicts) and whether the directories above them have anything below.
        viewChanged(at: changed)
        let isAlone = current?.row == r.row && alone
        if isAlone && !r.node.isDirectory {
            // What `state(at:)` would read back: the only node there, nothing below, and its
            // other live heads as conflicts.
            memo?.states[NameKey(r.path)] = (.node(r), sortedConflicts(live.filter { $0.id != r.id }))
        }
        // A tombstone that leaves its node no live head only takes it out of the view.
        try conflictsChanged(conflicts + [r.path], onlyLost: r.isTombstone && current == nil)
        return (changed, current?.row == r.row, isAlone, !live.isEmpty)
    }

    /// The nodes whose records named `id` as a parent before it arrived. Records seldom
    /// come before their parents: while none waits (asked once per `remembering`), this
    /// is not asked of each record.
    private func awaiting(_ id: VersionID) throws(StoreError) -> [NodeID] {
        if try awaitsNone() { return [] }
        return try db.rows("SELECT node FROM view_awaited WHERE id = ?", [.id(id)]) { $0.nodeID(0) }
    }

    /// Whether no record names a parent this store does not hold (asked of the table
    /// once per `remembering`; false outside one).
    func awaitsNone() throws(StoreError) -> Bool {
        guard memo != nil else { return false }
        if memo?.noneAwaited == nil {
            memo?.noneAwaited = try db.rows("SELECT 1 FROM view_awaited LIMIT 1", []) { $0.int(0) }.isEmpty
        }
        return memo?.noneAwaited == true
    }

    /// Of `ids`, those a record held here names as a parent it waits for.
    func awaited(among ids: [VersionID]) throws(StoreError) -> Set<VersionID> {
        if try awaitsNone() { return [] }
        return Set(try db.rows(in: ids.map { .id($0) }, { "SELECT id FROM view_awaited WHERE id IN (\($0))" }) { $0.versionID(0) })
    }

    // MARK: adding fresh records in bulk

    /// The live nodes at each of `paths` and below it, as the table has them (absent: none).
    func pathCounts(_ paths: [String]) throws(StoreError) -> [NameKey: (nodes: Int64, below: Int64)] {
        var found: [NameKey: (nodes: Int64, below: Int64)] = [:]
        for row in try db.rows(in: paths, { "SELECT path, nodes, below FROM view_paths WHERE path IN (\($0))" }, {
            (path: $0.text(0), nodes: $0.int(1), below: $0.int(2))
        }) { found[NameKey(row.path)] = (row.nodes, row.below) }
        return found
    }

    /// Adds records a pull slice has just inserted in the versions table as `rows` (in
    /// its batch: `remembering` and `deferringConflicts`), each the one record of a node
    /// new here (`isNew`) with no parents and no tombstone, at a path where the view has
    /// no live node and nothing else of the slice is, with nothing below unless it is a
    /// directory (`Store.freshRecords` checks). `add` ends the same way for each of them:
    /// the record becomes its node's one head and current record, its path gains a node
    /// and no conflict, the directories above gain one below. So the heads and current
    /// records go in with a statement each for all of them, and the directories' counts
    /// are summed per directory. Only a directory that gets its first node below can
    /// change a conflict count (a file there becomes one): it is recounted as `add`
    /// would. Returns the paths whose view changed, each once.
    func addFresh(_ records: [Record], rows: ClosedRange<Int64>) throws(StoreError) -> [String] {
        guard !records.isEmpty else { return [] }
        guard memo != nil, summedBelow != nil, deferredConflicts != nil, rows.count == records.count else {
            throw .database("fresh records added outside a pull slice's batch")
        }
        work += records.count
        let range: [SQLValue] = [.int(rows.lowerBound), .int(rows.upperBound)]
        try db.query("INSERT INTO view_heads(node, row) SELECT file_id, row FROM versions WHERE row BETWEEN ? AND ?", range)
        try db.query("INSERT INTO view_current(node, row, path) SELECT file_id, row, path FROM versions WHERE row BETWEEN ? AND ?", range)
        var changed: [String] = []
        var children: [NameKey: (path: String, count: Int64)] = [:]
        for r in records {
            try db.query(Self.addNode, [.text(r.path), .text(Self.parent(of: r.path))])
            memo?.headless.remove(r.node)
            memo?.liveHeads[r.node] = [r]
            memo?.states[NameKey(r.path)] = r.node.isDirectory ? nil : (.node(r), [])
            changed.append(r.path)
            let parent = Self.parent(of: r.path)
            if !parent.isEmpty { children[NameKey(parent), default: (parent, 0)].count += 1 }
        }
        var ancestors: Set<NameKey> = []
        var crossed: [String] = []
        for (_, (path, count)) in children {
            var ancestor = path
            while !ancestor.isEmpty {
                work += 1
                let now = try addBelow(ancestor, count)
                memo?.below[NameKey(ancestor)] = now
                if now == count { crossed.append(ancestor) }
                if ancestors.insert(NameKey(ancestor)).inserted {
                    memo?.states[NameKey(ancestor)] = nil
                    changed.append(ancestor)
                }
                ancestor = Self.parent(of: ancestor)
            }
        }
        deferredConflicts! += crossed
        return changed
    }

    private static let addNode = """
        INSERT INTO view_paths(path, parent, nodes, below) VALUES(?, ?, 1, 0)
        ON CONFLICT(path) DO UPDATE SET nodes = nodes + 1
        """

    /// `onlyLost`: the paths only lost nodes, which never adds a conflict at any of
    /// them (the heads left are fewer, and a directory that loses its last node below
    /// shows one node's heads rather than all of them).
    private func conflictsChanged(_ paths: [String], onlyLost: Bool = false) throws(StoreError) {
        switch (deferredConflicts != nil, onlyLost) {
        case (true, false): deferredConflicts! += paths
        case (true, true): deferredFewer += paths
        case (false, false): try updateConflicts(paths)
        case (false, true): try updateConflicts([], fewer: paths)
        }
    }

    /// Takes back a record that is being deleted from the versions table (same
    /// transaction): a version of this device that never left it and whose bytes were
    /// lost before they were durable (Store+Recovery). Its parents become heads again
    /// unless another record of the node descends from them. A record that is not a head
    /// (a later record descends from it) changes no heads: it goes as prune takes one, and
    /// its parents stay superseded. Returns the paths whose view may have changed.
    func remove(_ r: Record) throws(StoreError) -> [String] {
        viewChanged()
        memo?.liveHeads[r.node] = nil
        memo?.headless.remove(r.node) // its parents may become heads again
        try db.query("DELETE FROM view_heads WHERE node = ? AND row = ?", [.node(r.node), .int(r.row)])
        if db.changes == 0 { return [] }
        let others = try records("FROM versions v \(Self.device) WHERE v.file_id = ? AND v.local = 0 AND v.row != ?", [.node(r.node), .int(r.row)])
        let named = Set(others.flatMap(\.parents))
        for parent in others where r.parents.contains(parent.id) && !named.contains(parent.id) && !others.contains(where: { $0.covers(parent) }) {
            try db.query("INSERT OR IGNORE INTO view_heads(node, row) VALUES(?, ?)", [.node(r.node), .int(parent.row)])
        }
        var (changed, conflicts, _, _) = try recompute(r.node)
        changed += withAncestors(r.path)
        try conflictsChanged(conflicts + [r.path])
        return changed
    }

    /// Recomputes the node's current record. Returns the paths whose view may have
    /// changed (with their ancestors), and those whose conflict count may have: the node's
    /// old and new paths, and the ancestors that got their first node below or lost their
    /// last (a path's count depends on what is below it only through whether anything is:
    /// `state(at:)`), so a change deep in a tree recounts one path, not every ancestor.
    /// `liveHeads`: the node's live heads when the caller knows them (nil: read them);
    /// `hadNoCurrent`: the caller knows the node had no current record.
    /// Also returns the current record, and whether it became current here and is the only
    /// live node at its path with nothing below (false when not known).
    private func recompute(_ node: NodeID, liveHeads known: [Record]? = nil, hadNoCurrent: Bool = false) throws(StoreError)
        -> (changed: [String], conflicts: [String], current: Record?, alone: Bool) {
        let old = hadNoCurrent ? nil
            : try db.rows("SELECT row, path FROM view_current WHERE node = ?", [.node(node)]) { (row: $0.int(0), path: $0.text(1)) }.first
        let heads: [Record]
        if let known { heads = known } else { heads = try liveHeads(node) }
        let new = heads.max { $1.beats($0) }
        if let old, let new, old.row == new.row { return (withAncestors(new.path), [new.path], new, false) }
        var changed: [String] = [], conflicts: [String] = []
        if let old {
            try db.query("DELETE FROM view_current WHERE node = ?", [.node(node)])
            conflicts += [old.path] + (try count(old.path, nodes: -1).crossed)
            changed += withAncestors(old.path)
        }
        var alone = false
        if let new {
            try db.query("INSERT INTO view_current(node, row, path) VALUES(?, ?, ?)", [.node(node), .int(new.row), .text(new.path)])
            let (crossed, here) = try count(new.path, nodes: 1)
            conflicts += [new.path] + crossed
            changed += withAncestors(new.path)
            alone = here.nodes == 1 && here.below == 0
        }
        return (changed, conflicts, new, alone)
    }

    /// Adds `delta` (±1) live nodes at `path` (and below each of its ancestors); a path
    /// with none at or below it leaves `view_paths`. Returns the ancestors whose `below`
    /// went from 0 to 1 or from 1 to 0, and the path's own counts afterwards.
    private func count(_ path: String, nodes delta: Int) throws(StoreError) -> (crossed: [String], here: (nodes: Int64, below: Int64)) {
        work += 1
        try db.query(Self.addToPath, [.text(path), .text(Self.parent(of: path)), .int(Int64(delta)), .int(0)])
        let row = try db.rows(Self.pathCounts, [.text(path)]) { (nodes: $0.int(0), below: $0.int(1)) }.first ?? (nodes: 0, below: 0)
        // A row deleted here while its summed `below` is not written is made again then.
        if delta < 0 { try db.query(Self.dropEmptyPath, [.text(path)]) }
        let here = (nodes: row.nodes, below: summedBelow?[NameKey(path)]?.now ?? row.below)
        memo?.below[NameKey(path)] = here.below
        var crossed: [String] = []
        var ancestor = Self.parent(of: path)
        while !ancestor.isEmpty {
            work += 1
            let now = try addBelow(ancestor, Int64(delta))
            memo?.below[NameKey(ancestor)] = now
            if now == (delta > 0 ? 1 : 0) { crossed.append(ancestor) }
            ancestor = Self.parent(of: ancestor)
        }
        return (crossed, here)
    }

    /// Adds `delta` to the `below` of `path` (a directory of the view): to the batch's sum
    /// when one is open, else to the table now. Returns the new `below`.
    private func addBelow(_ path: String, _ delta: Int64) throws(StoreError) -> Int64 {
        let key = NameKey(path)
        if summedBelow != nil {
            var entry: SummedBelow
            if let known = summedBelow?[key] {
                entry = known
            } else {
                entry = SummedBelow(path: path, parent: Self.parent(of: path), delta: 0, now: try below(path))
            }
            entry.delta += delta
            entry.now += delta
            summedBelow?[key] = entry
            belowTouched[key] = path
            return entry.now
        }
        try db.query(Self.addToPath, [.text(path), .text(Self.parent(of: path)), .int(0), .int(delta)])
        let now = try db.rows(Self.pathCounts, [.text(path)]) { $0.int(1) }.first ?? 0
        if delta < 0 { try db.query(Self.dropEmptyPath, [.text(path)]) }
        return now
    }

    /// Writes the batch's summed `below` counts (at its end, and before a statement reads
    /// `view_paths` itself).
    private func writeSummedBelow() throws(StoreError) {
        guard let summed = summedBelow, !summed.isEmpty else { return }
        summedBelow = [:]
        for entry in summed.values where entry.delta != 0 {
            try db.query(Self.addToPath, [.text(entry.path), .text(entry.parent), .int(0), .int(entry.delta)])
            if entry.delta < 0 { try db.query(Self.dropEmptyPath, [.text(entry.path)]) }
        }
    }

    /// A savepoint rolled back (the store's transaction levels tell): what the memo
    /// remembers may be what it undid.
    func rolledBack() {
        if summedBelow != nil { summedBelowUnsure = true }
        if memo != nil { memo = Memo() }
    }

    /// Sets the `below` of each of `paths` to the live nodes the table has under it (a
    /// range of paths: `path/` up to `path0`, '0' being the byte after '/').
    private func recountBelow<S: Sequence>(_ paths: S) throws(StoreError) where S.Element == String {
        for path in paths {
            let below = try db.rows("SELECT coalesce(sum(nodes), 0) FROM view_paths WHERE path > ? AND path < ?",
                                    [.text(path + "/"), .text(path + "0")]) { $0.int(0) }.first ?? 0
            try db.query("INSERT INTO view_paths(path, parent, nodes, below) VALUES(?, ?, 0, ?) ON CONFLICT(path) DO UPDATE SET below = excluded.below",
                         [.text(path), .text(Self.parent(of: path)), .int(below)])
            try db.query(Self.dropEmptyPath, [.text(path)])
        }
    }

    /// The counts are read back by a statement of their own: SQLite runs a RETURNING
    /// clause through a table it makes for the statement, which tripled the upsert's cost
    /// (about 35,000 instructions against 10,000, and 4,000 for the read), once for every
    /// record the view takes.
    private static let addToPath = """
        INSERT INTO view_paths(path, parent, nodes, below) VALUES(?, ?, ?, ?)
        ON CONFLICT(path) DO UPDATE SET nodes = nodes + excluded.nodes, below = below + excluded.below
        """
    private static let pathCounts = "SELECT nodes, below FROM view_paths WHERE path = ?"
    private static let dropEmptyPath = "DELETE FROM view_paths WHERE path = ? AND nodes <= 0 AND below <= 0"

    private static func parent(of path: String) -> String { splitPath(path)?.0 ?? "" }

    private func withAncestors(_ path: String) -> [String] { [path] + PathBytes.ancestors(path) }

    // MARK: what paths show

    private func below(_ path: String) throws(StoreError) -> Int64 {
        if let known = memo?.below[NameKey(path)] ?? summedBelow?[NameKey(path)]?.now { return known }
        return try db.rows("SELECT below FROM view_paths WHERE path = ?", [.text(path)]) { $0.int(0) }.first ?? 0
    }

    /// What `path` shows, and its conflict versions (live heads not shown, newest first).
    func state(at path: String) throws(StoreError) -> (shown: Shown, conflicts: [Record]) {
        if let known = memo?.states[NameKey(path)] { return known }
        let found = try workOutState(at: path)
        memo?.states[NameKey(path)] = found
        return found
    }

    private func workOutState(at path: String) throws(StoreError) -> (shown: Shown, conflicts: [Record]) {
        let here = try currentRecords(at: path)
        let dirs = here.filter { $0.node.isDirectory }
        let others = here.filter { !$0.node.isDirectory }
        var otherHeads: [Record] = []
        for r in others { otherHeads += try liveHeads(r.node) }
        var isDirectory = !dirs.isEmpty
        if !isDirectory { isDirectory = try below(path) > 0 }
        if isDirectory {
            let dirMode = dirs.max { $1.beats($0) }?.mode ?? 0o755
            return (.directory(mode: dirMode), sortedConflicts(otherHeads))
        }
        guard let winner = others.max(by: { $1.beats($0) }) else { return (.none, []) }
        return (.node(winner), sortedConflicts(otherHeads.filter { $0.id != winner.id }))
    }

    private func sortedConflicts(_ list: [Record]) -> [Record] { list.sorted { $0.beats($1) } }

    // MARK: conflicts

    /// Paths that have conflicts (for `.conflicts/`), in byte order.
    func conflictedPaths() throws(StoreError) -> [String] {
        try db.rows("SELECT path FROM view_conflicts ORDER BY path", []) { $0.text(0) }
    }

    /// Conflict versions in all: the sum of `view_conflicts`, kept as the setting
    /// `conflicts` by `updateConflicts` (in the same transaction), so it is one row to read.
    func totalConflicts() throws(StoreError) -> Int {
        // The comment names the table the setting sums, so the overlay's gate folds first.
        Int(try db.rows("SELECT value FROM settings WHERE key = 'conflicts' -- view_conflicts", []) { Int64($0.text(0)) ?? 0 }.first ?? 0)
    }

    func conflictCount(at path: String) throws(StoreError) -> Int {
        Int(try db.rows("SELECT count FROM view_conflicts WHERE path = ?", [.text(path)]) { $0.int(0) }.first ?? 0)
    }

    /// `fewer`: paths that only lost nodes; with no conflict anywhere before, they have
    /// none after either, so they are not looked at.
    private func updateConflicts(_ paths: [String], fewer: [String] = []) throws(StoreError) {
        var done: Set<NameKey> = []
        var delta = 0
        // With no conflict anywhere (the total is one row), no path has a count to read.
        let anyBefore = paths.isEmpty && fewer.isEmpty ? false : try totalConflicts() > 0
        for path in paths + (anyBefore ? fewer : []) where done.insert(NameKey(path)).inserted {
            work += 1
            let count = try state(at: path).conflicts.count
            let old = anyBefore ? try conflictCount(at: path) : 0
            if count == old { continue }
            if count > old && newConflicts.count < 10_000 { newConflicts.append(path) }
            delta += count - old
            if count == 0 {
                try db.query("DELETE FROM view_conflicts WHERE path = ?", [.text(path)])
            } else {
                try db.query("REPLACE INTO view_conflicts(path, count) VALUES(?, ?)", [.text(path), .int(Int64(count))])
            }
        }
        if delta != 0 {
            try db.query("REPLACE INTO settings(key, value) VALUES('conflicts', ?)", [.text(String(try totalConflicts() + delta))])
        }
    }
}
