/// The names of directories looked up lately, as they are now (SQLite's rows with the
/// overlay's changes), so a lookup, a create's check for an existing name and an unlink
/// in a directory already loaded run no SQLite statement. A directory is loaded whole at
/// its first lookup that the overlay cannot answer.
///
/// Bounded by about `budget` names in all: two generations of about `budget / 2` names each;
/// a hit in the older one moves the directory to the newer, and when the newer fills it
/// becomes the older and the older is dropped (as `InodeCache`). A directory of more than
/// `budget / 8` names is not loaded (its lookups stay one indexed query each), so one
/// huge directory cannot push out the working set. Every name here is also in SQLite or
/// the overlay, so dropping a directory costs only a reload.
///
/// Kept current by `Store.record`, the one place a tree change is made; emptied after a
/// rollback (`Store.forgetCachedTree`). Not thread-safe: the store's lock guards it.
struct DirectoryCache {
    typealias Names = [NameKey: InodeNumber]

    let budget: Int
    private var newer: [InodeNumber: Names] = [:]
    private var older: [InodeNumber: Names] = [:]
    private var newerNames = 0
    private var olderNames = 0
    /// Directories found too big to load, since the last turn of the generations.
    private var tooBig: Set<InodeNumber> = []

    init(budget: Int) { self.budget = max(16, budget) }

    /// The most names a directory may have to be loaded.
    var largestLoaded: Int { budget / 8 }

    /// Names held now (tests, status).
    var names: Int { newerNames + olderNames }

    /// nil: `parent` is not loaded; `.some(nil)`: loaded, and `name` is not in it.
    mutating func lookUp(_ parent: InodeNumber, _ name: NameKey) -> InodeNumber?? {
        listing(parent).map { $0[name] }
    }

    /// All of `parent`'s names, if it is loaded (a hit, as a lookup's).
    mutating func listing(_ parent: InodeNumber) -> Names? {
        if let names = newer[parent] { return names }
        guard let names = older.removeValue(forKey: parent) else { return nil }
        olderNames -= names.count
        keep(parent, names)
        return names
    }

    /// How many names `parent` has, if it is loaded.
    func count(_ parent: InodeNumber) -> Int? { (newer[parent] ?? older[parent])?.count }

    /// Whether `parent` is known to be too big to load.
    func isTooBig(_ parent: InodeNumber) -> Bool { tooBig.contains(parent) }

    /// Notes that `parent` has more than `largestLoaded` names: not to be loaded.
    mutating func tooBigToLoad(_ parent: InodeNumber) {
        drop(parent)
        tooBig.insert(parent)
    }

    /// Holds `names` as `parent`'s whole listing, or, past `largestLoaded`, notes that it
    /// is not to be loaded.
    mutating func load(_ parent: InodeNumber, _ names: Names) {
        guard names.count <= largestLoaded else { return tooBigToLoad(parent) }
        drop(parent)
        keep(parent, names)
    }

    private mutating func keep(_ parent: InodeNumber, _ names: Names) {
        newer[parent] = names
        newerNames += names.count
        if newerNames >= budget / 2 { turn() }
    }

    private mutating func turn() {
        older = newer
        olderNames = newerNames
        newer = [:]
        newerNames = 0
        tooBig = []
    }

    /// A name made or changed: held if its directory is loaded (a directory that grows
    /// past `largestLoaded` is let go, as if too big to load).
    mutating func put(_ parent: InodeNumber, _ name: NameKey, _ id: InodeNumber) {
        if let names = older.removeValue(forKey: parent) {
            olderNames -= names.count
            newer[parent] = names
            newerNames += names.count
        }
        guard newer[parent] != nil else { return }
        if newer[parent]!.updateValue(id, forKey: name) == nil { newerNames += 1 }
        if newer[parent]!.count > largestLoaded {
            tooBigToLoad(parent)
        } else if newerNames >= budget / 2 {
            turn()
        }
    }

    mutating func remove(_ parent: InodeNumber, _ name: NameKey) {
        if newer[parent]?.removeValue(forKey: name) != nil { newerNames -= 1 }
        if older[parent]?.removeValue(forKey: name) != nil { olderNames -= 1 }
    }

    /// A directory gone (its inode dropped): its listing goes too.
    mutating func drop(_ parent: InodeNumber) {
        if let names = newer.removeValue(forKey: parent) { newerNames -= names.count }
        if let names = older.removeValue(forKey: parent) { olderNames -= names.count }
        tooBig.remove(parent)
    }

    mutating func removeAll() {
        newer = [:]
        older = [:]
        newerNames = 0
        olderNames = 0
        tooBig = []
    }
}
