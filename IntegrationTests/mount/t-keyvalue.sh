#!/usr/bin/env bash
# The key-value store through real mounts: both doors (`.kv/` files and `ubiquity kv`)
# show one state; types are checked at close and a refused value keeps the old one;
# limits answer EDQUOT / EFBIG / ENAMETOOLONG / EINVAL and the CLI's exit statuses say
# which; a key set on one device reaches the other; two devices that set one key while
# one is paused end with the same winner; values survive a restart and a kill -9.
# ubq-timeout: 240
set -euo pipefail
source "$(dirname "$0")/lib.sh"

DEVICE=alpha
mount_fresh kv --poll 0.2 --kv-limit keys=20 --kv-limit bytes=4096 --kv-limit value=1000
A=$MNT
mount_device beta --poll 0.2 --kv-limit keys=20 --kv-limit bytes=4096 --kv-limit value=1000
B=$(mnt_of beta)
on_failure dump_sync_state

# kv_get MNT KEY: the CLI's value, "" and no failure when the key is missing.
kv_get() { "$UBIQUITY" kv get "$2" --mount "$1" 2>/dev/null || true; }
# kv_status CMD...: the exit status of a `ubiquity kv` command.
kv_status() { local rc=0; "$UBIQUITY" kv "$@" >/dev/null 2>&1 || rc=$?; echo "$rc"; }

step "ubiquity kv set, then .kv/ shows it: one file per key, its type in an xattr"
ubq kv set selectedColorIndex 2 --type integer --mount "$A"
assert_eq 2 "$(cat "$A/.kv/selectedColorIndex")" "cat .kv/selectedColorIndex"
assert_eq integer "$(xattr "$A/.kv/selectedColorIndex" user.ubiquity.kv.type)" "its type xattr"
assert_eq selectedColorIndex "$(ls "$A/.kv")" "ls .kv"
assert_not_contains "$(ls -a "$A")" ".kv" "the root listing (hidden like .versions)"

step "the files' door: echo sets (a new key is a string), rm deletes; the CLI sees both"
echo "Ada" >"$A/.kv/name"
assert_eq Ada "$(kv_get "$A" name)" "kv get name after echo > .kv/name"
assert_eq string "$(xattr "$A/.kv/name" user.ubiquity.kv.type)" "type of a key made by echo"
rm "$A/.kv/name"
assert_eq 1 "$(kv_status get name --mount "$A")" "exit status of kv get of a deleted key"
assert_missing "$A/.kv/name"

step "a value that is not its type is refused at close (EINVAL) and the old value stays"
assert_errno EINVAL "fd = os.open('$A/.kv/selectedColorIndex', os.O_WRONLY | os.O_TRUNC); os.write(fd, b'red'); os.close(fd)" \
  "close of .kv/selectedColorIndex after writing text into an integer"
assert_eq 2 "$(cat "$A/.kv/selectedColorIndex")" "the old value after the refused write"
assert_eq 2 "$(kv_status set selectedColorIndex red --mount "$A")" "exit status of a refused kv set"
assert_contains "$("$UBIQUITY" kv set selectedColorIndex red --mount "$A" 2>&1 || true)" "refused" "kv set's message"
assert_errno EINVAL "os.setxattr('$A/.kv/selectedColorIndex', 'user.ubiquity.kv.type', b'date')" "converting 2 to a date"
ubq kv set when "2026-11-24T09:00:00+01:00" --type date --mount "$A"
assert_eq "2026-11-24T08:00:00.000Z" "$(cat "$A/.kv/when")" "a date, kept in UTC"
ubq kv set tags '["a", 1, 2.5, true]' --type array --mount "$A"
tags_json=$(ubq kv get tags --json --mount "$A")
assert_eq 1 "$(json_count '{"key":"tags","type":"array","value":["a",1,2.5,true]}' <<<"$tags_json")" "kv get --json of an array: $tags_json"
assert_eq '["a",1,2.5,true]' "$(cat "$A/.kv/tags")" "an array as compact JSON"

