import Glibc

/// "2026-11-22T13:45:01Z".
public func isoTime(_ nanos: Int64) -> String {
    var seconds = time_t(nanos / 1_000_000_000)
    var t = tm()
    gmtime_r(&seconds, &t)
    func pad(_ v: Int32, _ width: Int) -> String {
        let s = String(v)
        return String(repeating: "0", count: max(0, width - s.count)) + s
    }
    return "\(pad(t.tm_year + 1900, 4))-\(pad(t.tm_mon + 1, 2))-\(pad(t.tm_mday, 2))T\(pad(t.tm_hour, 2)):\(pad(t.tm_min, 2)):\(pad(t.tm_sec, 2))Z"
}
