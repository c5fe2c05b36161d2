#!/usr/bin/env bash
# Unmounts ubiquity test mounts left behind by an aborted earlier run (their paths all
# start with /tmp/ubiquity-test-). Never touches other mounts.
set -u
findmnt -rn -t fuse.ubiquity -o TARGET 2>/dev/null | while read -r target; do
  case "$target" in
    /tmp/ubiquity-test-*) fusermount3 -u -z "$target" 2>/dev/null && echo "swept stale test mount $target" ;;
  esac
done
exit 0
