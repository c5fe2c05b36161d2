#!/usr/bin/env bash
# scripts/install.sh: install ubiquity for the current user, with the systemd user unit
# that mounts a container at login (systemd/ubiquity@.service). Run it as that user, not
# with sudo. Safe to run again: unchanged files are left as they are.
#
#   scripts/install.sh                     build (swift build -c release), then install
#   UBIQUITY_BIN=PATH scripts/install.sh   install this prebuilt binary instead
#   scripts/install.sh --enable NAME       also mount container NAME now and at each login
#   scripts/install.sh --uninstall         stop and disable every ubiquity@ unit, then
#                                          remove the binary and the unit file
#
# Files: ~/.local/bin/ubiquity (the unit runs it from there),
# ${XDG_CONFIG_HOME:-~/.config}/systemd/user/ubiquity@.service, the man page
# ~/.local/share/man/man1/ubiquity.1 (man finds it through ~/.local/bin in PATH), and
# completions that bash-completion, zsh and fish read:
# ~/.local/share/bash-completion/completions/ubiquity,
# ~/.local/share/zsh/site-functions/_ubiquity (add that folder to zsh's fpath) and
# ~/.local/share/fish/vendor_completions.d/ubiquity.fish. Never touched: your data
# (~/.local/share/ubiquity/) and your settings (~/.config/ubiquity/NAME.env).
set -euo pipefail

usage() { awk 'NR == 1 { next } /^#/ { sub(/^# ?/, ""); print; next } { exit }' "$0"; }
say() { printf 'install.sh: %s\n' "$*"; }
die() { printf 'install.sh: error: %s\n' "$*" >&2; exit 1; }

repo=$(cd "$(dirname "$0")/.." && pwd)
: "${HOME:?HOME is not set}"
bin_dir=$HOME/.local/bin
unit_dir=${XDG_CONFIG_HOME:-$HOME/.config}/systemd/user
bin=$bin_dir/ubiquity
unit=$unit_dir/ubiquity@.service
share=${XDG_DATA_HOME:-$HOME/.local/share}
manual=$share/man/man1/ubiquity.1
bash_completion=$share/bash-completion/completions/ubiquity
zsh_completion=$share/zsh/site-functions/_ubiquity
fish_completion=$share/fish/vendor_completions.d/ubiquity.fish

mode=install enable=
while [ $# -gt 0 ]; do
	case $1 in
	-h | --help) usage; exit 0 ;;
	--uninstall) mode=uninstall ;;
	--enable) [ $# -ge 2 ] || die "--enable needs a container name"; enable=$2; shift ;;
	--enable=*) enable=${1#--enable=} ;;
	*) die "unknown argument '$1' (see --help)" ;;
	esac
	shift
done
[ "$mode" = uninstall ] && [ -n "$enable" ] && die "--enable and --uninstall exclude each other"
# The instance name becomes a path component and a unit name: keep it plain.
[ -z "$enable" ] || [[ $enable =~ ^[A-Za-z0-9][A-Za-z0-9._-]*$ ]] ||
	die "container name '$enable': use letters, digits, '.', '_' and '-'"
if [ "$(id -u)" = 0 ] && [ -n "${SUDO_USER:-}" ]; then
	say "warning: running as root under sudo installs for root ($HOME), not for $SUDO_USER"
fi

# True when a systemd user manager answers (not so in a plain container, over some su/ssh
# sessions without XDG_RUNTIME_DIR, or when systemd is not PID 1).
have_manager() { command -v systemctl >/dev/null && systemctl --user show -P Version >/dev/null 2>&1; }

# put SRC DEST MODE: copy through a temp file and rename, so that a running daemon's
# binary is replaced, never rewritten in place.
put() {
	if cmp -s "$1" "$2"; then
		say "unchanged $2"
		return
	fi
	mkdir -p "$(dirname "$2")"
	cp "$1" "$2.tmp.$$"
	chmod "$3" "$2.tmp.$$"
	mv -f "$2.tmp.$$" "$2"
	say "installed $2"
}

