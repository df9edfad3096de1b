#!/usr/bin/env bash
# slurm_up.sh: bring up a real Slurm cluster on this one machine, for tests and for trying sft_grid
# without a cluster. Debian 12, as root, no systemd needed; all traffic stays on loopback.
#
#   bash scripts/slurm_up.sh        (or: make slurm-up)      stop it with scripts/slurm_down.sh
#
# It runs munged, MariaDB (unix socket only), slurmdbd (so sacct works), slurmctld and one slurmd per
# virtual node n1..nN. Each node advertises fake CPUs and fake GPUs (character devices that are never
# opened). Partitions: `debug` (the default) and `high`, whose jobs preempt and requeue debug jobs.
# The first run installs Debian's packages with apt-get; later runs take about two seconds.
# Idempotent: daemons that are already running are left alone. When the config it would write differs
# from the one the running daemons use, it changes nothing and says to run slurm_down.sh first.
#
# Environment:
#   SLURM_CI_NNODES  virtual nodes n1..nN, one slurmd each           (default 2)
#   SLURM_CI_CPUS    fake CPUs per node                              (default 4)
#   SLURM_CI_GPUS    fake GPUs per node                              (default 4)
#   SLURM_CI_PREEMPT 1: partitions debug + high with preemption; 0: a single debug partition (default 1)
# Logs: /var/log/slurm.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive

NNODES=${SLURM_CI_NNODES:-2}
CPUS=${SLURM_CI_CPUS:-4}
GPUS=${SLURM_CI_GPUS:-4}
PREEMPT=${SLURM_CI_PREEMPT:-1}

PACKAGES=(slurmctld slurmd slurm-client slurmdbd munge mariadb-server)
SCRIPT=slurm_up
# shellcheck source=scripts/slurm_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/slurm_lib.sh"
FAKEGPU_DIR=$SPOOL/fakegpu
LOG_DIR=/var/log/slurm
NODES="n[1-$NNODES]"
# The daemons the Slurm config files describe: if any of these runs, the config must not change under it.
SLURM_PIDFILES=("$RUN_DIR/slurmdbd.pid" "$RUN_DIR/slurmctld.pid")
for ((i = 1; i <= NNODES; i++)); do SLURM_PIDFILES+=("$RUN_DIR/slurmd-n$i.pid"); done

die() { echo "slurm_up: error: $*" >&2; exit 1; }

for v in NNODES CPUS GPUS; do
    [[ ${!v} =~ ^[1-9][0-9]*$ ]] || die "SLURM_CI_$v must be a positive integer, got '${!v}'"
done
[[ $PREEMPT == 0 || $PREEMPT == 1 ]] || die "SLURM_CI_PREEMPT must be 0 or 1, got '$PREEMPT'"
[[ $(id -u) == 0 ]] || die "must run as root (it installs packages and starts system daemons)"

alive() { live_pid "$1" >/dev/null; }

# wait_for SECONDS DESCRIPTION COMMAND...: retry COMMAND every 0.1 s until it succeeds or time is up.
wait_for() {
    local timeout=$1 what=$2 t0
    shift 2
    t0=$(now_us)
    until "$@" >/dev/null 2>&1; do
        (($(now_us) - t0 < timeout * 1000000)) || { say "timed out after ${timeout}s waiting for $what"; return 1; }
        sleep 0.1
    done
}

# Show why a daemon did not come up, then stop.
fail_with_log() {
    local log=$1
    shift
    [[ -f $log ]] && { echo "--- last lines of $log" >&2; tail -n 20 "$log" >&2; }
    die "$*"
}

# ---------------------------------------------------------------- packages
package_installed() { [[ $(dpkg-query -W -f='${db:Status-Status}' "$1" 2>/dev/null) == installed ]]; }

