/// Devices by number (store format 13): a version row names the device that made it, and
/// the name the device had then, by a small integer (`versions.device`, a row of
/// `devices`) instead of 16 hex digits and the name in every row: a byte or two per
/// version instead of 20 to 40. Rows of `devices` are never deleted.
extension Store {
    static let devicesSchema = """
        CREATE TABLE IF NOT EXISTS devices(number INTEGER PRIMARY KEY, device_id TEXT NOT NULL, device_name TEXT NOT NULL,
                                           UNIQUE(device_id, device_name))
        """
}

extension Index {
    /// The number of `id` with `name`, added (in the caller's transaction) the first time
    /// it is met. This device's own is looked up once, at open (`ownDeviceNumber`), in a
    /// transaction of its own, so a rollback never leaves a number remembered that the
    /// database lost; other devices' are remembered for one pull slice (`TakeInMemo`, one
    /// transaction), else looked up each time.
    func deviceNumber(_ id: DeviceID, name: String) throws(StoreError) -> Int64 {
        if let own = ownDeviceNumber, id == deviceID, name.utf8.elementsEqual(deviceName.utf8) { return own }
        let key = NameKey(id.hex + "\u{0}" + name) // ids are hex: the first NUL ends the id
        if let known = takingIn?.devices[key] { return known }
        var number = try connection.rows("SELECT number FROM devices WHERE device_id = ? AND device_name = ?",
                                         [.device(id), .text(name)], { $0.int(0) }).first
        if number == nil {
            try connection.query("INSERT INTO devices(device_id, device_name) VALUES(?, ?)", [.device(id), .text(name)])
            number = connection.lastInsertRowID
        }
        takingIn?.devices[key] = number
        return number ?? 0
    }
}
