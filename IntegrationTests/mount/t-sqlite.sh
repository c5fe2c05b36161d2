#!/usr/bin/env bash
# SQLite databases inside the mount, in WAL and in rollback-journal mode: thousands of
# rows in many transactions, updates and deletes; `pragma integrity_check` is ok and
# the content is the same after a remount. Also a WAL database whose writer died
# without checkpointing: the committed transactions in the -wal file survive.
# ubq-timeout: 120
set -euo pipefail
source "$(dirname "$0")/lib.sh"
require_cmd sqlite3

mount_fresh sqlite
mkdir "$MNT/db"

# workload MODE: SQL that builds a table of 3000 rows in 60 transactions, then
# changes and deletes some of them in further transactions.
workload() {
  local t
  echo "pragma journal_mode=$1;"
  echo "create table t(id integer primary key, k text unique, v text, b blob);"
  for t in $(seq 0 59); do
    echo "begin;"
    echo "with recursive c(x) as (select 1 union all select x + 1 from c where x < 50)
          insert into t(k, v, b) select 'k$t-' || x, printf('value %d %d', $t, x), randomblob(64 + x * 7) from c;"
    echo "commit;"
  done
  echo "begin; update t set v = v || ' updated' where id % 3 = 0; commit;"
  echo "begin; delete from t where id % 7 = 0; commit;"
  echo "create index t_v on t(v);"
  echo "begin; insert into t(k, v, b) select 'copy-' || k, v, b from t where id % 11 = 0; commit;"
}

# check DB WHAT: integrity_check must print exactly "ok".
check() {
  local out
  out=$(sqlite3 "$1" 'pragma integrity_check;' 2>&1) || fail "$2: sqlite3 failed: $out"
  assert_eq ok "$out" "$2: pragma integrity_check"
}

# digest DB: a hash of the full SQL dump, so any changed byte of any row shows.
digest() { sqlite3 "$1" .dump | sha256sum | cut -d' ' -f1; }

for mode in wal delete; do
  step "journal_mode=$mode: build the database"
  db="$MNT/db/$mode.db"
  mode_out=$(workload "$mode" | sqlite3 -bail "$db" 2>&1) || fail "sqlite3 workload ($mode) failed: $mode_out"
  assert_eq "$mode" "$(head -n1 <<<"$mode_out")" "journal mode reported by sqlite"
  check "$db" "$mode"
  rows=$(sqlite3 "$db" 'select count(*) from t;')
  ((rows > 2500)) || fail "$mode: expected more than 2500 rows, got $rows"
  printf -v "digest_$mode" '%s' "$(digest "$db")"
  printf -v "rows_$mode" '%s' "$rows"
done
assert_eq "" "$(find "$MNT/db" -name '*-journal' -o -name '*-wal' | head -n1)" \
  "journal/wal files left after sqlite3 closed cleanly"

step "a WAL writer that dies without checkpointing leaves its committed frames in -wal"
python3 - "$MNT/db/crash.db" <<'EOF'
import os, sqlite3, sys
con = sqlite3.connect(sys.argv[1], isolation_level=None)
con.execute("pragma journal_mode=wal")
con.execute("pragma wal_autocheckpoint=0")   # keep everything in the -wal file
con.execute("create table t(id integer primary key, v text)")
for i in range(40):
    con.execute("begin")
    con.executemany("insert into t(v) values (?)", [("row %d %d" % (i, j),) for j in range(50)])
    con.execute("commit")
os._exit(0)   # no close, no checkpoint: like a crash right after the last commit
EOF
[[ -s $MNT/db/crash.db-wal ]] || fail "expected a non-empty crash.db-wal after the writer died"
# Not opened again before the remount: the last connection to close would checkpoint
# and delete the -wal, and the point is that the -wal itself survives.
wal_sum=$(sha256sum <"$MNT/db/crash.db-wal")

step "remount: both databases unchanged and intact"
remount
for mode in wal delete; do
  db="$MNT/db/$mode.db"
  check "$db" "$mode after remount"
  want_rows="rows_$mode" want_digest="digest_$mode"
  assert_eq "${!want_rows}" "$(sqlite3 "$db" 'select count(*) from t;')" "$mode: rows after remount"
  assert_eq "${!want_digest}" "$(digest "$db")" "$mode: sha256 of .dump after remount"
done
assert_eq "$wal_sum" "$(sha256sum <"$MNT/db/crash.db-wal")" "sha256 of crash.db-wal after remount"
check "$MNT/db/crash.db" "crash.db after remount"
assert_eq 2000 "$(sqlite3 "$MNT/db/crash.db" 'select count(*) from t;')" "rows in crash.db after remount"

step "write again after the remount, then check once more"
sqlite3 -bail "$MNT/db/wal.db" "begin; delete from t where id % 5 = 0; commit; vacuum;"
check "$MNT/db/wal.db" "wal.db after delete+vacuum"
sqlite3 -bail "$MNT/db/delete.db" "begin; update t set b = randomblob(500) where id % 4 = 0; commit;"
check "$MNT/db/delete.db" "delete.db after more updates"

pass
