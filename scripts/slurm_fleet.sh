#!/usr/bin/env bash
# One eagledata job over a fleet of SGLang servers, under SLURM (docs/fleet.md).
#
#   sbatch --nodes=4 scripts/slurm_fleet.sh                               # 4 servers, one per node
#   PROFILE=kimi-k25-h100x16 NODES_PER_SERVER=2 sbatch --nodes=4 scripts/slurm_fleet.sh   # 2 TP16
#
# 1. One SGLang server per node (or per NODES_PER_SERVER nodes, for a profile that spans them:
#    every node of it gets its --node-rank and the same --dist-init-addr), each started by
#    `eagledata launch-server --profile PROFILE` (bf16 KV enforced, /health waited on, the bf16
#    guard run on its /server_info), listening on all interfaces on the profile's port.
# 2. sglang-router on this (the first) node, in front of every server's node rank 0:
#    `eagledata launch-server --router URL...` waits until the router counts every server
#    healthy and checks each one's KV cache (a server that is not bf16 stops the job, named).
# 3. `eagledata generate --server ROUTER_URL`: one job over every server; its KV guard and its
#    canary check each server behind the router directly, periodically. The run directory is
#    resumable: resubmit with the same OUT and `eagledata resume OUT --server ROUTER_URL` follows.
#
# Settings (environment): PROFILE, NODES_PER_SERVER, DATASET, OUT, ROUTER_PORT, DIST_PORT, LOGS;
# EAGLEDATA (the eagledata command), CONFIG (a --config file for generate).
#SBATCH --job-name=eagledata-fleet
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=8
#SBATCH --exclusive
#SBATCH --time=3-00:00:00
set -euo pipefail

PROFILE=${PROFILE:-kimi-k25-h200-tp8-eagle3}
NODES_PER_SERVER=${NODES_PER_SERVER:-1}
DATASET=${DATASET:-b2}
OUT=${OUT:-runs/${SLURM_JOB_ID:-fleet}}
ROUTER_PORT=${ROUTER_PORT:-30100}
DIST_PORT=${DIST_PORT:-50000}
LOGS=${LOGS:-logs/${SLURM_JOB_ID:-fleet}}
EAGLEDATA=${EAGLEDATA:-eagledata}
SERVER_PORT=${SERVER_PORT:-30000} # the profile's [server] port: launch-server waits on it there

mapfile -t NODES < <(scontrol show hostnames "$SLURM_JOB_NODELIST")
if (( ${#NODES[@]} == 0 || ${#NODES[@]} % NODES_PER_SERVER != 0 )); then
    echo "slurm_fleet.sh: ${#NODES[@]} nodes do not split into servers of $NODES_PER_SERVER" >&2
    exit 2
fi
mkdir -p "$LOGS"

steps=()  # the srun steps of the servers
router=""
cleanup() { # the router's launch-server stops the router on Ctrl-C; srun passes TERM to its
    # task, and SLURM ends whatever of the job is left when the job ends
    [[ -n "$router" ]] && kill -INT "$router" 2>/dev/null || true
    for pid in "${steps[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
    wait || true
}
trap cleanup EXIT

workers=()
servers=$(( ${#NODES[@]} / NODES_PER_SERVER ))
for (( s = 0; s < servers; s++ )); do
    head=${NODES[s * NODES_PER_SERVER]}
    for (( r = 0; r < NODES_PER_SERVER; r++ )); do
        node=${NODES[s * NODES_PER_SERVER + r]}
        place=()
        if (( NODES_PER_SERVER > 1 )); then
            place=(--node-rank "$r" --dist-init-addr "$head:$DIST_PORT")
        fi
        srun --nodes=1 --ntasks=1 --nodelist="$node" \
            "$EAGLEDATA" launch-server --profile "$PROFILE" "${place[@]}" -- --host 0.0.0.0 \
            >"$LOGS/server-$node.log" 2>&1 &
        steps+=("$!")
    done
    workers+=(--router "http://$head:$SERVER_PORT") # node rank 0 serves HTTP
done

"$EAGLEDATA" launch-server "${workers[@]}" --router-host 0.0.0.0 --router-port "$ROUTER_PORT" \
    >"$LOGS/router.log" 2>&1 &
router=$!
until grep -q '^router ready at ' "$LOGS/router.log"; do
    if ! kill -0 "$router" 2>/dev/null; then # refused a server (exit 4) or failed: say why
        cat "$LOGS/router.log" >&2
        exit 4
    fi
    sleep 2
done

config=()
[[ -n "${CONFIG:-}" ]] && config=(--config "$CONFIG")
router_url="http://$(hostname):$ROUTER_PORT"
if [[ -f "$OUT/run.json" ]]; then
    "$EAGLEDATA" resume "$OUT" --server "$router_url"
else
    "$EAGLEDATA" generate "${config[@]}" --dataset "$DATASET" --server "$router_url" --out "$OUT"
fi
