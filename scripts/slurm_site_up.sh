#!/usr/bin/env bash
# slurm_site_up.sh: a second real Slurm cluster on this machine, beside the one scripts/slurm_up.sh runs (`ci`),
# for the tests of grids that span sites. Debian 12, as root; all traffic stays on loopback.
#
#   bash scripts/slurm_site_up.sh     (or: make slurm-site-up)     stop it with scripts/slurm_site_down.sh
#
# Its own controller, ports, state, pid and log files and node names; the `ci` cluster's munged, MariaDB and
# slurmdbd serve it too (one accounting database, one record per cluster: sacct answers for the cluster of its
# SLURM_CONF), so `ci` must be up first (make slurm-up). Its clients find it through SLURM_CONF:
#
#   SLURM_CONF=/etc/slurm-siteb/slurm.conf sinfo
#
# A CPU-only site: no GPUs, SLURM_SITE_NNODES small nodes (default 1) of SLURM_SITE_CPUS CPUs (default 2): this
# machine has two cores. Idempotent: daemons already running are left alone; a config that differs from the one
# they run is an error (stop them first). The `ci` cluster is never touched.
#
# Environment:
#   SLURM_SITE_NAME   the cluster's name, its config directory and node prefix (default siteb: nodes s1..sN, its first letter)
#   SLURM_SITE_PORT   slurmctld's port; slurmd's is the next one, the nodes' from 17100 + 100 x (port - 6817) / 10
set -euo pipefail

NAME=${SLURM_SITE_NAME:-siteb}
NNODES=${SLURM_SITE_NNODES:-1}
CPUS=${SLURM_SITE_CPUS:-2}
CTLD_PORT=${SLURM_SITE_PORT:-6827}
SCRIPT=slurm_site_up
# shellcheck source=scripts/slurm_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/slurm_lib.sh"
CONF_DIR=/etc/slurm-$NAME
SITE_RUN=$RUN_DIR-$NAME
SITE_SPOOL=$SPOOL-$NAME
LOG_DIR=/var/log/slurm
PREFIX=${NAME:0:1}
NODE_PORT0=$((17100 + 100 * (CTLD_PORT - 6817) / 10))
export SLURM_CONF=$CONF_DIR/slurm.conf

die() { echo "$SCRIPT: error: $*" >&2; exit 1; }
[[ $(id -u) == 0 ]] || die "must run as root (it starts system daemons)"
[[ $NAME =~ ^[a-z][a-z0-9]*$ && $NAME != ci ]] || die "SLURM_SITE_NAME must be lowercase letters and digits, not ci"
for v in NNODES CPUS CTLD_PORT; do [[ ${!v} =~ ^[1-9][0-9]*$ ]] || die "$v must be a positive integer"; done
command -v slurmctld >/dev/null || test -x /usr/sbin/slurmctld || die "no Slurm: run make slurm-up first"
SLURM_CONF=/etc/slurm/slurm.conf sacctmgr -n -P list cluster >/dev/null 2>&1 \
    || die "the ci cluster's slurmdbd does not answer: run make slurm-up first"

alive() { live_pid "$1" >/dev/null; }

# ci's settings (scheduler, accounting, memory enforcement: one source, scripts/slurm_up.sh), with this cluster's
# own name, ports, state, pid and log files, nodes and partition; no GPUs, no preemption
slurm_conf() {
    echo "# Written by scripts/slurm_site_up.sh from /etc/slurm/slurm.conf (ci's); rewritten on every run."
    grep -vE '^(#|ClusterName|Slurm(ctld|d)Port|StateSaveLocation|SlurmdSpoolDir|Slurm(ctld|d)(Pid|Log)File|GresTypes|AccountingStorageTRES|NodeName|PartitionName|Preempt|SlurmctldParameters)' \
        /etc/slurm/slurm.conf
    cat <<EOF
ClusterName=$NAME
SlurmctldPort=$CTLD_PORT
SlurmdPort=$((CTLD_PORT + 1))
StateSaveLocation=$SITE_SPOOL/ctld
SlurmdSpoolDir=$SITE_SPOOL/d/%n
SlurmctldPidFile=$SITE_RUN/slurmctld.pid
SlurmdPidFile=$SITE_RUN/slurmd-%n.pid
SlurmctldLogFile=$LOG_DIR/$NAME-slurmctld.log
SlurmdLogFile=$LOG_DIR/$NAME-slurmd-%n.log
NodeName=$PREFIX[1-$NNODES] NodeHostname=localhost NodeAddr=127.0.0.1 Port=[$((NODE_PORT0 + 1))-$((NODE_PORT0 + NNODES))] CPUs=$CPUS RealMemory=8000 State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
}

