#!/usr/bin/env bash
# Installs the official Python Standard Webhooks library (`standardwebhooks` from PyPI, with its
# dependencies) into a virtualenv cached at
#   ~/.cache/outbox-relay/venv-standardwebhooks
# which tests/it/sink_webhook.rs uses to verify the signatures of the requests the relay sent
# (`standardwebhooks.webhooks.Webhook(secret).verify(body, headers)`).
#
# Idempotent: does nothing when the venv already imports the library. Exits 0 even when
# something is missing, so CI goes on: the test then prints a loud SKIPPING line naming what is
# missing.
set -u

LIB_VERSION=1.1.0
CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/outbox-relay"
VENV="$CACHE/venv-standardwebhooks"

if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c "from standardwebhooks.webhooks import Webhook" >/dev/null 2>&1; then
    exit 0
fi
if ! command -v python3 >/dev/null 2>&1 || ! python3 -m venv --help >/dev/null 2>&1; then
    echo "install-standardwebhooks: installing python3-venv"
    if command -v apt-get >/dev/null 2>&1; then
        export DEBIAN_FRONTEND=noninteractive
        (apt-get update -qq && apt-get install -y -qq python3-venv >/dev/null) \
            || echo "install-standardwebhooks: apt-get could not install python3-venv" >&2
    fi
fi
mkdir -p "$CACHE"
rm -rf "$VENV"
if ! python3 -m venv "$VENV"; then
    echo "install-standardwebhooks: python3 -m venv failed; the signature check will be SKIPPED" >&2
    rm -rf "$VENV"
    exit 0
fi
if ! "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "standardwebhooks==$LIB_VERSION"; then
    echo "install-standardwebhooks: pip could not install standardwebhooks==$LIB_VERSION; the signature check will be SKIPPED" >&2
    rm -rf "$VENV"
    exit 0
fi
echo "install-standardwebhooks: standardwebhooks $LIB_VERSION in $VENV"
