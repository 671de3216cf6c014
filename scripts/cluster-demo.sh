#!/usr/bin/env bash
# make cluster-demo: a cluster on this machine (docs/cluster.md): an etcd
# embedded in bin/arbor-etcd on 127.0.0.1:23790, three nodes (arbor serve,
# each with its own state dir and btrfs pool under $DEMO_DIR) on
# 127.0.0.2, 127.0.0.3 and 127.0.0.4, and a router on 127.0.0.1:7880.
# It runs a short episode through the router (reset, steps, branch(6)
# across the nodes, migrate, a step after it), then keeps the cluster up
# until Ctrl-C (DEMO_HOLD=0: stops after the episode). Every process it
# started is stopped with SIGTERM on exit (the nodes leave the cluster).
set -euo pipefail
BIN=${BIN:-bin}
DIR=${DEMO_DIR:-/tmp/arbor-cluster-demo}
ETCD=http://127.0.0.1:23790
ROUTER=127.0.0.1:7880
mkdir -p "$DIR"
pids=()
stop() {
	for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
}
trap stop EXIT
trap 'exit 130' INT TERM

ready() { # URL, what, log
	for _ in $(seq 600); do
		curl -fsS -m 2 "$1" >/dev/null 2>&1 && return 0
		sleep 0.2
	done
	echo "cluster-demo: $2 did not get ready; see $3" >&2
	exit 1
}

"$BIN/arbor-etcd" --data-dir "$DIR/etcd" --listen 127.0.0.1:23790 --peer 127.0.0.1:23791 2>"$DIR/etcd.log" &
pids+=($!)
ready "$ETCD/health" etcd "$DIR/etcd.log"
echo "etcd on $ETCD"
i=2
for n in a b c; do
	"$BIN/arbor" --state-dir "$DIR/$n" --pool-size 4G serve --listen "127.0.0.$i:7878" \
		--cluster-etcd "$ETCD" --node-id "$n" --cluster-ttl 5s --warm 1 2>"$DIR/$n.log" &
	pids+=($!)
	i=$((i + 1))
done
for i in 2 3 4; do ready "http://127.0.0.$i:7878/readyz" "node on 127.0.0.$i" "$DIR"; done
echo "nodes a, b, c on 127.0.0.2-4:7878 (state in $DIR/a, b, c)"
"$BIN/arbor" router --etcd "$ETCD" --listen "$ROUTER" 2>"$DIR/router.log" &
pids+=($!)
ready "http://$ROUTER/readyz" router "$DIR/router.log"
echo "router on ws://$ROUTER/v1/ws"

env() { "$BIN/arbor" env --server "$ROUTER" "$@"; }
field() { python3 -c 'import sys, json; print(json.load(sys.stdin)'"$1"')'; }
ENV=$(env reset --task hello --json | field '["env_id"]')
echo "reset: env $ENV"
# Where etcd places each env (its JSON gateway; no etcdctl needed).
placements() {
	curl -fsS -m 5 -X POST "$ETCD/v3/kv/range" -d '{"key": "L2FyYm9yL3YxL2VudnMv", "range_end": "L2FyYm9yL3YxL2VudnMw"}' |
		python3 -c 'import sys, json, base64, collections
on = collections.defaultdict(list)
for kv in json.load(sys.stdin).get("kvs", []):
    on[json.loads(base64.b64decode(kv["value"]))["node"]].append(base64.b64decode(kv["key"]).decode().rsplit("/", 1)[1])
print("  placements: " + ", ".join("%s: %d" % (n, len(on[n])) for n in sorted(on)))'
}
env step "$ENV" -- 'export K=v; echo data > /tmp/file; cd /tmp' 2>/dev/null
env branch "$ENV" -n 6 --json | field '["env_ids"]' | sed 's/^/branch(6): /'
placements
env migrate "$ENV" --json | python3 -c 'import sys, json; r = json.load(sys.stdin); print("migrate: %s -> %s at %s, pause %.3f s, total %.3f s, %d + %d bytes" % (r["from"], r["node"], r["state_id"], r["pause_s"], r["took_s"], r["pre_bytes"], r["bytes"]))'
env step "$ENV" -- 'echo "after the move: K=$K cwd=$(pwd) file=$(cat /tmp/file)"'
if [ "${DEMO_HOLD:-1}" = 0 ]; then exit 0; fi
echo "cluster up: arbor env --server $ROUTER ...; Ctrl-C stops it"
wait
