#!/usr/bin/env bash
# One command from a fresh clone to a mounted ~/Cloud: installs the Debian packages that
# are missing (with sudo unless root), builds a release binary, installs it to
# ~/.local/bin with the systemd unit (scripts/install.sh), and mounts ~/Cloud with the
# embedded defaults. Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
for pkg in libfuse3-dev fuse3 libsqlite3-dev pkg-config; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
done
if [ ${#need[@]} -gt 0 ]; then
  echo "installing: ${need[*]}"
  sudo=""; [ "$(id -u)" = 0 ] || sudo=sudo
  $sudo apt-get update -qq
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}"
fi
command -v swift >/dev/null || { echo "swift is not on PATH: install Swift 6.x first (swift.org)"; exit 1; }

scripts/install.sh
bin="$HOME/.local/bin/ubiquity"
mnt="${1:-$HOME/Cloud}"
if findmnt -rn -M "$mnt" >/dev/null 2>&1; then
  echo "$mnt is already mounted"
else
  "$bin" mount "$mnt"
fi
echo "Try: echo hello > $mnt/notes.txt && ls $mnt/.versions/notes.txt/"
