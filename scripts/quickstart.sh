#!/usr/bin/env bash
# One command from a fresh clone to a mounted ~/Cloud: installs the Debian packages that
# are missing (with sudo unless root), builds a release binary, installs it to
# ~/.local/bin with the systemd unit (scripts/install.sh), and mounts ~/Cloud with the
# embedded defaults. Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."

. scripts/deps.sh
install_missing "${BUILD_PACKAGES[@]}"
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
