#!/usr/bin/env bash
# CPU and wake-ups per thread of two relay builds side by side, in the same run, against the
# same PostgreSQL and the same broker: idle (RATE=0) or at a low rate (RATE events/s, one per
# transaction), so machine load affects both alike and the comparison is a ratio.
#
#   scripts/profile/side_by_side.sh OLD_BIN NEW_BIN [SECONDS] [RATE]
#   OLD_KAFKA='"linger.ms" = "5"' NEW_KAFKA='' ...   extra [kafka] lines per relay
#
# Also prints each relay's commit->ack window over the measured seconds (GET /latency).
#
# The demo (`OLD_BIN demo --rate 1`) provides a throwaway PostgreSQL and librdkafka's mock
# cluster (3 brokers) in a process of its own; its own orders (1/s, table events_outbox) are
# traffic the measured relays do not publish, like other tables of a service database. Each
# relay gets its own slot and publication on the table profile_outbox, which receives RATE
# inserts/s from pgbench (0: none: the idle case). Per-thread figures come from
# scripts/profile/threads.py (CPU from /proc/PID/task/*/sched, wake-ups = voluntary switches).
set -euo pipefail
OLD=$1 NEW=$2 SECS=${3:-60} RATE=${4:-0}
HERE=$(cd "$(dirname "$0")" && pwd)
WORK=$(mktemp -d /tmp/side_by_side.XXXX)
PGBIN=${PGBIN:-/usr/lib/postgresql/15/bin}
cleanup() {
  for p in ${PIDS:-}; do kill -TERM "$p" 2>/dev/null || true; done
  sleep 2
}
trap cleanup EXIT
"$OLD" demo --rate 1 --duration $((SECS + 90)) >"$WORK/demo.log" 2>&1 &
DEMO=$!; PIDS="$DEMO"
for _ in $(seq 120); do grep -q "PostgreSQL is up at" "$WORK/demo.log" && grep -q "setup done" "$WORK/demo.log" && break; sleep 0.5; done
URL=$(grep -o "PostgreSQL is up at [^ ]*" "$WORK/demo.log" | head -1 | awk '{print $5}')
# The mock brokers are the demo process's other listening sockets (PostgreSQL's port is in URL).
PGPORT=$(echo "$URL" | sed -E 's/.*:([0-9]+)\/.*/\1/')
BOOT=$(ss -ltnpH | grep "pid=$DEMO," | awk '{print $4}' | grep -v ":$PGPORT\$" | paste -sd, -)
echo "postgres $URL; brokers $BOOT; work dir $WORK"
PSQL() { "$PGBIN/psql" -X -q "$URL" "$@"; }
PSQL -c "CREATE TABLE IF NOT EXISTS profile_outbox (LIKE events_outbox INCLUDING DEFAULTS INCLUDING IDENTITY); ALTER TABLE profile_outbox ADD PRIMARY KEY (id)" >/dev/null 2>&1 || true
PSQL -c "CREATE SEQUENCE IF NOT EXISTS profile_outbox_seq" >/dev/null
start_relay() { # NAME BIN PORT EXTRA
  cat >"$WORK/$1.toml" <<TOML
[postgres]
url = "$URL"
slot = "prof_$1"
publication = "prof_$1"
[outbox]
table = "public.profile_outbox"
[kafka]
"bootstrap.servers" = "$BOOT"
$4
[http]
listen = "127.0.0.1:$3"
TOML
  "$2" setup --config "$WORK/$1.toml" >"$WORK/$1.setup.log" 2>&1
  RUST_LOG=info python3 "$HERE/threads.py" --wrap "$WORK/$1.jsonl" -- "$2" run --config "$WORK/$1.toml" >"$WORK/$1.log" 2>&1 &
  PIDS="$PIDS $!"
}
start_relay old "$OLD" 19601 "${OLD_KAFKA:-}"
start_relay new "$NEW" 19602 "${NEW_KAFKA:-}"
for _ in $(seq 60); do grep -q "streaming started" "$WORK/old.log" && grep -q "streaming started" "$WORK/new.log" && break; sleep 0.5; done
if [ "$RATE" -gt 0 ]; then
  echo "INSERT INTO profile_outbox (id, aggregate_id, type, payload) VALUES (nextval('profile_outbox_seq'), gen_random_uuid(), 'profile.event', '{\"n\":1}');" >"$WORK/insert.sql"
  "$PGBIN/pgbench" -n -f "$WORK/insert.sql" -R "$RATE" -T $((SECS + 15)) -c 1 "$URL" >"$WORK/pgbench.log" 2>&1 &
  PIDS="$PIDS $!"
fi
sleep 10   # warm-up: connections, metadata, first batches
T0=$(python3 -c "import json;print(json.loads(open('$WORK/new.jsonl').readlines()[-1])['t'])")
T0OLD=$(python3 -c "import json;print(json.loads(open('$WORK/old.jsonl').readlines()[-1])['t'])")
N0=$(PSQL -At -c "SELECT count(*) FROM profile_outbox")
curl -s "http://127.0.0.1:19601/latency?reset=true" >/dev/null; curl -s "http://127.0.0.1:19602/latency?reset=true" >/dev/null
sleep "$SECS"
N1=$(PSQL -At -c "SELECT count(*) FROM profile_outbox")
LAT_OLD=$(curl -s "http://127.0.0.1:19601/latency"); LAT_NEW=$(curl -s "http://127.0.0.1:19602/latency")
echo "== events in the window: $((N1 - N0)) ($RATE/s asked) =="
for r in old new; do
  t0=$([ $r = new ] && echo "$T0" || echo "$T0OLD")
  echo "== $r: $( [ $r = old ] && echo "$OLD" || echo "$NEW") =="
  echo "$r  commit->ack: $([ $r = old ] && echo "$LAT_OLD" || echo "$LAT_NEW")"
  python3 "$HERE/threads.py" --report "$WORK/$r.jsonl" "$t0" "$(python3 -c "print($t0 + $SECS)")" | sed "s/^/$r  /"
done
