#!/usr/bin/env bash
# The official Python Standard Webhooks library (standardwebhooks 1.1.0, from PyPI) in
# ~/.cache/outbox-relay/venv-standardwebhooks: tests/it/sink_webhook.rs verifies the webhook
# sink's signatures with it (`standardwebhooks.webhooks.Webhook(secret).verify(body, headers)`).
exec bash "$(dirname "$0")/install-python-venv.sh" standardwebhooks \
    "from standardwebhooks.webhooks import Webhook" "the webhook signature check" "standardwebhooks==1.1.0"