step "limits: a key over 64 bytes (ENAMETOOLONG), a value over 1000 (EFBIG), a full store (EDQUOT)"
long=$(printf 'k%.0s' $(seq 65))
assert_errno ENAMETOOLONG "open('$A/.kv/$long', 'w').close()" "a key of 65 bytes"
assert_eq 2 "$(kv_status set "$long" x --mount "$A")" "exit status of kv set with a long key"
assert_errno EFBIG "fd = os.open('$A/.kv/big', os.O_WRONLY | os.O_CREAT); os.write(fd, b'x' * 1000); os.write(fd, b'y')" \
  "a write past 1000 bytes"
assert_errno EFBIG "fd = os.open('$A/.kv/big', os.O_WRONLY | os.O_CREAT); os.write(fd, b'x' * 999)
try: os.write(fd, b'yy')
except OSError: pass
os.close(fd)" "the close after a write past the limit (nothing of it is set)"
assert_missing "$A/.kv/big"
head -c 1000 /dev/zero | tr '\0' x >"$A/.kv/big"
assert_eq 1000 "$(stat -c %s "$A/.kv/big")" "a value of exactly the limit"
for i in $(seq 16); do printf 'v%s' "$i" >"$A/.kv/k$i"; done
assert_eq 20 "$(ls "$A/.kv" | wc -l)" "keys after filling the store to its limit of 20"
assert_errno EDQUOT "f = open('$A/.kv/one-more', 'w'); f.write('x'); f.close()" "a 21st key (refused at its close)"
msg=$("$UBIQUITY" kv set one-more x --mount "$A" 2>&1 || true)
assert_contains "$msg" "20 of 20 keys" "kv set's message names the limit and the use"
assert_eq 2 "$(kv_status set one-more x --mount "$A")" "exit status of kv set into a full store"
for i in $(seq 16); do rm "$A/.kv/k$i"; done

step "hostile calls on key files get an errno and the daemon stays up"
ubq kv set n 5 --type integer --mount "$A"
assert_errno EFBIG "os.truncate('$A/.kv/n', 1 << 50)" "truncate -s 1P of a key file"
assert_errno EFBIG "fd = os.open('$A/.kv/n', os.O_WRONLY); os.pwrite(fd, b'x', (1 << 62) - 1)" "a write at 2^62"
assert_errno EINVAL "os.setxattr('$A/.kv/n', 'user.ubiquity.kv.type', b'nonsense')" "an unknown type"
assert_errno "ENOTSUP|EOPNOTSUPP" "os.setxattr('$A/.kv/n', 'user.other', b'x')" "another xattr on a key file"
assert_errno EXDEV "os.rename('$A/.kv/n', '$A/.kv/m')" "rename of a key (mv copies and removes)"
assert_errno EROFS "os.mkdir('$A/.kv/dir')" "a directory in .kv"
assert_errno EROFS "os.symlink('x', '$A/.kv/link')" "a symlink in .kv"
assert_errno "EEXIST|EROFS" "os.mkdir('$A/.kv')" "a directory named .kv at the root"
assert_contains "$(xattr "$A/.kv" user.ubiquity.kv.limits)" "keys=20" "the limits on .kv"
assert_eq 5 "$(cat "$A/.kv/n")" "the value after all that"
assert_daemon_alive alpha
ubq kv rm n --mount "$A"

step "a key set on alpha reaches beta; a delete on beta reaches alpha"
wait_eq 2 "selectedColorIndex on beta" kv_get "$B" selectedColorIndex
ubq kv rm when --mount "$B"
wait_eq "" "when on alpha after beta deleted it" kv_get "$A" when

step "both devices set one key while beta is paused: the same winner on both"
pause_dev "$B"
ubq kv set selectedColorIndex 1 --mount "$B"
sleep 0.05
ubq kv set selectedColorIndex 0 --mount "$A"
sleep 1
assert_eq 1 "$(kv_get "$B" selectedColorIndex)" "beta's own value while paused"
resume_dev "$B"
sync_all
wait_eq 0 "selectedColorIndex on beta (alpha wrote later)" kv_get "$B" selectedColorIndex
assert_eq 0 "$(kv_get "$A" selectedColorIndex)" "selectedColorIndex on alpha"

