#!/usr/bin/env bash
# Makes sure Google's Pub/Sub emulator is installed for the Pub/Sub sink's tests
# (tests/it/conformance.rs, sink_pubsub.rs): the Debian package google-cloud-cli-pubsub-emulator, which puts it
# under /usr/lib/google-cloud-sdk/platform/pubsub-emulator, and a Java runtime (17 or later) to
# run it. Nothing is started here: each test runs an emulator of its own on a free loopback port
# (tests/it/harness/pubsub.rs). Without it those tests SKIP loudly (and fail under CI).
set -euo pipefail

EMULATOR=/usr/lib/google-cloud-sdk/platform/pubsub-emulator/bin/cloud-pubsub-emulator

if [ ! -x "$EMULATOR" ] || ! command -v java >/dev/null; then
  export DEBIAN_FRONTEND=noninteractive
  if ! apt-cache policy google-cloud-cli-pubsub-emulator 2>/dev/null | grep -q 'Candidate: [0-9]'; then
    # Google's apt repository (https://cloud.google.com/sdk/docs/install#deb).
    apt-get update -qq
    apt-get install -y -qq ca-certificates curl gnupg >/dev/null
    curl -fsSL https://packages.cloud.google.com/apt/doc/apt-key.gpg \
      | gpg --dearmor --yes -o /usr/share/keyrings/cloud.google.gpg
    echo "deb [signed-by=/usr/share/keyrings/cloud.google.gpg] https://packages.cloud.google.com/apt cloud-sdk main" \
      > /etc/apt/sources.list.d/google-cloud-sdk.list
  fi
  apt-get update -qq
  apt-get install -y -qq google-cloud-cli-pubsub-emulator openjdk-17-jre-headless >/dev/null
fi

java -version 2>&1 | head -1
dpkg-query -W -f='google-cloud-cli-pubsub-emulator ${Version}\n' google-cloud-cli-pubsub-emulator 2>/dev/null \
  || echo "Pub/Sub emulator at $EMULATOR"
test -x "$EMULATOR"
