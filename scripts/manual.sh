#!/usr/bin/env bash
# scripts/manual.sh BIN OUTDIR: writes OUTDIR/ubiquity.1, the man page of the ubiquity
# binary BIN, generated from its argument parser (every command, option and help text),
# so the page can never disagree with `--help`. The generator is swift-argument-parser's
# own `generate-manual` tool, built once from the package's checkout into
# .build/tools (the checkout exists after any `swift build` of this repository).
set -euo pipefail

[ $# -eq 2 ] || { echo "usage: scripts/manual.sh BIN OUTDIR" >&2; exit 2; }
bin=$1 out=$2
repo=$(cd "$(dirname "$0")/.." && pwd)
parser=$repo/.build/checkouts/swift-argument-parser
[ -f "$parser/Package.swift" ] || {
	echo "manual.sh: no swift-argument-parser checkout in $repo/.build: run 'swift build' first" >&2
	exit 1
}
scratch=$repo/.build/tools
tool=$scratch/debug/generate-manual
if [ ! -x "$tool" ] || [ "$parser/Package.swift" -nt "$tool" ]; then
	echo "manual.sh: building swift-argument-parser's generate-manual (once)" >&2
	swift build --package-path "$parser" --scratch-path "$scratch" --product generate-manual >&2
fi
mkdir -p "$out"
# One page for all commands (ubiquity(1), its subcommands as sections), dated by the
# last commit so that a rebuild of the same tree makes the same page.
date=$(git -C "$repo" log -1 --format=%cs 2>/dev/null || date +%F)
"$tool" "$bin" --date "$date" --output-directory "$out" >&2
[ -s "$out/ubiquity.1" ] || { echo "manual.sh: $out/ubiquity.1 was not written" >&2; exit 1; }