write_config() {
    local tmp
    mkdir -p "$CONF_DIR" "$SITE_RUN" "$SITE_SPOOL/ctld" "$LOG_DIR"
    for ((i = 1; i <= NNODES; i++)); do mkdir -p "$SITE_SPOOL/d/$PREFIX$i"; done
    tmp=$(mktemp "$SLURM_CONF.XXXXXX")
    slurm_conf >"$tmp"
    chmod 644 "$tmp"
    if [[ -f $SLURM_CONF ]] && cmp -s "$tmp" "$SLURM_CONF"; then rm -f "$tmp"; return 0; fi
    if alive "$SITE_RUN/slurmctld.pid"; then
        rm -f "$tmp"
        die "$NAME runs with another $SLURM_CONF: run scripts/slurm_site_down.sh first"
    fi
    mv -f "$tmp" "$SLURM_CONF"
}

# wait_until SECONDS CHECK...: 0 once CHECK succeeds, 1 when SECONDS passed first (the caller says what failed)
wait_until() {
    local timeout=$1 t0
    shift
    t0=$(now_us)
    until "$@" >/dev/null 2>&1; do
        (($(now_us) - t0 < timeout * 1000000)) || return 1
        sleep 0.1
    done
}

ctld_ready() { scontrol ping | grep -q 'is UP'; }
# every node known to the controller in a settled state: not still registering (`unk`), not unreachable (`*`)
nodes_settled() {
    local states
    states=$(sinfo -h -N -o '%t') && [[ -n $states ]] && ! grep -qE 'unk|\*' <<<"$states"
}
nodes_ready() {
    local states
    states=$(sinfo -h -N -o '%t') && [[ -n $states ]] && ! grep -qvxE '(idle|mix|mixed|alloc|allocated|comp|completing)-?' <<<"$states"
}

start() {
    SLURM_CONF=/etc/slurm/slurm.conf sacctmgr -n -P list cluster format=cluster | grep -qx "$NAME" \
        || SLURM_CONF=/etc/slurm/slurm.conf sacctmgr -i add cluster "$NAME" >/dev/null
    if ! alive "$SITE_RUN/slurmctld.pid"; then
        /usr/sbin/slurmctld -f "$SLURM_CONF" </dev/null >>"$LOG_DIR/$NAME-slurmctld.stdout" 2>&1
    fi
    wait_until 30 ctld_ready || die "timed out after 30s waiting for $NAME's slurmctld"
    for ((i = 1; i <= NNODES; i++)); do
        alive "$SITE_RUN/slurmd-$PREFIX$i.pid" \
            || /usr/sbin/slurmd -f "$SLURM_CONF" -N "$PREFIX$i" </dev/null >>"$LOG_DIR/$NAME-slurmd.stdout" 2>&1
    done
    # a node left down or drained (a controller restarted under it, a test's drain): resumed once, then waited for
    wait_until 30 nodes_settled || true
    if ! nodes_ready; then
        scontrol update nodename="$PREFIX[1-$NNODES]" state=resume || true
        wait_until 30 nodes_ready || die "timed out after 60s waiting for $NAME's nodes: $(sinfo -h -N -o '%N %t %E' 2>&1)"
    fi
}

phase config write_config
phase daemons start
sinfo -N -o '%N %P %t %c'
say "cluster $NAME up ($NNODES node(s) x $CPUS CPUs, SLURM_CONF=$SLURM_CONF) in $(elapsed "$START_US")"
