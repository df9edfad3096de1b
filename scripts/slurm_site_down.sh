#!/usr/bin/env bash
# slurm_site_down.sh: stop the second loopback cluster scripts/slurm_site_up.sh started (its jobs cancelled, its
# slurmds and slurmctld stopped); the ci cluster and the daemons they share (munged, MariaDB, slurmdbd) stay up.
#
#   bash scripts/slurm_site_down.sh        (or: make slurm-site-down)     SLURM_SITE_NAME as for slurm_site_up.sh
#   bash scripts/slurm_site_down.sh --controller    only its slurmctld, its queue kept (a site whose controller
#                                                   fails: tests/test_sites_spread.py); slurm_site_up.sh restarts it
set -euo pipefail
CONTROLLER_ONLY=0
[[ ${1:-} == --controller ]] && CONTROLLER_ONLY=1

NAME=${SLURM_SITE_NAME:-siteb}
SCRIPT=slurm_site_down
# shellcheck source=scripts/slurm_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/slurm_lib.sh"
SITE_RUN=$RUN_DIR-$NAME
export SLURM_CONF=/etc/slurm-$NAME/slurm.conf

stop() {
    local f pid pids=() t0
    local files=("$SITE_RUN/slurmctld.pid")
    if ((!CONTROLLER_ONLY)); then
        if live_pid "$SITE_RUN/slurmctld.pid" >/dev/null; then scancel --full -u root 2>/dev/null || true; fi
        files=("$SITE_RUN"/slurmd-*.pid "$SITE_RUN/slurmctld.pid")
    fi
    shopt -s nullglob
    for f in "${files[@]}"; do
        if pid=$(live_pid "$f"); then pids+=("$pid"); kill -TERM "$pid" 2>/dev/null || true; fi
    done
    shopt -u nullglob
    t0=$(now_us)
    for pid in ${pids[@]+"${pids[@]}"}; do
        while kill -0 "$pid" 2>/dev/null; do
            (($(now_us) - t0 < 15000000)) || { kill -KILL "$pid" 2>/dev/null || true; break; }
            sleep 0.1
        done
    done
    if ((CONTROLLER_ONLY)); then rm -f "$SITE_RUN/slurmctld.pid"; else rm -f "$SITE_RUN"/*.pid; fi
}

phase daemons stop
say "cluster $NAME stopped in $(elapsed "$START_US")"
