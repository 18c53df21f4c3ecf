#!/usr/bin/env bash
# Runs one harness, unmodified and non-interactively, on a small task in a fresh
# temporary directory, pointed at a forgelog proxy with a session key, with no
# network but the proxy: the harness runs in a network namespace of its own
# whose only route out is a veth pair to this host, where a relay forwards one
# port to the proxy. Telemetry and update checks are switched off.
#
# Usage: run.sh HARNESS PROXY_URL SESSION_KEY OUT_DIR [TASK]
#   HARNESS    a harness of kit.txt (claude-code, codex, opencode, ...)
#   PROXY_URL  the proxy as this host reaches it, e.g. http://127.0.0.1:8100
#   OUT_DIR    receives stdout, stderr, exit_code, the sandbox's path
#              (sandbox: removed when the run ends) and the harness's transcript
#              (what each leaves there: see the header of agents/HARNESS.sh)
# Needs root (ip netns). Harnesses come from install.sh ($FORGELOG_HOME/harnesses).
# Exits with the harness's exit status.
set -euo pipefail
[ $# -ge 4 ] || { sed -n '2,14p' "$0" >&2; exit 2; }
HARNESS=$1 PROXY_URL=$2 KEY=$3 OUT=$4
TASK=${5:-"Create a file hello.txt containing the word hello, then say done."}
HERE=$(cd "$(dirname "$0")" && pwd)
FORGELOG_HOME=${FORGELOG_HOME:-$HOME/.cache/forgelog}
H="$FORGELOG_HOME/harnesses"
TIMEOUT=${FORGELOG_HARNESS_TIMEOUT:-300}

rows() { grep -v '^#' "$HERE/kit.txt" | awk 'NF == 4 && $1 != "node"'; }
want=$(rows | awk -v h="$HARNESS" '$1 == h { print $4 }')
[ -n "$want" ] || { echo "run: unknown harness '$HARNESS' (one of: $(rows | awk '{ print $1 }' | paste -sd' '))" >&2; exit 2; }
dir=$H/$HARNESS
if [ "$(cat "$dir/.forgelog-version" 2>/dev/null)" != "$want" ]; then
  echo "run: $HARNESS $want is not installed in $dir; run deploy/harnesses/install.sh $HARNESS" >&2
  exit 3
fi

[ "$(id -u)" = 0 ] || { echo "run: needs root (ip netns, veth) to cut $HARNESS off the network" >&2; exit 4; }
command -v ip >/dev/null || { echo "run: needs iproute2's ip" >&2; exit 4; }

hostport=${PROXY_URL#*://}; hostport=${hostport%%/*}
PROXY_HOST=${hostport%:*} PROXY_PORT=${hostport##*:}
mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd)
WORK=$(mktemp -d -t "forgelog-$HARNESS.XXXXXX")
echo "$WORK" >"$OUT/sandbox"
ns="" host_if="" relay=""
cleanup() {
  if [ -n "$relay" ]; then kill "$relay" 2>/dev/null || true; wait "$relay" 2>/dev/null || true; fi
  # What the harness left running dies with its namespace: Cline's CLI leaves
  # its hub daemon (`cline --cline-hub-daemon`) writing under the sandbox's
  # home, which made removing it fail, and the run with it.
  if [ -n "$ns" ]; then
    for _ in 1 2 3 4 5; do
      pids=$(ip netns pids "$ns" 2>/dev/null) || break
      [ -n "$pids" ] || break
      kill -9 $pids 2>/dev/null || true
      sleep 0.2
    done
    ip netns del "$ns" 2>/dev/null || true
  fi
  if [ -n "$host_if" ]; then ip link del "$host_if" 2>/dev/null || true; fi
  # Cleaning up never changes the harness's exit status.
  rm -rf "$WORK" 2>/dev/null || echo "run: could not remove $WORK" >&2
}
trap cleanup EXIT

# A namespace with lo and one veth to the host: 10.213.N.2 there, 10.213.N.1 here.
for n in $(seq 1 250); do
  if ip link add "flh$n" type veth peer name "fln$n" 2>/dev/null; then host_if="flh$n"; break; fi
done
[ -n "$host_if" ] || { echo "run: cannot create a veth pair (flh1..flh250 all taken, or no CAP_NET_ADMIN)" >&2; exit 1; }
ns="forgelog-$HARNESS-$n"
ip netns add "$ns"
ip link set "fln$n" netns "$ns"
ip addr add "10.213.$n.1/30" dev "$host_if"
ip link set "$host_if" up
ip netns exec "$ns" ip addr add "10.213.$n.2/30" dev "fln$n"
ip netns exec "$ns" ip link set "fln$n" up
ip netns exec "$ns" ip link set lo up
python3 -u "$HERE/relay.py" "10.213.$n.1" "$PROXY_PORT" "$PROXY_HOST" "$PROXY_PORT" >"$WORK/relay.log" 2>&1 &
relay=$!
for _ in $(seq 1 50); do grep -q ready "$WORK/relay.log" 2>/dev/null && break; sleep 0.1; done
URL="http://10.213.$n.1:$PROXY_PORT"
# Checked, not assumed: the proxy is reachable from inside; the routing table
# has no way to anything else (never tested by connecting out).
reach() { ip netns exec "$ns" timeout 3 bash -c "exec 3<>/dev/tcp/$1/$2" 2>/dev/null; }
reach "10.213.$n.1" "$PROXY_PORT" || { echo "run: the proxy is not reachable from the namespace" >&2; exit 1; }
for outside in 1.1.1.1 8.8.8.8; do
  if ip -n "$ns" route get "$outside" >/dev/null 2>&1; then echo "run: the namespace has a route to $outside; refusing to run" >&2; exit 1; fi
done

# A fresh home and project directory: nothing of this machine's configuration leaks in.
mkdir -p "$WORK/home" "$WORK/project"
env_common=(HOME="$WORK/home" PATH="$H/node/bin:/usr/local/bin:/usr/bin:/bin" TERM=dumb NO_COLOR=1
            XDG_CONFIG_HOME="$WORK/home/.config" XDG_DATA_HOME="$WORK/home/.local/share"
            XDG_CACHE_HOME="$WORK/home/.cache" XDG_STATE_HOME="$WORK/home/.local/state")
# The harness starts as `forgelog run` starts it in a sandbox: its launch
# script (agents/HARNESS.sh) with the same environment, the kit's install as
# the bundles directory.
printf '%s' "$TASK" >"$WORK/instruction.md"
env_h=(FORGELOG_BASE_URL="$URL" FORGELOG_API_KEY="$KEY" FORGELOG_INSTRUCTION="$WORK/instruction.md"
       FORGELOG_BUNDLES="$H" FORGELOG_AGENT_LOGS="$OUT")
cmd=(bash "$HERE/agents/$HARNESS.sh")

echo "run: $HARNESS $want in $WORK/project, netns $ns, proxy $URL" >&2
set +e
(cd "$WORK/project" && ip netns exec "$ns" timeout "$TIMEOUT" env -i "${env_common[@]}" "${env_h[@]}" "${cmd[@]}" \
  </dev/null >"$OUT/stdout" 2>"$OUT/stderr")
code=$?
set -e
echo "$code" >"$OUT/exit_code"
echo "run: $HARNESS exited $code (output in $OUT)" >&2
exit "$code"
