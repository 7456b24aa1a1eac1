#!/usr/bin/env bash
# moto in server mode (`moto[server]` 5.1.4, from PyPI) in ~/.cache/outbox-relay/venv-moto, for
# the AWS sink suites (tests/it/conformance.rs, sink_sqs.rs, sink_sns.rs, sink_kinesis.rs) and the benchmark's and
# demo's cloud sinks. moto emulates SQS (standard and FIFO queues, SendMessageBatch, FIFO
# deduplication), SNS (topics, PublishBatch, SQS subscriptions with raw message delivery) and
# Kinesis Data Streams (streams, shards, PutRecords, GetRecords) in memory; the tests start their own `moto_server` on a free
# loopback port through tests/it/harness/moto.rs, so nothing is started here.
set -eu
here="$(dirname "$0")"
bash "$here/install-python-venv.sh" moto \
    "import moto, shutil, sys; sys.exit(moto.__version__ != '5.1.4' or not shutil.which('moto_server', path=sys.prefix + '/bin'))" \
    "the SQS, SNS and Kinesis sink tests" "moto[server]==5.1.4"

# moto 5.1.4 answers PublishBatch with <ResponseMetadata> before <PublishBatchResult>; real SNS
# (and moto 5.2, which rewrote its serializers) put the result first, and the Rust SDK's XML
# parser accepts only that order ("invalid result, expected PublishBatchResult"), although moto
# published the batch. Reorder moto's template (idempotent; the version is pinned above, so the
# template is known; docs/sink-sns.md). A failure fails the run: the SNS suite would fail anyway.
VENV="${XDG_CACHE_HOME:-$HOME/.cache}/outbox-relay/venv-moto"
"$VENV/bin/python" - <<'PY'
import pathlib, re, moto.sns.responses as r
path = pathlib.Path(r.__file__)
text = path.read_text()
start = text.index('PUBLISH_BATCH_TEMPLATE = """')
end = text.index('"""', start + len('PUBLISH_BATCH_TEMPLATE = """')) + 3
template = text[start:end]
meta = re.search(r"\s*<ResponseMetadata>.*?</ResponseMetadata>", template, re.S)
if meta and template.index("<ResponseMetadata>") < template.index("<PublishBatchResult>"):
    fixed = template.replace(meta.group(0), "", 1)
    fixed = fixed.replace("</PublishBatchResult>", "</PublishBatchResult>" + meta.group(0), 1)
    path.write_text(text[:start] + fixed + text[end:])
PY
