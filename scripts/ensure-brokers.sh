#!/usr/bin/env bash
# Makes sure the brokers the sink suites test against run on 127.0.0.1: NATS with JetStream
# (4222), RabbitMQ (5672, guest/guest) and Redis (6379). The machine normally starts them
# before a session; on a fresh one this installs the Debian packages and starts what is down.
# Each check is bounded; a broker that cannot be started fails the run with its name.
set -euo pipefail

up() { timeout 1 bash -c "echo > /dev/tcp/127.0.0.1/$1" 2>/dev/null; }

wait_up() { # port name seconds
  for _ in $(seq 1 "$3"); do
    if up "$1"; then echo "$2 is up on 127.0.0.1:$1"; return 0; fi
    sleep 1
  done
  echo "$2 did not come up on 127.0.0.1:$1 within $3 s" >&2
  return 1
}

missing=()
command -v nats-server >/dev/null || missing+=(nats-server)
command -v redis-server >/dev/null || missing+=(redis-server)
command -v rabbitmq-server >/dev/null || missing+=(rabbitmq-server)
if [ ${#missing[@]} -gt 0 ]; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${missing[@]}" >/dev/null
fi

if ! up 4222; then
  mkdir -p /var/lib/nats-server
  nohup nats-server -a 127.0.0.1 -p 4222 -js -sd /var/lib/nats-server >/var/log/nats-server.log 2>&1 &
  wait_up 4222 "NATS (JetStream)" 30
else
  echo "NATS is up on 127.0.0.1:4222"
fi

if ! up 6379; then
  nohup redis-server --bind 127.0.0.1 --port 6379 --save '' --appendonly no >/var/log/redis-ci.log 2>&1 &
  wait_up 6379 Redis 30
else
  echo "Redis is up on 127.0.0.1:6379"
fi

if ! up 5672; then
  (service rabbitmq-server start || rabbitmq-server -detached) >/dev/null 2>&1 || true
  wait_up 5672 RabbitMQ 120
else
  echo "RabbitMQ is up on 127.0.0.1:5672"
fi
