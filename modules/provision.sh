#!/bin/sh
# agent-vm-provision: the repository's own provisioning, run as root once per
# root disk, at its first boot (after `agent-vm create`, and again after
# `agent-vm reset`). Both guests run this same file: the Debian guest from
# cloud-init's runcmd, the NixOS guest as agent-vm-provision.service
# (modules/guest.nix).
#
#   provision [INSTALL-COMMAND [ARG...]]
#
# It runs the install command when given (the Debian guest's packages from
# create --packages and .agent-vm/config.toml; NixOS has them in its system
# already), then the repository's .agent-vm/provision.sh as it is in the
# workspace now (the user's file at first boot, never copied at create: no
# copy of it lands in the seed, the Nix store or the state directory). Their
# output goes to the log; how the run ended goes to the status file, which
# is also the stamp that keeps this to once per disk. It exits 0 either way:
# the status file says whether it failed, and `agent-vm start` reports it.
# What the shell can do itself is not a process: a clone of a template runs
# this on its way to its first session, where each is 50-100 ms under TCG.
# Written by agent-vm.
set -u

workspace=/workspace
script=$workspace/.agent-vm/provision.sh
log=/var/log/agent-vm-provision.log
status=/var/lib/agent-vm/provision.status

if [ -e "$status" ]; then
	echo "agent-vm-provision: already ran on this disk ($(head -n 1 "$status")); \`agent-vm reset\` gives a fresh disk that runs it again"
	exit 0
fi
umask 022
[ -d "${status%/*}" ] || mkdir -p "${status%/*}"
read -r boot </proc/sys/kernel/random/boot_id 2>/dev/null || boot=unknown

# finish STATUS EXIT records the outcome (atomically) and ends the run.
finish() {
	printf 'status=%s\nexit=%s\nboot=%s\n' "$1" "$2" "$boot" >"$status.tmp" && mv -f "$status.tmp" "$status"
	said="agent-vm-provision: $1 (exit status $2); the log is $log"
	echo "$said"
	echo "$said" >>"$log"
	exit 0
}

# mounted reports whether something is mounted at the workspace.
mounted() {
	while read -r _ at _; do
		[ "$at" = "$workspace" ] && return 0
	done </proc/self/mounts
	return 1
}

# The workspace is mounted by its own unit; wait for it (up to a minute).
if ! mounted; then
	systemctl start agent-vm-workspace.service >/dev/null 2>&1 || true
	i=0
	while ! mounted && [ "$i" -lt 60 ]; do
		sleep 1
		i=$((i + 1))
	done
fi

if [ $# -eq 0 ] && [ ! -e "$script" ]; then
	: >"$log"
	finish skipped 0
fi
echo "agent-vm-provision: started $(date -u '+%Y-%m-%dT%H:%M:%SZ')" >"$log"
if [ $# -gt 0 ]; then
	echo "agent-vm-provision: installing packages: $*" >>"$log"
	"$@" </dev/null >>"$log" 2>&1 || finish failed "$?"
fi
if ! mounted; then
	echo "agent-vm-provision: $workspace is not mounted, so $script cannot run" >>"$log"
	finish failed 1
fi
if [ -e "$script" ]; then
	echo "agent-vm-provision: running $script" >>"$log"
	if [ -x "$script" ]; then
		(cd "$workspace" && HOME=/root exec "$script") </dev/null >>"$log" 2>&1 || finish failed "$?"
	else
		(cd "$workspace" && HOME=/root exec sh "$script") </dev/null >>"$log" 2>&1 || finish failed "$?"
	fi
fi
finish ok 0
