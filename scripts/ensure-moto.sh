#!/usr/bin/env bash
# moto in server mode (`moto[server]` 5.1.4, from PyPI) in ~/.cache/outbox-relay/venv-moto, for
# the AWS sink suites (tests/it/sink_sqs.rs, sink_sns.rs). moto emulates SQS (standard and FIFO
# queues, SendMessageBatch, FIFO deduplication) and SNS (topics, PublishBatch, SQS subscriptions
# with raw message delivery) in memory; the tests start their own `moto_server` on a free
# loopback port through tests/it/harness/moto.rs, so nothing is started here.
set -u
here="$(dirname "$0")"
bash "$here/install-python-venv.sh" moto \
    "import moto, shutil, sys; sys.exit(moto.__version__ != '5.1.4' or not shutil.which('moto_server', path=sys.prefix + '/bin'))" \
    "the SQS and SNS sink tests" "moto[server]==5.1.4"

# moto 5.1.4 answers PublishBatch with <ResponseMetadata> before <PublishBatchResult>; real SNS
# (and moto 5.2, which rewrote its serializers) put the result first, and the Rust SDK's XML
# parser accepts only that order ("invalid result, expected PublishBatchResult"), although moto
# published the batch. Reorder moto's template (idempotent; docs/sink-sns.md).
VENV="${XDG_CACHE_HOME:-$HOME/.cache}/outbox-relay/venv-moto"
if [ -x "$VENV/bin/python" ]; then
    "$VENV/bin/python" - <<'PY' || echo "ensure-moto: could not reorder moto's PublishBatch answer; the SNS tests will fail" >&2
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
fi
exit 0
