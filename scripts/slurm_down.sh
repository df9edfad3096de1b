#!/usr/bin/env bash
# slurm_down.sh: stop the loopback Slurm test cluster that scripts/slurm_up.sh started.
#
#   bash scripts/slurm_down.sh            (or: make slurm-down)  cancel all jobs, stop every daemon
#   PURGE=1 bash scripts/slurm_down.sh    also forget all jobs: drop the accounting database and wipe the
#                                         slurmctld/slurmd state, so job ids start at 1 again
#
# Daemons are found through their pid files and stopped in dependency order: the slurmds and slurmctld,
# then slurmdbd, then MariaDB and munged. Each group is stopped together, since every daemon takes a second
# or two to exit. Packages, config files and the munge key stay, so the next slurm_up.sh takes seconds.
set -euo pipefail

SCRIPT=slurm_down
# shellcheck source=scripts/slurm_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/slurm_lib.sh"
PURGE=${PURGE:-0}
STOP_TIMEOUT_S=15


# stop_group PIDFILE...: TERM all of them at once, wait up to STOP_TIMEOUT_S for all to exit, KILL the
# rest, remove the pid files.
stop_group() {
    local f pid pids=() t0 left
    for f in "$@"; do
        if pid=$(live_pid "$f"); then
            pids+=("$pid")
            kill -TERM "$pid" 2>/dev/null || true
        fi
    done
    t0=$(now_us)
    while ((${#pids[@]})); do
        left=()
        for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && left+=("$pid"); done
        pids=(${left[@]+"${left[@]}"})
        ((${#pids[@]})) || break
        if (($(now_us) - t0 >= STOP_TIMEOUT_S * 1000000)); then
            say "still alive after ${STOP_TIMEOUT_S}s, killing: ${pids[*]}"
            kill -KILL "${pids[@]}" 2>/dev/null || true
            break
        fi
        sleep 0.1
    done
    rm -f "$@"
}


# Cancelling every job first leaves no slurmstepd behind once the slurmds are gone.
cancel_jobs() {
    live_pid "$RUN_DIR/slurmctld.pid" >/dev/null || return 0
    scancel --full -u root || true
    local t0
    t0=$(now_us)
    while [[ -n $(squeue -h -t R,CG,PD 2>/dev/null) ]]; do
        (($(now_us) - t0 < 10000000)) || { say "jobs still queued after 10s; stopping anyway"; break; }
        sleep 0.1
    done
}

# Drop the accounting DB through SQL while MariaDB is still up: deleting its directory by hand leaves
# MariaDB's own catalogue behind, and slurmdbd then fails to create its tables ("1050 Table already exists").
purge_state() {
    if mysqladmin ping >/dev/null 2>&1; then
        mysql -e 'DROP DATABASE IF EXISTS slurm_acct_db'
    else
        say "MariaDB is not running: the accounting database was not dropped"
    fi
    rm -rf "${SPOOL:?}"/ctld/* "${SPOOL:?}"/d/*
}

phase jobs cancel_jobs
shopt -s nullglob
phase slurmd+ctld stop_group "$RUN_DIR"/slurmd-*.pid "$RUN_DIR/slurmctld.pid"
shopt -u nullglob
phase slurmdbd stop_group "$RUN_DIR/slurmdbd.pid"
if [[ $PURGE == 1 ]]; then phase purge purge_state; fi
phase db+munge stop_group /run/mysqld/mysqld.pid /run/munge/munged.pid
say "done in $(elapsed "$START_US")"
