#!/usr/bin/env bash
# Installs the official Python CloudEvents SDK (cloudevents 1.11.0 and its dependency
# `deprecation`, from PyPI) into a virtualenv cached at
#   ~/.cache/outbox-relay/venv-cloudevents
# which tests/it/cloudevents.rs uses to read back the records the relay wrote
# (`cloudevents.kafka.from_binary` / `from_structured`).
#
# Idempotent: does nothing when the venv already imports the SDK. Exits 0 even when something
# is missing, so CI goes on: the test then prints a loud SKIPPING line naming what is missing.
set -u

SDK_VERSION=1.11.0
CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/outbox-relay"
VENV="$CACHE/venv-cloudevents"

if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c "import cloudevents.kafka" >/dev/null 2>&1; then
    exit 0
fi
if ! command -v python3 >/dev/null 2>&1 || ! python3 -m venv --help >/dev/null 2>&1; then
    echo "install-cloudevents-sdk: installing python3-venv"
    if command -v apt-get >/dev/null 2>&1; then
        export DEBIAN_FRONTEND=noninteractive
        (apt-get update -qq && apt-get install -y -qq python3-venv >/dev/null) \
            || echo "install-cloudevents-sdk: apt-get could not install python3-venv" >&2
    fi
fi
mkdir -p "$CACHE"
rm -rf "$VENV"
if ! python3 -m venv "$VENV"; then
    echo "install-cloudevents-sdk: python3 -m venv failed; the CloudEvents SDK test will be SKIPPED" >&2
    rm -rf "$VENV"
    exit 0
fi
if ! "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "cloudevents==$SDK_VERSION"; then
    echo "install-cloudevents-sdk: pip could not install cloudevents==$SDK_VERSION; the CloudEvents SDK test will be SKIPPED" >&2
    rm -rf "$VENV"
    exit 0
fi
echo "install-cloudevents-sdk: cloudevents $SDK_VERSION in $VENV"
