#!/usr/bin/env bash
# IntegrationTests/systemd/cleanup.sh: remove what a killed systemd test run left behind (a run that
# ends normally, or by SIGINT/SIGTERM/SIGHUP, cleans up itself). run.sh calls this first.
#
# A run named ubiquity-sdtest-PID owns the cgroup of that name and /tmp/ubiquity-sdtest-PID.
# While PID is alive the run is left alone. Otherwise the processes in its cgroup (its
# user manager, journald, daemons) are killed by PID, the cgroup is removed, and then its
# temp dir. Its mounts existed only in its mount namespace, which dies with those processes.
set -u
status=0
for root in /sys/fs/cgroup/unified /sys/fs/cgroup; do
	[ "$(stat -fc %T "$root" 2>/dev/null)" = cgroup2fs ] || continue
	for cg in "$root"/ubiquity-sdtest-*; do
		[ -d "$cg" ] || continue
		kill -0 "${cg##*-}" 2>/dev/null && continue # its run is still going
		for _ in $(seq 50); do
			mapfile -t pids < <(find "$cg" -name cgroup.procs -exec cat {} + 2>/dev/null)
			[ ${#pids[@]} = 0 ] || kill -KILL "${pids[@]}" 2>/dev/null
			find "$cg" -depth -type d -exec rmdir {} + 2>/dev/null
			[ -d "$cg" ] || break
			sleep 0.1
		done
		if [ -d "$cg" ]; then
			echo "cleanup: could not remove $cg" >&2
			status=1
		else
			echo "cleanup: removed $cg and its processes"
		fi
	done
	break # the cgroup2 hierarchy found; the other candidate is not one
done
for dir in /tmp/ubiquity-sdtest-*; do
	[ -d "$dir" ] || continue
	kill -0 "${dir##*-}" 2>/dev/null && continue
	[ "$status" = 0 ] || continue # its processes may still live: keep their files
	rm -rf "$dir" && echo "cleanup: removed $dir"
done
exit "$status"
