#!/usr/bin/env bash
# git inside the mount: clone a local repository of a few hundred files (several
# commits, branches, a tag, binary files, an executable and a symlink); the clone
# passes `git fsck --strict`, has a clean `git status`, every branch checks out, a
# commit made inside the mount works, and all of it holds after a remount.
# ubq-timeout: 150
set -euo pipefail
source "$(dirname "$0")/lib.sh"
require_cmd git

# make_repo DIR: the source repository, built outside the mount.
make_repo() {
  local src=$1 i d
  git init -q -b main "$src"
  cd "$src"
  for i in $(seq 1 320); do
    d=dir$((i % 16))/sub$((i % 3))
    mkdir -p "$d"
    printf 'file %d\n%s\n' "$i" "$(seq "$i" $((i + i % 40)) | tr '\n' ' ')" >"$d/f$i.txt"
  done
  head -c 300000 /dev/urandom >blob1.bin
  head -c 70000 /dev/urandom >dir1/blob2.bin
  printf '#!/bin/sh\necho hi\n' >run.sh
  chmod +x run.sh
  ln -s dir1/sub1 link-to-dir
  git add -A
  git commit -qm "initial: 320 text files, binaries, an executable, a symlink"
  git tag -a v1 -m "first release"

  git checkout -qb feature
  for i in $(seq 1 60); do echo "feature change $i" >>"dir$((i % 16))/sub$((i % 3))/f$i.txt"; done
  head -c 120000 /dev/urandom >feature.bin
  git rm -q dir8/sub2/f200.txt
  git add -A
  git commit -qm "feature work"
  echo more >>feature.bin
  git commit -qam "feature follow-up"

  git checkout -q main
  git checkout -qb hotfix
  echo "hotfix" >>dir3/sub0/f3.txt
  git commit -qam "hotfix"
  git checkout -q main
  git merge -q --no-ff --no-edit hotfix
  for i in $(seq 100 140); do echo "main change" >>"dir$((i % 16))/sub$((i % 3))/f$i.txt"; done
  git commit -qam "main changes"
  cd /
}

step "build the source repository outside the mount"
make_repo "$WORK/src"
nfiles=$(git -C "$WORK/src" ls-files | wc -l)
((nfiles >= 300)) || fail "source repo has only $nfiles files"

mount_fresh git

# git_check DIR WHAT: fsck --strict and a clean status.
git_check() {
  local out
  out=$(git -C "$1" fsck --strict --no-progress 2>&1) || fail "$2: git fsck --strict failed: $out"
  out=$(git -C "$1" status --porcelain) || fail "$2: git status failed"
  assert_eq "" "$out" "$2: git status --porcelain"
}

step "git clone (pack transport, file://) into the mount"
git clone -q "file://$WORK/src" "$MNT/repo"
git_check "$MNT/repo" "fresh clone"
assert_eq "$nfiles" "$(git -C "$MNT/repo" ls-files | wc -l)" "files tracked in the clone"
assert_eq "$(git -C "$WORK/src" rev-parse main)" "$(git -C "$MNT/repo" rev-parse HEAD)" "HEAD of the clone"
assert_same_file "$WORK/src/blob1.bin" "$MNT/repo/blob1.bin" "binary file in the checkout"
assert_eq "dir1/sub1" "$(readlink "$MNT/repo/link-to-dir")" "symlink in the checkout"
[[ -x $MNT/repo/run.sh ]] || fail "run.sh lost its executable bit in the checkout"

step "git clone of a local path (copies the object files) into the mount"
git clone -q "$WORK/src" "$MNT/repo-local"
git_check "$MNT/repo-local" "local-path clone"

step "check out every branch and the tag; the work tree matches git's view"
cd "$MNT/repo"
for ref in origin/feature origin/hotfix v1 main; do
  git checkout -q "$ref"
  git_check "$MNT/repo" "after checkout $ref"
done
# Compare the checked-out tree with the source's tree of the same commit, byte for byte.
git -C "$WORK/src" archive main | tar -x -C "$WORK" --one-top-level=expected
diff -r --no-dereference -q "$WORK/expected" "$MNT/repo" --exclude=.git >/dev/null ||
  fail "work tree of main in the mount differs from git archive: $(diff -r --no-dereference -q "$WORK/expected" "$MNT/repo" --exclude=.git | head -5)"

step "commit inside the mount (index.lock, ref updates, new objects)"
echo "made in the mount" >made-in-mount.txt
head -c 50000 /dev/urandom >made-in-mount.bin
git add made-in-mount.txt made-in-mount.bin
git rm -q dir4/sub1/f4.txt
git commit -qm "commit inside the mount"
git_check "$MNT/repo" "after a commit in the mount"
assert_eq "commit inside the mount" "$(git log -1 --format=%s)" "message of the new commit"
git checkout -qb branch-in-mount
echo again >>made-in-mount.txt
git commit -qam "second commit in the mount"
git checkout -q main
git merge -q --no-edit branch-in-mount
head=$(git rev-parse HEAD)

step "git gc (repack: many creates, renames and deletes) keeps the repository valid"
git gc -q --prune=now
git_check "$MNT/repo" "after git gc"

step "after a remount the repository is still valid and unchanged"
remount
git_check "$MNT/repo" "after remount"
git_check "$MNT/repo-local" "local-path clone after remount"
assert_eq "$head" "$(git -C "$MNT/repo" rev-parse HEAD)" "HEAD after remount"
assert_file_content "$MNT/repo/made-in-mount.txt" $'made in the mount\nagain' "made-in-mount.txt after remount"

pass
