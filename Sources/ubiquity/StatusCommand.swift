import ArgumentParser
import Glibc
import UbiquityFUSE
import UbiquityStore

struct StatusCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "status",
        abstract: "Show mounted containers, or the status of one file.",
        discussion: "With a PATH inside a mount: its user.ubiquity.* attributes (version, versions, conflicts, ...).")

    @Argument(help: "A file inside a mount (optional).")
    var path: String?

    func run() throws {
        if let path {
            let abs = Paths.absolute(path)
            guard Paths.mount(containing: abs) != nil else { throw CLIError("\(abs) is not inside a ubiquity mount") }
            let names = try listXattrs(abs).filter { $0.hasPrefix("user.ubiquity.") }
            print(abs)
            for name in names {
                print("  \(name.dropFirst("user.ubiquity.".count)): \((try? getXattr(abs, name)) ?? "?")")
            }
            return
        }
        let mounts = mountEntries().filter { $0.fstype == "fuse.ubiquity" }
        if mounts.isEmpty { print("No ubiquity mounts. Start one with `ubiquity mount ~/Cloud`."); return }
        for m in mounts {
            print(m.mountpoint)
            print("  store: \(m.source)")
            if let store = try? Store(directory: m.source, readOnly: true) {
                print("  device: \(store.deviceName) (\(store.deviceID))")
                print("  versions: \(store.versionCount)")
            }
            if let pid = daemonPID(store: m.source) { print("  daemon pid: \(pid)") }
        }
    }
}

func listXattrs(_ path: String) throws -> [String] {
    let size = listxattr(path, nil, 0)
    guard size >= 0 else { throw CLIError("listxattr \(path): \(String(cString: strerror(errno)))") }
    var buffer = [CChar](repeating: 0, count: size + 1)
    let n = listxattr(path, &buffer, size)
    guard n >= 0 else { throw CLIError("listxattr \(path): \(String(cString: strerror(errno)))") }
    return buffer[0..<n].split(separator: 0).map { String(decoding: $0.map { UInt8(bitPattern: $0) }, as: UTF8.self) }
}

func getXattr(_ path: String, _ name: String) throws -> String {
    let size = getxattr(path, name, nil, 0)
    guard size >= 0 else { throw CLIError("getxattr \(name): \(String(cString: strerror(errno)))") }
    var buffer = [UInt8](repeating: 0, count: size)
    let n = getxattr(path, name, &buffer, size)
    guard n >= 0 else { throw CLIError("getxattr \(name): \(String(cString: strerror(errno)))") }
    return String(decoding: buffer[0..<n], as: UTF8.self)
}

// <sys/xattr.h> is not part of the Glibc module; the CFuse shim has it, but only the FUSE
// layer may import CFuse.
@_silgen_name("listxattr") private func listxattr(_ path: UnsafePointer<CChar>, _ list: UnsafeMutablePointer<CChar>?, _ size: Int) -> Int
@_silgen_name("getxattr") private func getxattr(_ path: UnsafePointer<CChar>, _ name: UnsafePointer<CChar>, _ value: UnsafeMutableRawPointer?, _ size: Int) -> Int
