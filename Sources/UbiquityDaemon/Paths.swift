import Glibc
import UbiquityStore
import UbiquitySync
import UbiquitySystem

/// Where things live by default (XDG base directories), per container name.
public enum Paths {
    public static var home: String { env("HOME") ?? "/" }

    /// One default place per container, for `ubiquity mount` without a mount point and
    /// for the systemd unit alike: $UBIQUITY_MOUNTPOINT (the unit's per-container setting),
    /// else ~/Cloud for `default` and ~/Cloud-NAME for any other (never inside ~/Cloud, which
    /// would put one container's mount inside another's).
    public static func defaultMountpoint(container: String) -> String {
        if let set = env("UBIQUITY_MOUNTPOINT"), !set.isEmpty { return set }
        return container == "default" ? home + "/Cloud" : home + "/Cloud-" + container
    }

    public static func dataDirectory(container: String) -> String {
        let base = env("XDG_DATA_HOME").flatMap { $0.hasPrefix("/") ? $0 : nil } ?? home + "/.local/share"
        return base + "/ubiquity/" + container
    }

    /// The backing store `--backing` names, else $UBIQUITY_BACKING, else the container's
    /// own directory: a directory made absolute, or a URL as given.
    public static func backing(container: String, named: String?) -> String {
        (named ?? env("UBIQUITY_BACKING")).map { BackingChoice.isURL($0) ? $0 : absolute($0) }
            ?? dataDirectory(container: container) + "/backing"
    }

    /// The retention file of a container: `$XDG_CONFIG_HOME/ubiquity/<container>.retention`.
    public static func retentionFile(container: String) -> String { configDirectory + container + ".retention" }

    /// `$XDG_CONFIG_HOME/ubiquity/` (`~/.config/ubiquity/`): the containers' configuration files.
    static var configDirectory: String {
        (env("XDG_CONFIG_HOME").flatMap { $0.hasPrefix("/") ? $0 : nil } ?? home + "/.config") + "/ubiquity/"
    }

    /// The container's configuration file: `$XDG_CONFIG_HOME/ubiquity/<container>.conf`
    /// (`download = on-demand`, `fetch-timeout = 30`, `cache-size = 20G`).
    public static func configurationFile(container: String) -> String { configDirectory + container + ".conf" }

    /// How contents come and how much of them stays (files on demand).
    public struct DownloadSettings: Equatable {
        public var mode = DownloadMode.all
        public var fetchTimeout = 30.0
        /// Bytes of current contents kept here at most (nil: no limit).
        public var cacheSize: Int64?
    }

    /// The container's configuration file, then the mount's options (nil: not given).
    public static func downloadSettings(container: String, mode: String?, fetchTimeout: Double?,
                                        cacheSize: String? = nil) throws -> DownloadSettings {
        let file = configurationFile(container: container)
        var result = DownloadSettings()
        func apply(_ key: String, _ value: String, _ source: String) throws {
            switch key {
            case "download":
                guard let m = DownloadMode(rawValue: value) else { throw DaemonError.setting("\(source): download = \(value): expected all or on-demand") }
                result.mode = m
            case "fetch-timeout":
                guard let t = Double(value), t >= 1, t <= 3600 else { throw DaemonError.setting("\(source): fetch-timeout = \(value): expected seconds from 1 to 3600") }
                result.fetchTimeout = t
            case "cache-size":
                if value == "none" { result.cacheSize = nil; break }
                guard let bytes = RetentionPolicy.size(value), bytes > 0 else {
                    throw DaemonError.setting("\(source): cache-size = \(value): expected a size such as 500M, 20G or 1T, or none")
                }
                result.cacheSize = bytes
            default:
                throw DaemonError.setting("\(source): unknown setting `\(key)` (known: download, fetch-timeout, cache-size)")
            }
        }
        do {
            if let bytes = try readFile(file, limit: 1 << 20) {
                for setting in try configurationSettings(String(decoding: bytes, as: UTF8.self)) {
                    try apply(setting.key, setting.value, "\(file) line \(setting.line)")
                }
            }
        } catch let error as DaemonError { throw error } catch { throw DaemonError.setting("\(file): \(error)") }
        if let mode { try apply("download", mode, "--download") }
        if let fetchTimeout { try apply("fetch-timeout", String(fetchTimeout), "--fetch-timeout") }
        if let cacheSize { try apply("cache-size", cacheSize, "--cache-size") }
        return result
    }

