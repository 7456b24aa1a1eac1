#!/usr/bin/env bash
# The official Python CloudEvents SDK (cloudevents 1.11.0, from PyPI) in
# ~/.cache/outbox-relay/venv-cloudevents: tests/it/cloudevents.rs reads the relay's records back
# with it (`cloudevents.kafka.from_binary` / `from_structured`).
exec bash "$(dirname "$0")/install-python-venv.sh" cloudevents "import cloudevents.kafka" \
    "the CloudEvents SDK read-back" "cloudevents==1.11.0"