step "tinypix --color draws in the tint of selectedColorIndex; cat of the file stays the same"
"$UBIQUITY" tinypix --new "$A/smile.tinypix" >/dev/null
plain=$(cat "$A/smile.tinypix")
assert_eq "$plain" "$("$UBIQUITY" tinypix "$A/smile.tinypix")" "the plain grid"
assert_contains "$("$UBIQUITY" tinypix --color "$A/smile.tinypix" | od -c | tr -s ' ')" "[ 3 1 m #" "the grid in red (index 0)"
ubq kv set selectedColorIndex 2 --mount "$A"
assert_contains "$("$UBIQUITY" tinypix --color "$A/smile.tinypix" | od -c | tr -s ' ')" "[ 3 4 m #" "the grid in blue (index 2)"
assert_eq "$plain" "$(cat "$A/smile.tinypix")" "cat of the picture after the tint changed"
ubq kv set selectedColorIndex 7 --mount "$A"
assert_contains "$("$UBIQUITY" tinypix --color "$A/smile.tinypix" | od -c | tr -s ' ')" "[ 3 1 m #" "index 7 draws red"
ubq kv set selectedColorIndex 0 --mount "$A"

step "the key-value state survives a restart and a kill -9 right after the set returns"
remount
assert_eq 0 "$(kv_get "$A" selectedColorIndex)" "after a remount"
ubq kv set crashproof yes --type bool --mount "$A"
crash_daemon
_ubq_mount
assert_eq true "$(kv_get "$A" crashproof)" "a bool set just before kill -9"

step "a store of format 19 (the keys in meta.sqlite) upgrades at mount, after a crash mid-upgrade too"
keys_before=$(ls "$A/.kv")
unmount_it
# Back to format 19: the rows and the two settings into meta.sqlite, no kv.sqlite; and a
# kv.sqlite.new half written, as a crash before the upgrade's rename leaves it.
python3 - "$STORE" <<'PY'
import os, sqlite3, sys
store = sys.argv[1]
meta = sqlite3.connect(store + "/meta.sqlite")
meta.execute("""CREATE TABLE kv(key TEXT PRIMARY KEY, type INTEGER NOT NULL, value BLOB NOT NULL,
                stamp INTEGER NOT NULL, device TEXT NOT NULL, device_name TEXT NOT NULL,
                tombstone INTEGER NOT NULL) WITHOUT ROWID""")
meta.execute("ATTACH DATABASE ? AS new", (store + "/kv.sqlite",))
meta.execute("INSERT INTO kv SELECT key, type, value, stamp, device, device_name, tombstone FROM new.kv")
meta.execute("INSERT INTO settings(key, value) SELECT 'kv_' || key, value FROM new.kv_state")
meta.commit()
meta.execute("DETACH DATABASE new")
meta.execute("UPDATE settings SET value = '19' WHERE key = 'format'")
meta.commit()
meta.close()
for suffix in ("", "-wal", "-shm"):
    if os.path.exists(store + "/kv.sqlite" + suffix):
        os.unlink(store + "/kv.sqlite" + suffix)
with open(store + "/kv.sqlite.new", "wb") as f:
    f.write(b"SQLite format 3\0 cut short")
PY
_ubq_mount
assert_eq true "$(kv_get "$A" crashproof)" "crashproof after the upgrade"
assert_eq 0 "$(kv_get "$A" selectedColorIndex)" "selectedColorIndex after the upgrade"
assert_eq "$keys_before" "$(ls "$A/.kv")" "ls .kv after the upgrade"
assert_eq "0 True" "$(python3 -c 'import sqlite3, sys; c = sqlite3.connect(sys.argv[1]); print(c.execute("SELECT count(*) FROM sqlite_master WHERE name = ?", ("kv",)).fetchone()[0], int(c.execute("SELECT value FROM settings WHERE key = ?", ("format",)).fetchone()[0]) >= 20)' "$STORE/meta.sqlite")" "meta.sqlite's old table gone, format 20 or later"
assert_missing "$STORE/kv.sqlite.new"
ubq kv set afterUpgrade 1 --type integer --mount "$A"
wait_eq 1 "a key set after the upgrade, on beta" kv_get "$B" afterUpgrade
pass
