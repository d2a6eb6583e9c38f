#!/usr/bin/env bash
# A real compose run of docker-compose.yml on this host with podman, no registry (docs/deploy.md, "A real compose
# run with podman"): Debian's podman driven by Debian's docker-compose 1.29 through `podman system service`.
#
#   make compose-e2e          # as root (apt-get, debootstrap, rootful podman)
#
# Steps (each timed; the log goes to $E2E_WORK/compose-e2e.log too):
#   1. podman, debootstrap, docker-compose (and catatonit for `init: true`) via apt-get when missing;
#      /etc/containers/containers.conf gets `[containers] default_ulimits = []` (podman cannot start containers
#      here otherwise)
#   2. base images from Debian packages: a debootstrapped bookworm root with python3 + python3-venv; a copy of it
#      with redis-server added, imported as localhost/pdserve-redis:bookworm (REDIS_IMAGE: no third-party image is
#      reachable); the root itself with docker-compose added (the autoscaler service's compose CLI), imported as
#      localhost/pdserve-base:bookworm. Skipped when present (E2E_REBUILD_BASE=1 rebuilds them).
#   3. the wheelhouse (scripts/wheelhouse.sh cpu) and `podman build --format docker --target cpu`
#   4. `podman system service` on a private socket (DOCKER_HOST for docker-compose; CONTAINER_SOCKET, group-readable,
#      for the autoscaler container), and a loop running
#      `podman healthcheck run` on the project's containers every E2E_HEALTH_INTERVAL_S seconds: with no systemd,
#      podman runs no healthcheck by itself, and `depends_on: condition: service_healthy` would wait forever
#   5. `up -d`, wait for router, prefill, decode and the autoscaler to be healthy
#   6. `pdserve generate "The capital of France is" --max-tokens 8 --temperature 0` through the published router
#      port must print " Paris."
#   7. the autoscaler scales decode to 2 (its container re-created with PDSERVE_MIN_DECODE=2: its compose connector
#      runs `docker-compose up -d --no-deps --no-recreate --scale decode=2 decode` inside it); once the new pod
#      serves, the router must send it a request within 5 s
#   8. the autoscaler scales decode back to 1 (PDSERVE_MAX_DECODE=1) while clients send requests: compose SIGTERMs
#      the new pod, which drains; no request fails
#   9. `down`: every container and the network gone; the health loop and the podman service stopped (also on
#      failure, by the EXIT trap)
#
# Environment: E2E_WORK (default /var/tmp/pdserve-e2e: rootfs, socket, log), E2E_PROJECT (compose project,
# default pdserve-e2e), PDSERVE_ROUTER_PORT (published router port, default 58051: not 50051, which local test
# runs use), DEBIAN_MIRROR, PDSERVE_CLI (a host `pdserve` for the client calls; default .venv/bin/pdserve, then
# pdserve on PATH, else the image with --network host), E2E_HEALTH_INTERVAL_S (default 3), E2E_KEEP_UP=1 (skip
# the final down, for debugging; the health loop and the service still stop).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT="$PWD"

