#!/usr/bin/env bash
# Two relay builds side by side in one session: the benchmark (benches/cdc_vs_polling) runs
# ROUNDS times with each build in turn (A B, B A, A B, …: the order alternates so a drift of the
# machine's speed favours neither), on a real Kafka broker and Redis, and the medians of each
# figure are printed with the ratio B/A.
#
#   scripts/profile/compare_builds.sh A_BIN B_BIN [ROUNDS]
#   DRAIN_ROWS=200000 MEASURE_SECS=15 ...   the drain size and the steady window (defaults)
#
# Figures: the 1,000 events/s steady runs (commit→consumer p50/p99, relay CPU µs/event) on
# Kafka and Redis, and the drains at 1 and 1,000 events per transaction (events/s, relay CPU
# µs/event) on Kafka and Redis. Needs what the benchmark needs (scripts/install-kafka.sh,
# scripts/ensure-brokers.sh); both builds must accept the benchmark's at-least-once config.
set -euo pipefail
A=$(realpath "$1") B=$(realpath "$2") ROUNDS=${3:-3}
DRAIN_ROWS=${DRAIN_ROWS:-200000} MEASURE_SECS=${MEASURE_SECS:-15}
cd "$(dirname "$0")/../.."
OUT=$(mktemp -d /tmp/compare_builds.XXXX)
echo "results in $OUT"
run() { # BUILD_NAME BIN ROUND
  local dir="$OUT/$1.$3"
  mkdir -p "$dir"
  OUTBOX_RELAY_BENCH_BIN=$2 cargo bench --bench cdc_vs_polling -- --broker kafka --sinks kafka,redis \
    --batched-drain --at-least-once-drain --drain-rows "$DRAIN_ROWS" --measure-secs "$MEASURE_SECS" --only "CDC at 1000/s,CDC → " \
    --no-tracing --idle-secs 0 --out-dir "$dir" >"$dir/bench.log" 2>&1
  cp target/cdc_vs_polling/results.json "$dir/results.json"
  echo "round $3 $1 done"
}
cargo bench --bench cdc_vs_polling --no-run >/dev/null 2>&1
for round in $(seq "$ROUNDS"); do
  if [ $((round % 2)) -eq 1 ]; then run a "$A" "$round"; run b "$B" "$round"; else run b "$B" "$round"; run a "$A" "$round"; fi
done
python3 - "$OUT" "$ROUNDS" <<'PY'
import json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
def figures(path):
    r = json.load(open(path))
    f = {}
    for s in r["steady"]:
        if s["mode"] != "CDC" or s.get("tracing"):
            continue
        sink = s.get("sink", "Kafka")
        latency = (s.get("delivery") or {}).get("latency")
        if latency:
            f[f"{sink} 1,000 ev/s commit→consumer p50 ms"] = latency["p50"]
            f[f"{sink} 1,000 ev/s commit→consumer p99 ms"] = latency["p99"]
        if s.get("relay_cpu_us_per_event") is not None:
            f[f"{sink} 1,000 ev/s relay CPU µs/event"] = s["relay_cpu_us_per_event"]
    for key, per in (("drain", 1), ("batched_drain", 1000)):
        d = r.get(key)
        if not d:
            continue
        f[f"Kafka drain {per}/txn ev/s"] = d["relay_per_s"]
        f[f"Kafka drain {per}/txn relay CPU µs/event"] = d["relay_cpu_us_per_event"]
        for sd in d.get("sinks", []):
            f[f"{sd['sink']} drain {per}/txn ev/s"] = sd["per_s"]
            f[f"{sd['sink']} drain {per}/txn relay CPU µs/event"] = sd["cpu_us_per_event"]
    return f
runs = {b: [figures(f"{out}/{b}.{i}/results.json") for i in range(1, rounds + 1)] for b in "ab"}
keys = [k for k in runs["a"][0] if all(k in r for b in "ab" for r in runs[b])]
print(f"| figure ({rounds} runs each, medians) | A | B | B/A |")
print("|---|--:|--:|--:|")
for k in keys:
    a = statistics.median(r[k] for r in runs["a"])
    b = statistics.median(r[k] for r in runs["b"])
    ratio = b / a if a else float("nan")
    print(f"| {k} | {a:,.2f} | {b:,.2f} | {ratio:.3f} |")
PY