install_all() {
	local src=${UBIQUITY_BIN:-}
	if [ -n "$src" ]; then
		[ -f "$src" ] && [ -x "$src" ] || die "UBIQUITY_BIN=$src is not an executable file"
	else
		command -v swift >/dev/null || die "swift not found: install a Swift toolchain, or pass a prebuilt binary with UBIQUITY_BIN=PATH"
		say "building: swift build -c release"
		swift build -c release --package-path "$repo" >&2
		src=$(swift build -c release --package-path "$repo" --show-bin-path)/ubiquity
	fi
	"$src" --help >/dev/null 2>&1 || die "$src does not run (missing Swift runtime libraries?)"

	put "$src" "$bin" 755
	put "$repo/systemd/ubiquity@.service" "$unit" 644
	install_help "$bin"

	command -v fusermount3 >/dev/null ||
		say "warning: fusermount3 not found; mounting needs it: sudo apt-get install fuse3"
	case ":$PATH:" in
	*":$bin_dir:"*) ;;
	*) say "note: $bin_dir is not in PATH; add it to run 'ubiquity' by name" ;;
	esac

	if ! have_manager; then
		say "no systemd user manager reachable: skipped 'systemctl --user daemon-reload'"
		[ -z "$enable" ] || die "cannot enable ubiquity@$enable without a user manager"
		say "once you are logged in to a systemd session, run: systemctl --user daemon-reload"
		say "and to mount container 'default' at ~/Cloud now and at every login:"
		say "  systemctl --user enable --now ubiquity@default"
		return
	fi
	systemctl --user daemon-reload
	say "reloaded the systemd user manager"
	local running
	running=$(systemctl --user list-units --state=active --plain --no-legend 'ubiquity@*.service' | awk '{print $1}') || true
	[ -z "$running" ] || say "running now (restart to use a new binary): ${running//$'\n'/ }"
	if [ -n "$enable" ]; then
		systemctl --user enable --now "ubiquity@$enable.service"
		say "enabled and started ubiquity@$enable: mounted at $( [ "$enable" = default ] && echo "~/Cloud" || echo "~/Cloud-$enable") unless ~/.config/ubiquity/$enable.env sets UBIQUITY_MOUNTPOINT"
		say "its log: journalctl --user -u ubiquity@$enable"
	else
		say "to mount container 'default' at ~/Cloud now and at every login, run:"
		say "  systemctl --user enable --now ubiquity@default"
	fi
}

# install_help BIN: the man page and the shell completions, both generated from BIN's
# argument parser, so they always match the installed binary.
install_help() {
	local tmp shell
	tmp=$(mktemp -d)
	for shell in bash zsh fish; do
		"$1" --generate-completion-script "$shell" >"$tmp/$shell" || die "$1 cannot write its $shell completions"
	done
	put "$tmp/bash" "$bash_completion" 644
	put "$tmp/zsh" "$zsh_completion" 644
	put "$tmp/fish" "$fish_completion" 644
	if "$repo/scripts/manual.sh" "$1" "$tmp" 2>"$tmp/manual.log"; then
		put "$tmp/ubiquity.1" "$manual" 644
	else
		say "warning: no man page: $(tail -n 1 "$tmp/manual.log")"
	fi
	rm -rf "$tmp"
	command -v man >/dev/null || say "note: 'man' is not installed (sudo apt-get install man-db); 'ubiquity --help' says the same"
}

uninstall_all() {
	# Instances: those the manager knows, plus those enabled (links in *.wants/ dirs).
	local -a units=() links=()
	mapfile -t links < <(find "$unit_dir" -path '*.wants/ubiquity@*.service' 2>/dev/null)
	if have_manager; then
		mapfile -t units < <(systemctl --user list-units --all --plain --no-legend 'ubiquity@*.service' | awk '{print $1}')
	fi
	local l
	for l in "${links[@]}"; do units+=("${l##*/}"); done
	mapfile -t units < <(printf '%s\n' "${units[@]}" | grep '^ubiquity@..*\.service$' | sort -u)
	if [ ${#units[@]} -gt 0 ]; then
		if have_manager; then
			say "stopping and disabling: ${units[*]}"
			systemctl --user stop "${units[@]}" || say "warning: could not stop all of them"
			systemctl --user disable "${units[@]}" 2>/dev/null || rm -f "${links[@]}"
		else
			say "no systemd user manager reachable: removing the enable links by hand"
			rm -f "${links[@]}"
		fi
	fi
	local f removed=
	for f in "$unit" "$bin" "$manual" "$bash_completion" "$zsh_completion" "$fish_completion"; do
		if [ -e "$f" ]; then
			rm -f "$f"
			say "removed $f"
			removed=1
		fi
	done
	[ -n "$removed" ] || [ ${#units[@]} -gt 0 ] || say "nothing to remove: not installed"
	if have_manager; then
		systemctl --user daemon-reload
		systemctl --user reset-failed 'ubiquity@*.service' 2>/dev/null || true
	fi
	say "kept your data (~/.local/share/ubiquity/) and settings (~/.config/ubiquity/)"
}

if [ "$mode" = uninstall ]; then uninstall_all; else install_all; fi
