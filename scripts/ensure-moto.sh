#!/usr/bin/env bash
# moto in server mode (`moto[server]` 5.1.4, from PyPI) in ~/.cache/outbox-relay/venv-moto, for
# the AWS sink suites (tests/it/sink_sqs.rs). moto emulates SQS (standard and FIFO queues,
# SendMessageBatch, FIFO deduplication) in memory; the tests start their own `moto_server` on a
# free loopback port through tests/it/harness/moto.rs, so nothing is started here.
exec bash "$(dirname "$0")/install-python-venv.sh" moto \
    "import moto, shutil, sys; sys.exit(moto.__version__ != '5.1.4' or not shutil.which('moto_server', path=sys.prefix + '/bin'))" \
    "the SQS sink tests" "moto[server]==5.1.4"
