#!/usr/bin/env bash
# IntegrationTests/docs/run.sh: the documentation and what installs it.
#   - README commands, links in README.md and docs/, help text wrapping (check_docs.py);
#   - no comment in Sources tells the history of a change (scripts/check-comments.sh);
#   - the README stays short: at most 300 lines (it is for users; docs/ has the rest);
#   - scripts/install.sh into a scratch HOME installs a man page that `man ubiquity`
#     finds, and bash completions that a new bash loads and that complete subcommands.
# The last line is exactly "docs: passed" or the run fails.
#
#   UBIQUITY=/path/to/ubiquity IntegrationTests/docs/run.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
: "${UBIQUITY:?UBIQUITY must name the ubiquity binary (scripts/test.sh exports it)}"

python3 IntegrationTests/docs/check_docs.py "$UBIQUITY" .
scripts/check-comments.sh

home=$(mktemp -d /tmp/ubiquity-docs.XXXXXX)
trap 'rm -rf "$home"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

lines=$(wc -l <README.md)
((lines <= 300)) || fail "README.md has $lines lines, more than 300: move details to docs/"

# install.sh with a prebuilt binary into a scratch HOME, no systemd user manager asked.
env -u XDG_DATA_HOME -u XDG_CONFIG_HOME HOME="$home" UBIQUITY_BIN="$UBIQUITY" scripts/install.sh >"$home/install.log" 2>&1 ||
	{ cat "$home/install.log"; fail "install.sh failed"; }
page=$(env -u MANPATH HOME="$home" PATH="$home/.local/bin:/usr/bin:/bin" man -w ubiquity 2>&1) ||
	{ cat "$home/install.log"; fail "man -w ubiquity: $page"; }
[ "$page" = "$home/.local/share/man/man1/ubiquity.1" ] || fail "man found $page, not the installed page"
text=$(env -u MANPATH HOME="$home" PATH="$home/.local/bin:/usr/bin:/bin" MANWIDTH=100 man -P cat ubiquity 2>/dev/null)
for word in mount unmount status versions restore prune gc fsck kv query; do
	grep -qE "^ *(ubiquity )?$word\b" <<<"$text" || fail "the man page has no section for '$word'"
done
echo "man: ubiquity(1) found by man, with every command"

# A new bash with bash-completion loads ours on demand and completes a subcommand and
# an option.
complete_words() {
	env -i HOME="$home" PATH="$home/.local/bin:/usr/bin:/bin" TERM=dumb bash --norc --noprofile -c '
		source /usr/share/bash-completion/bash_completion
		__load_completion ubiquity || { echo "no completion loaded"; exit 1; }
		spec=$(complete -p ubiquity) || exit 1
		fn=${spec#*-F }; fn=${fn%% *}
		COMP_WORDS=("$@"); COMP_CWORD=$((${#COMP_WORDS[@]} - 1))
		COMP_LINE="${COMP_WORDS[*]}"; COMP_POINT=${#COMP_LINE}
		"$fn" ubiquity "${COMP_WORDS[COMP_CWORD]}" "${COMP_WORDS[COMP_CWORD-1]}"
		printf "%s\n" "${COMPREPLY[@]}"' bash "$@"
}
got=$(complete_words ubiquity mou) || fail "bash completion: $got"
grep -qx mount <<<"$got" || fail "bash completes 'ubiquity mou' to: $got"
got=$(complete_words ubiquity prune --dry) || fail "bash completion: $got"
grep -qx -- --dry-run <<<"$got" || fail "bash completes 'ubiquity prune --dry' to: $got"
for f in zsh/site-functions/_ubiquity fish/vendor_completions.d/ubiquity.fish; do
	grep -q 'prune' "$home/.local/share/$f" || fail "$f has no completions"
done
echo "completions: bash completes commands and options; zsh and fish files installed"
echo "docs: passed"
