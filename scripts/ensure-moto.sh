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

# moto 5.1.4 numbers a Kinesis record "the shard's highest sequence number + 1" without a lock
# (its own comment: "this function is not safe for concurrency"), and moto_server serves requests
# on threads: two PutRecords calls at the same moment give two records one number, the second
# overwrites the first, and both calls answer "stored". The relay sends up to `max_requests` (8)
# calls at once, so the tests lost an event that moto had acknowledged (issue 44, point 13: the
# lost id was the overwritten record's, logged by an instrumented moto). Real Kinesis gives every
# record its own number. Serialise the numbering (idempotent) so the tests run the shipped
# settings and two writers per stream, and a record missing is the relay's fault, not moto's.
"$VENV/bin/python" - <<'PY'
import pathlib, moto.kinesis.models as m
path = pathlib.Path(m.__file__)
text = path.read_text()
marker = "_OUTBOX_RELAY_SHARD_LOCK"
if marker not in text:
    old = "    def put_record(self, partition_key: str, data: str, explicit_hash_key: str) -> str:\n"
    assert text.count(old) == 1, "moto's Shard.put_record changed: revisit scripts/ensure-moto.sh"
    new = (old + "        with " + marker + ":\n"
           "            return self._put_record_unlocked(partition_key, data, explicit_hash_key)\n\n"
           "    def _put_record_unlocked(self, partition_key: str, data: str, explicit_hash_key: str) -> str:\n")
    text = text.replace(old, new, 1)
    text = text.replace("\nclass Shard(", "\nimport threading\n" + marker + " = threading.Lock()\n\n\nclass Shard(", 1)
    assert marker + " = threading.Lock()" in text, "moto's class Shard not found: revisit scripts/ensure-moto.sh"
    path.write_text(text)
PY
