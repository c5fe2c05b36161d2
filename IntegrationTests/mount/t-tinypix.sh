#!/usr/bin/env bash
# TinyPix through a real mount (issue 3, DESIGN §1.2): the 8 stored bytes read as the
# 72-byte grid, a grid written through the mount is stored as 8 bytes, sed -i edits a
# row, an invalid grid is refused at close (EINVAL) and the old picture stays, versions
# render as grids, and the CLI renders a raw file outside the mount.
set -euo pipefail
source "$(dirname "$0")/lib.sh"

mount_fresh tinypix
cd "$MNT"
diagonal=$'.......#\n......#.\n.....#..\n....#...\n...#....\n..#.....\n.#......\n#.......'

step "the 8 bytes 01 02 04 08 10 20 40 80 read as the diagonal"
printf '\x01\x02\x04\x08\x10\x20\x40\x80' > new.tinypix
assert_file_content new.tinypix "$diagonal" "cat of new.tinypix"
assert_eq 72 "$(stat -c %s new.tinypix)" "st_size of a rendered picture"
assert_eq 72 "$(wc -c < new.tinypix)" "bytes read"
assert_eq 0102040810204080 "$(xattr new.tinypix user.ubiquity.raw)" "raw bytes (user.ubiquity.raw)"
assert_eq grid "$(xattr new.tinypix user.ubiquity.tinypix)" "user.ubiquity.tinypix"

step "a smiley written as a grid reads back identical and is stored as 8 bytes"
smiley=$'..####..\n.#....#.\n#.#..#.#\n#......#\n#.#..#.#\n#..##..#\n.#....#.\n..####..'
printf '%s\n' "$smiley" > smiley.tinypix
assert_file_content smiley.tinypix "$smiley" "smiley read back"
assert_eq 3c42a581a599423c "$(xattr smiley.tinypix user.ubiquity.raw)" "smiley stored bytes"
cp smiley.tinypix copy.tinypix
assert_file_content copy.tinypix "$smiley" "cp of a grid file"

step "sed -i edits a row"
sed -i '1s/.*/########/' smiley.tinypix
assert_eq "########" "$(head -1 smiley.tinypix)" "first row after sed -i"
assert_eq ff42a581a599423c "$(xattr smiley.tinypix user.ubiquity.raw)" "stored bytes after sed -i"

vim=$(command -v vim || command -v vim.tiny || true)
if [[ -n $vim ]]; then
  step "vim edits a row ($vim)"
  "$vim" -Es -c '2s/.*/XXXXXXXX/' -c wq smiley.tinypix
  assert_eq "########" "$(sed -n 2p smiley.tinypix)" "second row after vim"
  assert_eq ffffa581a599423c "$(xattr smiley.tinypix user.ubiquity.raw)" "stored bytes after vim"
  sed -i '2s/.*/.#....#./' smiley.tinypix
else
  log "vim is not installed: vim step skipped (CI installs vim-tiny)"
fi

step "versions render as grids"
mapfile -t names < <(version_names smiley.tinypix)
assert_eq "$([[ -n $vim ]] && echo 4 || echo 2)" "${#names[@]}" "versions of smiley.tinypix"
[[ ${names[0]} == *.tinypix ]] || fail "version name ${names[0]} lost the extension"
assert_file_content ".versions/smiley.tinypix/${names[0]}" "$smiley" "first version as a grid"
assert_eq 72 "$(stat -c %s ".versions/smiley.tinypix/${names[0]}")" "size of a version"

step "an invalid grid is refused at close with EINVAL; the old picture remains"
assert_errno EINVAL "fd = os.open('smiley.tinypix', os.O_WRONLY | os.O_TRUNC); os.write(fd, b'this is not a picture\n'); os.close(fd)" "close of an invalid grid"
assert_eq ff42a581a599423c "$(xattr smiley.tinypix user.ubiquity.raw)" "stored bytes after the refused write"
assert_eq "########" "$(head -1 smiley.tinypix)" "picture after the refused write"
assert_eq "${#names[@]}" "$(version_count smiley.tinypix)" "no version for the refused write"
log_text=$(cat "$STORE"/daemon.log)
assert_contains "$log_text" "smiley.tinypix: refused: line 1, column 1" "log line naming the line and column"

step "a stored file that is not 8 bytes is shown as is"
# Writing 5 bytes to a .tinypix is refused, so make one by renaming (sync will too).
assert_errno EINVAL "fd = os.open('bad.tinypix', os.O_WRONLY | os.O_CREAT); os.write(fd, b'hello'); os.close(fd)" "close after writing 5 bytes"
printf 'hello' > odd.txt
mv odd.txt odd.tinypix
assert_file_content odd.tinypix hello "5-byte .tinypix"
assert_eq as-is "$(xattr odd.tinypix user.ubiquity.tinypix)" "flag for a non-8-byte file"

step "ubiquity tinypix renders a raw file outside the mount"
printf '\x01\x02\x04\x08\x10\x20\x40\x80' > "$TEST_PREFIX"raw.tinypix
assert_eq "$diagonal" "$("$UBIQUITY" tinypix "$TEST_PREFIX"raw.tinypix)" "CLI render"

cd /
unmount_it
pass