    /// The container's retention policy: its file if there is one, else the default;
    /// `settings` (`key=value`, from mount options) replace what the file says.
    public static func retentionPolicy(container: String, settings: [String] = []) throws -> RetentionPolicy {
        let file = retentionFile(container: container)
        var policy = RetentionPolicy.standard
        do {
            if let bytes = try readFile(file, limit: 1 << 20) {
                policy = try RetentionPolicy(configuration: String(decoding: bytes, as: UTF8.self))
            }
            for setting in settings {
                let parts = setting.split(separator: "=", maxSplits: 1).map(String.init)
                guard parts.count == 2 else { throw StoreError.invalidConfiguration("--retention \(setting): expected KEY=VALUE") }
                try policy.set(parts[0], parts[1])
            }
        } catch let error as StoreError {
            throw DaemonError.setting("\(file): \(error)")
        } catch {
            throw DaemonError.setting("\(file): \(error)")
        }
        return policy
    }

    /// The key-value limits of a container: `$XDG_CONFIG_HOME/ubiquity/<container>.kv-limits`
    /// (`keys = 2048` lines) if there is one, then `settings` (`NAME=N`, from mount options).
    public static func keyValueLimits(container: String, settings: [String] = []) throws -> KVLimits {
        let file = configDirectory + container + ".kv-limits"
        do {
            var limits = KVLimits()
            if let bytes = try readFile(file, limit: 1 << 20) { limits = try KVLimits(configuration: String(decoding: bytes, as: UTF8.self)) }
            for setting in settings {
                let parts = setting.split(separator: "=", maxSplits: 1).map(String.init)
                guard parts.count == 2 else { throw StoreError.invalidConfiguration("--kv-limit \(setting): expected NAME=NUMBER") }
                try limits.set(parts[0], parts[1])
            }
            return limits
        } catch {
            throw DaemonError.setting("\(file): \(error)")
        }
    }

    public static func env(_ name: String) -> String? {
        guard let v = getenv(name) else { return nil }
        let s = String(cString: v)
        return s.isEmpty ? nil : s
    }

    /// An absolute, normalized path (the file need not exist; its parent should).
    public static func absolute(_ path: String) -> String {
        var p = path
        if p == "~" { p = home } else if p.hasPrefix("~/") { p = home + p.dropFirst(1) }
        if !p.hasPrefix("/") {
            var buffer = [CChar](repeating: 0, count: Int(PATH_MAX))
            let cwd = getcwd(&buffer, buffer.count).map { String(cString: $0) } ?? "/"
            p = cwd + "/" + p
        }
        if let resolved = realpath(p, nil) {
            defer { free(resolved) }
            return String(cString: resolved)
        }
        var parts: [Substring] = []
        for c in p.split(separator: "/") {
            if c == "." { continue }
            if c == ".." { _ = parts.popLast(); continue }
            parts.append(c)
        }
        return "/" + parts.joined(separator: "/")
    }

    /// The ubiquity mount containing `path`, and the path relative to its root.
    public static func mount(containing path: String) -> (entry: MountEntry, relative: String)? {
        let abs = absolute(path)
        let candidates = mountEntries().filter { $0.fstype == "fuse.ubiquity" }
        let best = candidates.filter { abs == $0.mountpoint || abs.hasPrefix($0.mountpoint == "/" ? "/" : $0.mountpoint + "/") }
            .max { $0.mountpoint.count < $1.mountpoint.count }
        guard let best else { return nil }
        let rel = String(abs.dropFirst(best.mountpoint.count)).drop { $0 == "/" }
        return (best, String(rel))
    }
}

