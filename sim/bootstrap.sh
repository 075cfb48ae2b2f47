#!/usr/bin/env bash
# Prepare this machine for the simulated fleet:
#  1. install the Debian packages the sim and the tests need (only those missing;
#     haproxy: the unit tests run the real guard and front door on loopback; keepalived: its config checked by
#     the real one (keepalived -t); tcpdump: the e2e capture of the LAN (no key in clear); prometheus (promtool) and
#     prometheus-node-exporter: the scrape config, the alert rules and the status page are checked by the real
#     ones; chromium: the status page's screenshot, in the unit and the e2e tests; socat: the usage snapshot's
#     writer (files/sparkfleet-usage-save) asks a real door's admin socket with it, as on a door host),
#  2. start dockerd in the background when `docker info` does not answer,
#     and wait until it does.
# Idempotent: on a ready machine it changes nothing and returns in well
# under a second.  Must run as root (CI and the dev machines are root).
set -euo pipefail

PACKAGES=(docker.io debootstrap gnupg dpkg-dev openssh-client ca-certificates iptables haproxy keepalived tcpdump prometheus prometheus-node-exporter chromium chromium-driver socat restic sqlite3)
LOG=${SPARKFLEET_DOCKERD_LOG:-/var/log/sparkfleet-dockerd.log}
WAIT_S=${SPARKFLEET_DOCKERD_WAIT_S:-90}

missing=()
for p in "${PACKAGES[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
        missing+=("$p")
    fi
done
if [ ${#missing[@]} -gt 0 ]; then
    echo "bootstrap: installing ${missing[*]}" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
fi

if docker info >/dev/null 2>&1; then
    exit 0
fi

DOCKERD=$(command -v dockerd || echo /usr/sbin/dockerd)
# Only this machine's own dockerd counts (the sim hosts run nested dockerds
# that `pgrep dockerd` would also find): its pid file names it. A dockerd that
# died uncleanly leaves the file behind; dockerd refuses to start while the
# pid in it is alive, so remove the file only when that pid is gone.
PIDFILE=/var/run/docker.pid
running=""
if [ -f "$PIDFILE" ]; then
    if kill -0 "$(cat "$PIDFILE")" 2>/dev/null; then
        running=yes
    else
        rm -f "$PIDFILE"
    fi
fi
if [ -z "$running" ]; then
    echo "bootstrap: starting dockerd (log: $LOG)" >&2
    # dockerd outlives this script: it must not inherit its caller's open files, above all the
    # shared `flock /tmp/sim.lock` descriptor (a dockerd holding it would hold the lock forever)
    (
        for fd in /proc/$BASHPID/fd/*; do
            n=${fd##*/}
            if [ "$n" -gt 2 ]; then eval "exec $n>&-"; fi
        done
        exec setsid nohup "$DOCKERD" >>"$LOG" 2>&1 </dev/null
    ) &
fi
for _ in $(seq 1 "$WAIT_S"); do
    if docker info >/dev/null 2>&1; then
        echo "bootstrap: dockerd is up" >&2
        exit 0
    fi
    sleep 1
done
echo "bootstrap: dockerd did not answer within ${WAIT_S}s; last log lines:" >&2
tail -n 30 "$LOG" >&2 || true
exit 1