E2E_WORK="${E2E_WORK:-/var/tmp/pdserve-e2e}"
PROJECT="${E2E_PROJECT:-pdserve-e2e}"
# NOTE: the Debian mirror this machine's apt uses (deb822 .sources or a sources.list line), unless DEBIAN_MIRROR
# names one: the repository names no package registry of its own.
apt_mirror() {
  local file uri
  for file in /etc/apt/sources.list.d/*.sources /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    [[ -f "$file" ]] || continue
    while read -r uri; do
      [[ "$uri" == *-security* ]] || { echo "$uri"; return 0; }
    done < <(awk '/^URIs:/ {print $2} $1 == "deb" {for (i = 2; i <= NF; i++) if ($i ~ /^https?:/) {print $i; break}}' "$file")
  done
  return 0
}
DEBIAN_MIRROR="${DEBIAN_MIRROR:-$(apt_mirror)}"
if [[ -z "$DEBIAN_MIRROR" ]]; then
  echo "compose-e2e: no Debian mirror in this machine's apt configuration; set DEBIAN_MIRROR" >&2
  exit 2
fi
HEALTH_INTERVAL_S="${E2E_HEALTH_INTERVAL_S:-3}"
BASE_IMAGE=localhost/pdserve-base:bookworm
REDIS_IMAGE=localhost/pdserve-redis:bookworm
IMAGE=localhost/pdserve:cpu
export PDSERVE_ROUTER_PORT="${PDSERVE_ROUTER_PORT:-58051}"
export PDSERVE_IMAGE="$IMAGE" REDIS_IMAGE COMPOSE_PROJECT_NAME="$PROJECT"
# NOTE: URL-safe (it goes into --redis-url); a fresh one per run.
REDIS_PASSWORD="$(od -An -tx1 -N24 /dev/urandom | tr -d ' \n')"
export REDIS_PASSWORD
ROUTER="127.0.0.1:$PDSERVE_ROUTER_PORT"
PROMPT="The capital of France is"

mkdir -p "$E2E_WORK"
LOG="$E2E_WORK/compose-e2e.log"
exec > >(tee "$LOG") 2>&1

T0=$(date +%s)
STEP_T=$T0
STEP_NAME=""
TIMINGS=()
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }  # seconds since a now() value
elapsed() { echo $(( $(date +%s) - $1 )); }
step() {
  local t
  t=$(date +%s)
  if [[ -n "$STEP_NAME" ]]; then TIMINGS+=("$(printf '%5ss  %s' $((t - STEP_T)) "$STEP_NAME")"); fi
  STEP_NAME="$*"
  STEP_T=$t
  printf '\n==> [%s +%ss] %s\n' "$(date -u +%H:%M:%S)" $((t - T0)) "$*"
}
run() { printf '$ %s\n' "$*"; "$@"; }
fail() { printf 'FAIL: %s\n' "$*"; exit 1; }

[[ $(id -u) -eq 0 ]] || fail "run as root (apt-get, debootstrap, rootful podman)"

SERVICE_PID=""
HEALTH_PID=""
COMPOSE=(docker-compose --project-directory "$ROOT" -f "$ROOT/docker-compose.yml" -p "$PROJECT")

cleanup() {
  local rc=$?
  set +e
  if [[ -n "$SERVICE_PID" && "${E2E_KEEP_UP:-0}" != 1 ]]; then
    if [[ -n "$(podman ps -aq --filter "label=com.docker.compose.project=$PROJECT")" ]]; then
      echo "cleanup: removing the project's containers"
      "${COMPOSE[@]}" down --remove-orphans --timeout 10 >/dev/null 2>&1
    fi
  fi
  [[ -n "$HEALTH_PID" ]] && kill "$HEALTH_PID" 2>/dev/null && wait "$HEALTH_PID" 2>/dev/null
  [[ -n "$SERVICE_PID" ]] && kill "$SERVICE_PID" 2>/dev/null && wait "$SERVICE_PID" 2>/dev/null
  if [[ "${E2E_KEEP_UP:-0}" != 1 ]]; then
    podman ps -aq --filter "label=com.docker.compose.project=$PROJECT" | xargs -r podman rm -f -t 5 >/dev/null 2>&1
  fi
  if [[ ${#TIMINGS[@]} -gt 0 || -n "$STEP_NAME" ]]; then
    step "end"
    printf '\nTimings:\n'
    printf '  %s\n' "${TIMINGS[@]}"
    printf '  total %ss, exit %s\n' "$(elapsed "$T0")" "$rc"
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 143' TERM INT

# ---------------------------------------------------------------------------------------------------------------
step "1. host packages and containers.conf"
missing=()
command -v podman >/dev/null || missing+=(podman)
command -v debootstrap >/dev/null || missing+=(debootstrap)
command -v docker-compose >/dev/null || missing+=(docker-compose)
[[ -x /usr/libexec/podman/catatonit ]] || missing+=(catatonit)
command -v aardvark-dns >/dev/null || [[ -x /usr/lib/podman/aardvark-dns ]] || missing+=(aardvark-dns)
if ((${#missing[@]})); then
  run apt-get update -qq
  run env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi
conf=/etc/containers/containers.conf
mkdir -p /etc/containers
if ! grep -qE '^\s*default_ulimits\s*=\s*\[\s*\]' "$conf" 2>/dev/null; then
  if grep -q '^\[containers\]' "$conf" 2>/dev/null; then
    sed -i '/^\[containers\]/a default_ulimits = []' "$conf"
  else
    printf '[containers]\ndefault_ulimits = []\n' >>"$conf"
  fi
fi
# NOTE: on a hybrid cgroup host (v1 controllers, and a cgroup2 mount at /sys/fs/cgroup/unified with controllers
# enabled: hugetlb here) Debian's crun 1.8 refuses every container ("cgroups in hybrid mode not supported, drop all
# controllers from cgroupv2"); runc runs them. containers.conf's [engine] runtime covers podman run, podman build
# and the API service alike.
if [[ -n "$(cat /sys/fs/cgroup/unified/cgroup.controllers 2>/dev/null)" ]] && ! grep -qE '^\s*runtime\s*=' "$conf"; then
  command -v runc >/dev/null || run env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq runc >/dev/null
  printf '[engine]\nruntime = "runc"\n' >>"$conf"
fi
run cat "$conf"
run podman --version
run docker-compose version --short

# ---------------------------------------------------------------------------------------------------------------
step "2. base images from Debian packages (debootstrap bookworm, podman import)"
chroot_install() {  # chroot_install ROOT PACKAGE...: apt-get install into a debootstrapped root, no daemon started
  local root=$1
  shift
  printf '#!/bin/sh\nexit 101\n' >"$root/usr/sbin/policy-rc.d"
  chmod +x "$root/usr/sbin/policy-rc.d"
  run chroot "$root" sh -c "apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $* >/dev/null && apt-get clean && rm -rf /var/lib/apt/lists/*"
  rm -f "$root/usr/sbin/policy-rc.d"
}
has_compose_cli() { podman run --rm --no-healthcheck "$BASE_IMAGE" test -x /usr/bin/docker-compose 2>/dev/null; }
if [[ "${E2E_REBUILD_BASE:-0}" == 1 ]] || ! podman image exists "$BASE_IMAGE" || ! podman image exists "$REDIS_IMAGE" \
  || ! has_compose_cli; then
  rootfs="$E2E_WORK/rootfs"
  rm -rf "$rootfs" "$rootfs-redis"
  printf '$ debootstrap --variant=minbase --include=python3,python3-venv bookworm %s %s\n' "$rootfs" "$DEBIAN_MIRROR"
  debootstrap --variant=minbase --include=python3,python3-venv bookworm "$rootfs" "$DEBIAN_MIRROR" \
    >"$E2E_WORK/debootstrap.log" 2>&1 || { tail -n 20 "$E2E_WORK/debootstrap.log"; fail "debootstrap failed"; }
  rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
  # Redis: the same root plus Debian's redis-server (redis-cli comes with it, for the healthcheck).
  cp -a "$rootfs" "$rootfs-redis"
  chroot_install "$rootfs-redis" redis-server
  printf '$ tar -C %s -c . | podman import - %s\n' "$rootfs-redis" "$REDIS_IMAGE"
  tar -C "$rootfs-redis" -c . | podman import --message "pdserve-base + redis-server" \
    --change 'USER redis' --change 'CMD ["redis-server"]' - "$REDIS_IMAGE"
  # The pdserve base: plus Debian's docker-compose, the compose CLI the autoscaler service runs.
  chroot_install "$rootfs" docker-compose
  printf '$ tar -C %s -c . | podman import - %s\n' "$rootfs" "$BASE_IMAGE"
  tar -C "$rootfs" -c . | podman import --message "debootstrap bookworm minbase + python3 python3-venv docker-compose" \
    - "$BASE_IMAGE"
  rm -rf "$rootfs" "$rootfs-redis"
else
  echo "present: $BASE_IMAGE $REDIS_IMAGE (E2E_REBUILD_BASE=1 rebuilds them)"
fi
run podman images --format '{{.Repository}}:{{.Tag}} {{.Size}}' --filter reference='localhost/pdserve-*'

# ---------------------------------------------------------------------------------------------------------------
step "3a. wheelhouse"
# NOTE: this host's pip config names index folders that are missing: pip warns once per package.
run bash scripts/wheelhouse.sh cpu 2> >(grep -v "^WARNING: Location 'file://" >&2)

step "3b. podman build --format docker --target cpu"
run podman build --format docker --target cpu --build-arg BASE_IMAGE="$BASE_IMAGE" -t "$IMAGE" .
run podman image inspect "$IMAGE" --format 'size {{.Size}} healthcheck {{.HealthCheck.Test}} user {{.User}}'

# ---------------------------------------------------------------------------------------------------------------
step "4. podman system service and the healthcheck loop"
sock="$E2E_WORK/podman.sock"
rm -f "$sock"
podman system service --time=0 "unix://$sock" >"$E2E_WORK/podman-service.log" 2>&1 &
SERVICE_PID=$!
export DOCKER_HOST="unix://$sock"
for _ in $(seq 50); do [[ -S "$sock" ]] && break; sleep 0.2; done
[[ -S "$sock" ]] || fail "podman system service did not open $sock"
# NOTE: podman makes the socket 0600 root:root; the autoscaler container (uid 10001, group_add DOCKER_GID=0) needs
# group rw, as on Docker's 0660 root:docker /var/run/docker.sock.
chmod 0660 "$sock"
export CONTAINER_SOCKET="$sock" DOCKER_GID=0 PDSERVE_AUTOSCALE_INTERVAL_S=2
run docker-compose version --short >/dev/null
# NOTE: one `podman healthcheck run` per container with a healthcheck, all at once (a pdserve check takes
# about a second of CPU), every HEALTH_INTERVAL_S seconds. It stands in for the systemd timers podman would
# otherwise create; the intervals in the compose file are not honoured, only this one.
(
  while true; do
    for name in $(podman ps --filter "label=com.docker.compose.project=$PROJECT" --format '{{.Names}}'); do
      podman healthcheck run "$name" >/dev/null 2>&1 &
    done
    wait
    sleep "$HEALTH_INTERVAL_S"
  done
) &
HEALTH_PID=$!
echo "podman system service pid $SERVICE_PID on $sock; healthcheck loop pid $HEALTH_PID every ${HEALTH_INTERVAL_S}s"

# The host's client, or the image on the host network (either reaches the published port).
if [[ -n "${PDSERVE_CLI:-}" ]]; then
  read -ra CLI <<<"$PDSERVE_CLI"
elif [[ -x .venv/bin/pdserve ]]; then
  CLI=(.venv/bin/pdserve)
elif command -v pdserve >/dev/null; then
  CLI=(pdserve)
else
  CLI=(podman run --rm --network host --no-healthcheck "$IMAGE")
fi
generate() { "${CLI[@]}" generate "$PROMPT" --address "$ROUTER" --max-tokens "${1:-8}" --temperature 0 --timeout-s 60; }

health_of() { podman inspect --format '{{.State.Health.Status}}' "$1" 2>/dev/null || echo missing; }
containers_of() { podman ps -a --filter "label=com.docker.compose.project=$PROJECT" \
  --filter "label=com.docker.compose.service=$1" --format '{{.Names}}' | sort; }
wait_healthy() {  # wait_healthy TIMEOUT_S NAME...: every NAME healthy
  local deadline=$(($(date +%s) + $1)) name state
  shift
  for name in "$@"; do
    while state=$(health_of "$name"); [[ "$state" != healthy ]]; do
      [[ "$state" == unhealthy || "$state" == missing ]] && { podman logs --tail 30 "$name"; fail "$name is $state"; }
      (($(date +%s) < deadline)) || { podman logs --tail 30 "$name"; fail "$name not healthy in time ($state)"; }
      sleep 1
    done
    echo "$name healthy at +$(elapsed "$T0")s"
  done
}
# The registry, as the router's container sees it (the password stays out of the log). NOTE: a generous timeout:
# podman's DNS (aardvark) reloads when a container joins the network, and a lookup of `redis` right after the
# autoscaler's start took longer than pdserve status's default 2 s (2 of 4 runs, 2026-11-27).
STATUS=(pdserve status --timeout-s 15)
pod_status() {
  echo "\$ podman exec ${routers[0]} ${STATUS[*]} --redis-url redis://:***@redis:6379/0"
  podman exec "${routers[0]}" "${STATUS[@]}" --redis-url "redis://:$REDIS_PASSWORD@redis:6379/0"
}
# Finished requests a decode container has counted (its /metrics on 9100, read from inside it).
served_by() {
  podman exec "$1" python -c '
import urllib.request
text = urllib.request.urlopen("http://127.0.0.1:9100/metrics", timeout=5).read().decode()
print(int(sum(float(l.split()[-1]) for l in text.splitlines() if l.startswith("pdserve:request_success_total{"))))'
}

# ---------------------------------------------------------------------------------------------------------------
step "5. up -d, wait until healthy"
run "${COMPOSE[@]}" up -d
run podman ps --filter "label=com.docker.compose.project=$PROJECT" --format '{{.Names}} {{.Status}}'
mapfile -t routers < <(containers_of router)
mapfile -t prefills < <(containers_of prefill)
mapfile -t decodes < <(containers_of decode)
wait_healthy 600 "${routers[@]}" "${prefills[@]}" "${decodes[@]}"
mapfile -t autoscalers < <(containers_of autoscaler)
wait_healthy 120 "${autoscalers[@]}"
run podman ps --filter "label=com.docker.compose.project=$PROJECT" --format '{{.Names}} {{.Status}}'
pod_status

# ---------------------------------------------------------------------------------------------------------------
step "6. pdserve generate through the published router port ($ROUTER)"
printf '$ %s generate %q --address %s --max-tokens 8 --temperature 0\n' "${CLI[*]}" "$PROMPT" "$ROUTER"
out="$(generate 8)"
printf '%s\n' "$out"
[[ "$out" == *" Paris."* ]] || fail "expected \" Paris.\" in the completion"

# ---------------------------------------------------------------------------------------------------------------
step "7. the autoscaler scales decode to 2: the router uses the new pod within 5 s"
registered() {  # registered ROLE: the pod ids of that role in the registry
  podman exec "${routers[0]}" "${STATUS[@]}" --json --redis-url "redis://:$REDIS_PASSWORD@redis:6379/0" |
    python3 -c 'import json, sys; print(" ".join(p["pod_id"] for p in json.load(sys.stdin)["pods"] if p["role"] == sys.argv[1]))' "$1"
}
read -ra old_ids <<<"$(registered decode)"
echo "decode pods registered: ${old_ids[*]}"
# The compose connector's lines of the autoscaler's log (the commands it ran, and their end).
autoscaler_log() { podman logs "$(containers_of autoscaler | head -n 1)" 2>&1 | grep -E 'autoscaler: (adding|draining|done|.* exited with)' || true; }
t_scale=$(now)
# NOTE: re-created with decode bounds 2..2, the autoscaler's planner asks for one more decode pod (the bounds rule)
# and its compose connector adds it from inside its container.
run env PDSERVE_MIN_DECODE=2 PDSERVE_MAX_DECODE=2 "${COMPOSE[@]}" up -d --no-deps autoscaler
new=""
while [[ -z "$new" ]]; do
  for name in $(containers_of decode); do [[ " ${decodes[*]} " == *" $name "* ]] || new="$name"; done
  [[ -n "$new" ]] && break
  [[ $(since "$t_scale" | cut -d. -f1) -lt 120 ]] || { autoscaler_log; fail "the autoscaler added no decode container in 120 s"; }
  sleep 1
done
echo "the autoscaler added $new $(since "$t_scale")s after it was re-created:"
autoscaler_log
echo "new decode container: $new (hostname $(podman inspect --format '{{.Config.Hostname}}' "$new"))"
# NOTE: requests go through the router from the start, two at a time (so the pick is not only the tie-break
# between idle pods), until one reports (`pdserve generate` prints the pods on stderr: decode_pod=...) a decode pod
# that was not registered before: the time from the new pod's registration to that is what the router took.
new_id=""
used_after=""
while :; do
  generate 4 >/dev/null 2>"$E2E_WORK/gen-a.err" & ga=$!
  generate 4 >/dev/null 2>"$E2E_WORK/gen-b.err" || fail "a request failed: $(cat "$E2E_WORK/gen-b.err")"
  wait "$ga" || fail "a request failed: $(cat "$E2E_WORK/gen-a.err")"
  for id in $(grep -ho 'decode_pod=[^ ]*' "$E2E_WORK"/gen-[ab].err | cut -d= -f2); do
    [[ " ${old_ids[*]} " == *" $id "* ]] || new_id="$id"
  done
  if [[ -n "$new_id" ]]; then t_used=$(now); used_after=$(since "$t_scale"); break; fi
  [[ $(since "$t_scale" | cut -d. -f1) -lt 300 ]] || break
done
[[ -n "$used_after" ]] || fail "the router sent the new decode pod nothing in 300 s"
# NOTE: the pod registers when it starts serving (its log says "serving on"; the container's clock is the host's,
# UTC): the bound is checked from there.
serving="$(podman logs "$new" 2>&1 | grep -m1 'pod.runtime: .* serving on' | cut -c1-23 | tr , .)"
t_serving=$(date -u -d "$serving" +%s.%N)
used_after_serving=$(awk -v a="$t_serving" -v b="$t_used" 'BEGIN { printf "%.1f", b - a }')
echo "the first request served by $new ($new_id) finished ${used_after_serving}s after the pod registered" \
  "(its log: serving at $serving), ${used_after}s after the scale-up began"
awk -v u="$used_after_serving" 'BEGIN { exit !(u <= 5) }' || fail "the new pod was used only after ${used_after_serving}s (> 5 s)"
wait_healthy 600 "$new"
echo "$new healthy $(since "$t_scale")s after the scale-up began"
pod_status

# ---------------------------------------------------------------------------------------------------------------
step "8. the autoscaler scales decode back to 1 under load: the removed pod drains, no request fails"
results="$E2E_WORK/scale-down-results"
rm -f "$results"
stop_flag="$E2E_WORK/scale-down.stop"
rm -f "$stop_flag"
client() {
  while [[ ! -e "$stop_flag" ]]; do
    if out="$(generate 32 2>&1)"; then echo "ok $(date +%s) $(grep -o 'decode_pod=[^ ]*' <<<"$out")" >>"$results"
    else echo "FAILED $(date +%s) $(printf '%s' "$out" | tail -n 2 | tr '\n' ' ')" >>"$results"; fi
  done
}
client & c1=$!
client & c2=$!
client & c3=$!
# The removed container's log (its drain) and its exit status, followed from before the scale-down.
podman logs -f "$new" >"$E2E_WORK/removed-decode.log" 2>&1 & logs_pid=$!
podman wait "$new" >"$E2E_WORK/removed-decode.exit" 2>&1 & wait_pid=$!
sleep 3
before=$(served_by "$new" || echo "?")
t_down=$(date +%s)
run env PDSERVE_MIN_DECODE=1 PDSERVE_MAX_DECODE=1 "${COMPOSE[@]}" up -d --no-deps autoscaler
# NOTE: compose (in the autoscaler) stops the highest-numbered decode container, $new, and removes it once it exited.
while podman container exists "$new"; do
  (($(date +%s) < t_down + 180)) || { autoscaler_log; fail "$new is still there 180 s after the autoscaler was re-created"; }
  sleep 1
done
echo "$new removed $(elapsed "$t_down")s after the autoscaler was re-created; it had finished $before requests" \
  "when the scale-in began. The autoscaler:"
autoscaler_log
sleep 3
touch "$stop_flag"
wait "$c1" "$c2" "$c3"
wait "$wait_pid" || true
kill "$logs_pid" 2>/dev/null || true; wait "$logs_pid" 2>/dev/null || true
echo "$new exit status: $(cat "$E2E_WORK/removed-decode.exit"); the end of its log:"
tail -n 6 "$E2E_WORK/removed-decode.log"
oks=$(grep -c '^ok' "$results" || true)
fails=$(grep -c '^FAILED' "$results" || true)
echo "requests during the scale-down: $oks ok, $fails failed; by decode pod:"
grep -o 'decode_pod=[^ ]*' "$results" | sort | uniq -c
grep '^FAILED' "$results" || true
mapfile -t decodes3 < <(containers_of decode)
echo "decode containers now: ${decodes3[*]}"
[[ " ${decodes3[*]} " != *" $new "* ]] || fail "$new is still there"
((fails == 0)) || fail "$fails requests failed during the scale-down"
pod_status

# ---------------------------------------------------------------------------------------------------------------
if [[ "${E2E_KEEP_UP:-0}" == 1 ]]; then
  echo "E2E_KEEP_UP=1: leaving the project up (DOCKER_HOST=$DOCKER_HOST stops with this script)"
  exit 0
fi
step "9. down"
t_stop=$(date +%s)
run "${COMPOSE[@]}" stop
echo "stop took $(elapsed "$t_stop")s"
run podman ps -a --filter "label=com.docker.compose.project=$PROJECT" --format '{{.Names}} {{.Status}}'
bad="$(podman ps -a --filter "label=com.docker.compose.project=$PROJECT" --format '{{.Names}} {{.Status}}' | grep -v 'Exited (0)' || true)"
run "${COMPOSE[@]}" down --remove-orphans
[[ -z "$bad" ]] || fail "not a clean stop: $bad"
left="$(podman ps -aq --filter "label=com.docker.compose.project=$PROJECT")"
[[ -z "$left" ]] || fail "containers left: $left"
! podman network ls --format '{{.Name}}' | grep -qx "${PROJECT}_pdserve" || fail "network ${PROJECT}_pdserve left"
echo "PASS: compose e2e"
