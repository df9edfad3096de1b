# shellcheck shell=bash disable=SC2034
# slurm_lib.sh: what slurm_up.sh and slurm_down.sh share. Sourced, not run; the sourcing script sets
# SCRIPT (its name, for messages) first.
RUN_DIR=/run/slurm
SPOOL=/var/spool/slurm

say() { echo "$SCRIPT: $*"; }

# Microseconds since the epoch, from bash itself: no subprocess per measurement.
now_us() { echo "${EPOCHREALTIME/./}"; }
elapsed() { local us=$(($(now_us) - $1)); printf '%d.%02d s' $((us / 1000000)) $((us % 1000000 / 10000)); }
START_US=$(now_us)

# The pid in this pid file when it names a live process that is one of our daemons; a stale pid file whose
# number was reused by another process is ignored, so nothing else is ever signalled or mistaken for ours.
live_pid() {
    local pid comm
    [[ -f $1 ]] || return 1
    pid=$(<"$1")
    [[ $pid =~ ^[0-9]+$ ]] && kill -0 "$pid" 2>/dev/null || return 1
    comm=$(<"/proc/$pid/comm") || return 1
    [[ $comm =~ ^(slurmd|slurmctld|slurmdbd|munged|mariadbd)$ ]] || return 1
    echo "$pid"
}

# phase LABEL COMMAND...: run one step and print how long it took.
phase() {
    local label=$1 t0
    shift
    t0=$(now_us)
    "$@"
    say "$(printf '%-16s' "$label") $(elapsed "$t0")"
}
