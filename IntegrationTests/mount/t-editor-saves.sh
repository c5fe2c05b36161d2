#!/usr/bin/env bash
# Editor-style saves (write a temp file, then rename it over the target) must extend
# the target's own history by one version, change its user.ubiquity.version, and
# leave no history behind for the temp name: sed -i, a python temp+fsync+rename save,
# and vim when it is installed.
set -euo pipefail
source "$(dirname "$0")/lib.sh"

mount_fresh editors
mkdir "$MNT/docs"
cd "$MNT/docs"

# history_listing: every path that has a history, recursively (sorted), so a new
# history dir for a temp name anywhere is caught.
history_listing() { (cd "$MNT/.versions" && find . -mindepth 1 -type d | LC_ALL=C sort); }

# check_save FILE EXPECTED_CONTENT COUNT_BEFORE VERSION_BEFORE HISTORIES_BEFORE TOOL
check_save() {
  local f=$1 want=$2 n0=$3 v0=$4 h0=$5 tool=$6
  assert_file_content "$f" "$want" "$tool: content of $f after the save"
  assert_eq $((n0 + 1)) "$(version_count "docs/$f")" "$tool: entries in .versions/docs/$f"
  assert_eq $((n0 + 1)) "$(xattr "$f" user.ubiquity.versions)" "$tool: user.ubiquity.versions of $f"
  assert_ne "$v0" "$(xattr "$f" user.ubiquity.version)" "$tool: user.ubiquity.version of $f"
  local newest
  newest=$(version_names "docs/$f" | tail -n1)
  assert_file_content "$MNT/.versions/docs/$f/$newest" "$want" "$tool: newest version of $f"
  assert_eq "$h0" "$(history_listing)" "$tool: set of history dirs under .versions/ (a temp name got one?)"
  # No temp or scratch file may be left in the directory either.
  assert_eq "$f" "$(find . -mindepth 1 -maxdepth 1 -name "$f*" -printf '%f\n' | LC_ALL=C sort | tr '\n' ' ' | sed 's/ $//')" \
    "$tool: directory entries starting with $f"
}

step "sed -i (writes sedXXXXXX, renames it over the file)"
printf 'aaa\nalpha\n' >sed.txt
n0=$(version_count docs/sed.txt)
v0=$(xattr sed.txt user.ubiquity.version)
h0=$(history_listing)
assert_eq 1 "$n0" "versions after the first write of sed.txt"
sed -i 's/a/b/' sed.txt
check_save sed.txt $'baa\nblpha' "$n0" "$v0" "$h0" "sed -i"
assert_eq "" "$(find . -maxdepth 1 -name 'sed??????' -print)" "sed temp files left in docs/"

step "python: write temp, fsync, os.rename over the target"
echo original >py.txt
n0=$(version_count docs/py.txt)
v0=$(xattr py.txt user.ubiquity.version)
h0=$(history_listing)
python3 - <<'EOF'
import os
tmp = ".py.txt.tmp-save"
with open(tmp, "w") as f:
    f.write("saved by python\n")
    f.flush()
    os.fsync(f.fileno())
os.rename(tmp, "py.txt")
# Make the rename itself durable, as careful programs do.
d = os.open(".", os.O_RDONLY)
os.fsync(d)
os.close(d)
EOF
check_save py.txt "saved by python" "$n0" "$v0" "$h0" "python rename save"

step "the python save twice more: history keeps growing by one per save"
for i in 1 2; do
  python3 - "$i" <<'EOF'
import os, sys
with open("py.txt.new", "w") as f:
    f.write("save %s\n" % sys.argv[1]); f.flush(); os.fsync(f.fileno())
os.replace("py.txt.new", "py.txt")
EOF
done
assert_eq 4 "$(version_count docs/py.txt)" "versions of py.txt after three rename saves"
assert_file_content py.txt "save 2" "py.txt after the last rename save"

if command -v vim >/dev/null 2>&1; then
  step "vim -Es (swap file, backup file, 4913 probe, rename or rewrite)"
  printf 'banana\nxyz\n' >vim.txt
  n0=$(version_count docs/vim.txt)
  v0=$(xattr vim.txt user.ubiquity.version)
  h0=$(history_listing)
  # HOME points into the scratch dir so no ~/.viminfo is touched; stdin is closed so
  # any prompt (e.g. about a stale swap file) cannot hang the test.
  HOME=$WORK timeout 60 vim -Es -c '%s/a/b/' -c wq vim.txt </dev/null ||
    fail "vim exited with status $?"
  check_save vim.txt $'bbnana\nxyz' "$n0" "$v0" "$h0" "vim"
  scratch=$(cd "$MNT/.versions" && find . \( -name '*.swp' -o -name '*.swx' -o -name '*~' -o -name 4913 \) -print)
  assert_eq "" "$scratch" "vim scratch files (.swp/~/4913) with a history under .versions/"
  assert_eq "" "$(find . -maxdepth 1 \( -name '*.swp' -o -name '*~' -o -name 4913 \) -print)" \
    "vim scratch files left in docs/"
else
  log "vim is not installed: vim part not run (sed and python saves were checked)"
fi

step "the histories survive a remount"
remount
assert_eq 2 "$(version_count docs/sed.txt)" "versions of sed.txt after remount"
assert_eq 4 "$(version_count docs/py.txt)" "versions of py.txt after remount"

pass
