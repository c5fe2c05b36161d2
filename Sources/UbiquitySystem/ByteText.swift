/// "1.5 MiB": sizes in reports and `ubiquity status`.
public func byteText(_ bytes: Int64) -> String {
    let units = ["bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"]
    var value = Double(bytes), unit = 0
    while value >= 1024 && unit < units.count - 1 { value /= 1024; unit += 1 }
    return unit == 0 ? "\(bytes) bytes" : String(Int(value * 10) / 10) + "." + String(Int(value * 10) % 10) + " " + units[unit]
}