install_packages() {
    local missing=() p created_policy=0
    for p in "${PACKAGES[@]}"; do package_installed "$p" || missing+=("$p"); done
    ((${#missing[@]})) || return 0
    say "installing ${missing[*]}"
    # Without systemd, postinst scripts would start munge and MariaDB themselves (as the wrong user,
    # with networking on); policy-rc.d exit 101 forbids that. Keep an existing one, remove ours after.
    if [[ ! -e /usr/sbin/policy-rc.d ]]; then
        printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
        chmod +x /usr/sbin/policy-rc.d
        created_policy=1
        trap 'rm -f /usr/sbin/policy-rc.d' EXIT
    fi
    apt-get update -q
    apt-get install -y -q --no-install-recommends "${PACKAGES[@]}"
    if ((created_policy)); then rm -f /usr/sbin/policy-rc.d; trap - EXIT; fi
}

# ---------------------------------------------------------------- directories, munge key, fake GPUs
prepare_host() {
    local i dev
    mkdir -p "$SPOOL/ctld" "$FAKEGPU_DIR" "$RUN_DIR" "$LOG_DIR" /run/munge /run/mysqld
    for ((i = 1; i <= NNODES; i++)); do mkdir -p "$SPOOL/d/n$i"; done
    chown munge:munge /run/munge
    chown mysql:mysql /run/mysqld
    if [[ ! -s /etc/munge/munge.key ]]; then
        mungekey --create --keyfile=/etc/munge/munge.key
        chown munge:munge /etc/munge/munge.key
        chmod 600 /etc/munge/munge.key
    fi
    # slurmd drops a GPU without a File= (and drains the node), and logs errors for regular files:
    # character devices with the NVIDIA major number are accepted and never opened.
    for ((i = 0; i < GPUS; i++)); do
        dev=$FAKEGPU_DIR/gpu$i
        [[ -c $dev ]] || { rm -f "$dev"; mknod "$dev" c 195 "$i"; }
    done
}

# ---------------------------------------------------------------- config files
slurm_conf() {
    cat <<EOF
# Written by scripts/slurm_up.sh (loopback test cluster); rewritten on every run.
ClusterName=ci
SlurmctldHost=localhost
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=cred_expire=5
SlurmctldPort=6817
SlurmdPort=6818
StateSaveLocation=$SPOOL/ctld
SlurmdSpoolDir=$SPOOL/d/%n
SlurmctldPidFile=$RUN_DIR/slurmctld.pid
SlurmdPidFile=$RUN_DIR/slurmd-%n.pid
SlurmctldLogFile=$LOG_DIR/slurmctld.log
SlurmdLogFile=$LOG_DIR/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SwitchType=switch/none
MailProg=/bin/true
SelectType=select/cons_tres
# memory is a consumable resource, so a job's --mem is its limit (enforced below, as cgroups do on real sites);
# a job that asks for none gets DefMemPerCPU per CPU
SelectTypeParameters=CR_CPU_Memory
DefMemPerCPU=4000
SchedulerType=sched/backfill
SchedulerParameters=batch_sched_delay=0,sched_min_interval=0,sched_interval=1,bf_interval=1
ReturnToService=2
SlurmdParameters=config_overrides
KillWait=5
InactiveLimit=0
MinJobAge=300
MaxArraySize=1001
GresTypes=gpu
JobAcctGatherType=jobacct_gather/linux
# sampled every 5 s; a step over its job's --mem is killed and ends OUT_OF_MEMORY, as cgroups do on real sites
JobAcctGatherFrequency=5
JobAcctGatherParams=OverMemoryKill
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStoragePort=6819
AccountingStorageTRES=gres/gpu
JobCompType=jobcomp/none
NodeName=$NODES NodeHostname=localhost NodeAddr=127.0.0.1 Port=[17001-$((17000 + NNODES))] CPUs=$CPUS RealMemory=16000 Gres=gpu:$GPUS State=UNKNOWN
EOF
    if ((PREEMPT)); then
        cat <<EOF
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
SlurmctldParameters=preempt_send_user_signal
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP PriorityTier=1 PreemptMode=REQUEUE GraceTime=20
PartitionName=high Nodes=ALL MaxTime=INFINITE State=UP PriorityTier=2 PreemptMode=OFF
EOF
    else
        echo "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP"
    fi
}

gres_conf() {
    echo "Name=gpu File=$FAKEGPU_DIR/gpu[0-$((GPUS - 1))]"
}

# slurmdbd reaches MariaDB as its root user over the unix socket (unix_socket auth): no password, no TCP.
slurmdbd_conf() {
    cat <<EOF
AuthType=auth/munge
DbdHost=localhost
DbdPort=6819
SlurmUser=root
DebugLevel=info
LogFile=$LOG_DIR/slurmdbd.log
PidFile=$RUN_DIR/slurmdbd.pid
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageUser=root
StorageLoc=slurm_acct_db
EOF
}

any_slurm_daemon_alive() {
    local f
    for f in "${SLURM_PIDFILES[@]}"; do alive "$f" && return 0; done
    return 1
}

# install_conf PATH MODE GENERATOR: write the generator's text to PATH unless it is already there. While
# Slurm daemons run on the old text, a difference is an error: they would not see the new one.
install_conf() {
    local path=$1 mode=$2 gen=$3 tmp
    tmp=$(mktemp "$path.XXXXXX")
    "$gen" >"$tmp"
    chmod "$mode" "$tmp"
    if [[ -f $path ]] && cmp -s "$tmp" "$path"; then
        rm -f "$tmp"
        return 0
    fi
    if any_slurm_daemon_alive; then
        echo "--- running $path vs. requested:" >&2
        diff "$path" "$tmp" >&2 || true
        rm -f "$tmp"
        die "the running cluster uses a different $path; run scripts/slurm_down.sh first"
    fi
    mv -f "$tmp" "$path"
}

# Clients without a slurm.conf look up _slurmctld._tcp in DNS: the config is written before any of them runs.
# It is also written before the host is touched, so that a conflict with a running cluster changes nothing.
write_configs() {
    mkdir -p /etc/slurm
    install_conf /etc/slurm/slurm.conf 644 slurm_conf
    install_conf /etc/slurm/gres.conf 644 gres_conf
    install_conf /etc/slurm/slurmdbd.conf 600 slurmdbd_conf
}

# ---------------------------------------------------------------- daemons
# start_daemon NAME PIDFILE TIMEOUT LOG READY_FN COMMAND...: start COMMAND unless PIDFILE names a live
# process, then wait until READY_FN succeeds. Every daemon here daemonises itself and writes PIDFILE.
start_daemon() {
    local name=$1 pidfile=$2 timeout=$3 log=$4 ready=$5
    shift 5
    if alive "$pidfile"; then
        say "$name already running (pid $(<"$pidfile"))"
    else
        # stdio goes to a file: the daemon must not hold the caller's terminal or pipe open.
        "$@" </dev/null >>"$LOG_DIR/$name.stdout" 2>&1 || fail_with_log "$LOG_DIR/$name.stdout" "$name did not start"
    fi
    wait_for "$timeout" "$name" "$ready" || fail_with_log "$log" "$name is not ready after ${timeout}s"
}

munge_ready() { munge -n >/dev/null; }
mariadb_ready() { mysqladmin ping; }
slurmdbd_ready() { sacctmgr -n -P list cluster; }
slurmctld_ready() { scontrol ping | grep -q 'is UP'; }

start_munged() {
    start_daemon munged /run/munge/munged.pid 10 /var/log/munge/munged.log munge_ready \
        runuser -u munge -- /usr/sbin/munged
}

# MariaDB runs in the foreground (it does not daemonise), detached with setsid; --skip-networking leaves
# it on its unix socket only. Whether it runs is asked of the server itself, as the recipe says.
start_mariadb() {
    if mariadb_ready >/dev/null 2>&1; then
        say "mariadb already running"
    else
        setsid /usr/sbin/mariadbd --user=mysql --skip-networking --pid-file=/run/mysqld/mysqld.pid \
            >>"$LOG_DIR/mariadb.log" 2>&1 </dev/null &
    fi
    wait_for 60 mariadb mariadb_ready || fail_with_log "$LOG_DIR/mariadb.log" "mariadb is not ready after 60s"
}

start_slurmdbd() {
    start_daemon slurmdbd "$RUN_DIR/slurmdbd.pid" 60 "$LOG_DIR/slurmdbd.log" slurmdbd_ready /usr/sbin/slurmdbd
}

# slurmctld registers its cluster by itself; adding it first makes sacct work from the first job on.
ensure_cluster_record() {
    sacctmgr -n -P list cluster format=cluster | grep -qx ci || sacctmgr -i add cluster ci >/dev/null
}

start_slurmctld() {
    start_daemon slurmctld "$RUN_DIR/slurmctld.pid" 30 "$LOG_DIR/slurmctld.log" slurmctld_ready /usr/sbin/slurmctld
}

# One slurmd per virtual node; -N gives each its node name, and %n in the config its own port, spool,
# pid and log file. Their readiness is checked for all nodes together (nodes_ready).
start_slurmds() {
    local i
    for ((i = 1; i <= NNODES; i++)); do
        if alive "$RUN_DIR/slurmd-n$i.pid"; then
            say "slurmd n$i already running"
        else
            /usr/sbin/slurmd -N "n$i" </dev/null >>"$LOG_DIR/slurmd-n$i.stdout" 2>&1 \
                || fail_with_log "$LOG_DIR/slurmd-n$i.log" "slurmd n$i did not start"
        fi
    done
}

# ---------------------------------------------------------------- all nodes ready
# Every node in a usable state: idle, mixed, allocated or completing (a "-" suffix only means backfill has
# planned it). "idle*" means not responding, and drain/down are not ready.
nodes_ready() {
    local states
    states=$(sinfo -h -N -o '%t') || return 1
    [[ -n $states ]] || return 1
    ! grep -qvxE '(idle|mix|mixed|alloc|allocated|comp|completing)-?' <<<"$states"
}

wait_nodes() {
    wait_for 30 "all nodes to be ready" nodes_ready && return 0
    # A node drained by an earlier run (e.g. killed mid-job) stays drained across restarts: resume it.
    say "resuming $NODES"
    scontrol update nodename="$NODES" state=resume || true
    wait_for 30 "all nodes to be ready" nodes_ready && return 0
    sinfo -N -o '%N %t %E' >&2 || true
    fail_with_log "$LOG_DIR/slurmctld.log" "nodes not ready"
}

phase packages install_packages
phase config write_configs
phase host prepare_host
phase munged start_munged
phase mariadb start_mariadb
phase slurmdbd start_slurmdbd
phase cluster-record ensure_cluster_record
phase slurmctld start_slurmctld
phase slurmd start_slurmds
phase nodes-ready wait_nodes
sinfo -N -o '%N %P %t %c %G'
say "cluster up ($NNODES nodes x $CPUS CPUs x $GPUS GPUs, preemption $( ((PREEMPT)) && echo on || echo off)) in $(elapsed "$START_US")"
