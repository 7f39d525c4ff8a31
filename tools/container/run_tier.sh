#!/usr/bin/env bash
# CI's container tier: the image built from the Dockerfile and run as SageMaker runs it
# (tests/container/test_docker.py). Gets what it needs first:
#   - docker.io, debootstrap and docker-compose from apt when missing (root only; a failure here is a skip),
#   - a Docker daemon: if none answers, starts dockerd in the background and leaves it running for the next run
#     (images and build cache live in its data root, so a warm run builds nothing),
#   - the Dockerfile's base image (tools/container/base_image.sh: from Debian where Docker Hub is out of reach).
# Exits 0 with a "container tier: SKIPPED" line when Docker can't run here, never failing CI for that; once the
# tests run, their exit status is this script's.
#
#   tools/container/run_tier.sh [pytest args...]
#   NAIAD_DOCKERD_FLAGS="--storage-driver=vfs" tools/container/run_tier.sh   # dockerd flags of your own
# The SageMaker SDK test needs the container extra in the running Python: pip install -e '.[container]'.
set -uo pipefail
cd "$(dirname "$0")/../.."

skip() {
    echo "container tier: SKIPPED: $*"
    exit 0
}

missing=()
# A client alone (as /usr/local/bin/docker here) is not enough: without an answering daemon, dockerd is needed.
if ! { command -v docker >/dev/null && docker info >/dev/null 2>&1; }; then
    command -v dockerd >/dev/null || missing+=(docker.io)
fi
command -v debootstrap >/dev/null || missing+=(debootstrap)
# The SDK's local mode runs its endpoint with compose (v2 plugin or the v1 docker-compose command).
command -v docker-compose >/dev/null || docker compose version 2>/dev/null | grep -q v2 || missing+=(docker-compose)
if [ ${#missing[@]} -gt 0 ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        echo "container tier: apt-get install ${missing[*]}"
        { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"; } \
            >/tmp/naiad-container-apt.log 2>&1 \
            || echo "container tier: apt-get failed (see /tmp/naiad-container-apt.log); going on with what is here"
    else
        echo "container tier: ${missing[*]} missing and not installable here (needs root and apt-get)"
    fi
fi
command -v docker >/dev/null || skip "no docker client"

# Whether the daemon started as pid $1 answers within $2 seconds (no use waiting once it has exited).
daemon_up() {
    local deadline=$((SECONDS + $2))
    while [ $SECONDS -lt $deadline ] && kill -0 "$1" 2>/dev/null; do
        docker info >/dev/null 2>&1 && return 0
        sleep 0.5
    done
    return 1
}

if ! docker info >/dev/null 2>&1; then
    command -v dockerd >/dev/null || skip "no Docker daemon reachable and no dockerd to start"
    [ "$(id -u)" = 0 ] || skip "no Docker daemon reachable, and starting dockerd needs root"
    log=/tmp/naiad-dockerd.log
    # The defaults (overlay2, a bridge with iptables NAT) are what works on these machines (Linux 6.x, cgroup v1,
    # root); where they don't, the usual culprits are overlay on overlay and a kernel without netfilter.
    if [ -n "${NAIAD_DOCKERD_FLAGS:-}" ]; then
        attempts=("$NAIAD_DOCKERD_FLAGS")
    else
        attempts=("" "--storage-driver=vfs --iptables=false")
    fi
    started=""
    for flags in "${attempts[@]}"; do
        echo "container tier: starting dockerd ${flags:-(default flags)}; log in $log"
        # setsid and no inherited descriptors: the daemon outlives this script and holds none of CI's pipes.
        # shellcheck disable=SC2086
        setsid dockerd $flags >"$log" 2>&1 </dev/null &
        pid=$!
        if daemon_up "$pid" 60; then
            started=yes
            break
        fi
        kill "$pid" 2>/dev/null
        wait "$pid" 2>/dev/null
    done
    [ -n "$started" ] || skip "dockerd would not start here; its log ends with: $(tail -3 "$log" | tr '\n' ' ')"
fi
echo "container tier: Docker $(docker version --format '{{.Server.Version}}' 2>/dev/null) answers"

# The test skips itself too when the base image can't be had; running it here first gives the reason plainly.
tools/container/base_image.sh || skip "no base image (tools/container/base_image.sh failed)"

exec "${PYTHON:-python}" -m pytest -q --durations=0 tests/container/test_docker.py "$@"
