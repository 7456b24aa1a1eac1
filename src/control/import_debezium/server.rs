//! Debezium Server's `application.properties`: the same PostgreSQL connector and EventRouter
//! under `debezium.source.*` and `debezium.transforms.*`, and a sink under `debezium.sink.*`
//! instead of Kafka Connect. [`split`] turns the file into the connector options the mapping
//! already knows plus the sink's; [`map_sink`] maps the sink onto `[sink]` and its broker's
//! section (NATS JetStream, RabbitMQ, Redis, Google Cloud Pub/Sub, Amazon SQS, Amazon SNS,
//! Amazon Kinesis or Kafka), listing what has no counterpart.
//!
//! No secret is written: a broker password stays out of the URL, and the file says where to put
//! it (the section's environment variable).

use std::collections::BTreeMap;

use super::render::Line;
use super::ImportError;

/// The prefixes Debezium Server puts before connector and transform options.
const SOURCE: &str = "debezium.source.";
const TRANSFORMS: &str = "debezium.transforms";
const SINK: &str = "debezium.sink.";

/// A Debezium Server file split into what the connector saw and what its sink saw.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct ServerConfig {
    /// Connector options (prefix `debezium.source.` stripped) and transforms (`debezium.` stripped).
    pub(crate) connector: BTreeMap<String, String>,
    /// `debezium.sink.*` (prefix kept, as written).
    pub(crate) sink: BTreeMap<String, String>,
    /// Everything else of the file (`debezium.format.*`, `quarkus.*`, …), as written.
    pub(crate) other: BTreeMap<String, String>,
}

/// `Some` when `options` are a Debezium Server file (they name a `debezium.source.` option).
pub(crate) fn split(options: &BTreeMap<String, String>) -> Option<ServerConfig> {
    if !options.keys().any(|k| k.starts_with(SOURCE)) {
        return None;
    }
    let mut server = ServerConfig::default();
    for (key, value) in options {
        if let Some(option) = key.strip_prefix(SOURCE) {
            server.connector.insert(option.to_owned(), value.clone());
        } else if key.starts_with(TRANSFORMS) {
            server
                .connector
                .insert(key["debezium.".len()..].to_owned(), value.clone());
        } else if key.starts_with(SINK) {
            server.sink.insert(key.clone(), value.clone());
        } else {
            server.other.insert(key.clone(), value.clone());
        }
    }
    Some(server)
}

/// The sections a Debezium Server sink maps to.
#[derive(Debug, Default)]
pub(crate) struct SinkSections {
    /// `[sink]`.
    pub(crate) sink: Vec<Line>,
    /// The broker's section: (its name, its lines). Kafka's properties go to `[kafka]`.
    pub(crate) broker: Option<(&'static str, Vec<Line>)>,
    /// (option, why) for sink options with no counterpart.
    pub(crate) not_carried_over: Vec<(String, String)>,
}

fn s(v: &str) -> toml::Value {
    toml::Value::String(v.to_owned())
}

/// Maps `debezium.sink.*`; `Err` for a sink type the relay does not have.
pub(crate) fn map_sink(server: &ServerConfig, source: &str) -> Result<SinkSections, ImportError> {
    let sink = &server.sink;
    let ty = sink.get("debezium.sink.type").map(|t| t.trim()).unwrap_or("");
    let mut out = SinkSections::default();
    let mut taken = vec!["debezium.sink.type".to_owned()];
    let mut get = |option: &str| {
        let key = format!("{SINK}{option}");
        let v = sink.get(&key).map(|v| v.trim().to_owned());
        if v.is_some() {
            taken.push(key);
        }
        v
    };
    let (kind, lines) = match ty {
        "kafka" => {
            let mut lines = vec![Line::Comment(
                "librdkafka properties (from debezium.sink.kafka.producer.*); acks=all and idempotence are enforced."
                    .into(),
            )];
            for (key, value) in sink {
                if let Some(property) = key.strip_prefix("debezium.sink.kafka.producer.") {
                    if matches!(
                        property,
                        "key.serializer" | "value.serializer" | "acks" | "enable.idempotence"
                    ) {
                        continue;
                    }
                    lines.push(Line::Set(property.to_owned(), s(value.trim())));
                    taken.push(key.clone());
                }
            }
            ("kafka", lines)
        }
        "nats-jetstream" => {
            let url = get("nats-jetstream.url").unwrap_or_else(|| "nats://localhost:4222".into());
            let mut lines = vec![Line::Set("url".into(), s(&url))];
            if let Some(stream) = get("nats-jetstream.stream-name") {
                lines.push(Line::Set("stream".into(), s(&stream)));
            }
            if let Some(subjects) = get("nats-jetstream.subjects") {
                let list: Vec<toml::Value> = subjects.split(',').map(|x| s(x.trim())).collect();
                lines.push(Line::Set("subjects".into(), toml::Value::Array(list)));
            }
            ("nats", lines)
        }
        "rabbitmq" => {
            let host = get("rabbitmq.connection.host").unwrap_or_else(|| "localhost".into());
            let port = get("rabbitmq.connection.port").unwrap_or_else(|| "5672".into());
            let user = get("rabbitmq.connection.username").unwrap_or_else(|| "guest".into());
            let vhost = get("rabbitmq.connection.virtual.host").unwrap_or_else(|| "/".into());
            let password = get("rabbitmq.connection.password");
            let vhost = vhost.replace('/', "%2f");
            let mut lines = password_note(password.is_some(), "OUTBOX_RELAY__RABBITMQ__URL");
            lines.push(Line::Set(
                "url".into(),
                s(&format!("amqp://{user}@{host}:{port}/{vhost}")),
            ));
            let exchange = get("rabbitmq.exchange").unwrap_or_else(|| "outbox".into());
            lines.push(Line::Set("exchange".into(), s(&exchange)));
            ("rabbitmq", lines)
        }
        "redis" => {
            let address = get("redis.address").unwrap_or_else(|| "localhost:6379".into());
            let user = get("redis.user");
            let password = get("redis.password");
            let ssl = get("redis.ssl.enabled").is_some_and(|v| v.eq_ignore_ascii_case("true"));
            let mut lines = password_note(password.is_some(), "OUTBOX_RELAY__REDIS__URL");
            let scheme = if ssl { "rediss" } else { "redis" };
            let auth = user.map(|u| format!("{u}@")).unwrap_or_default();
            lines.push(Line::Set("url".into(), s(&format!("{scheme}://{auth}{address}"))));
            ("redis", lines)
        }
        "pubsub" => {
            let Some(project) = get("pubsub.project.id") else {
                return Err(ImportError::Unsupported(format!(
                    "{source}: debezium.sink.pubsub.project.id is not set (Debezium Server then takes the project of \
                     its credentials); set it to the project of the topics, which [pubsub] project requires"
                )));
            };
            let mut lines = vec![Line::Set("project".into(), s(&project))];
            if let Some(address) = get("pubsub.address") {
                lines.push(Line::Comment(format!(
                    "Debezium Server's pubsub.address ({address}, the emulator): start the relay with\n\
                     PUBSUB_EMULATOR_HOST={address}, as Google's clients read it."
                )));
            }
            if let Some(ms) = get("pubsub.retry.total.timeout.ms") {
                match ms.parse::<u64>() {
                    Ok(n) if n > 0 => lines.push(Line::Set("retry_timeout_ms".into(), toml::Value::Integer(n as i64))),
                    _ => {
                        lines.push(Line::Comment(format!(
                            "debezium.sink.pubsub.retry.total.timeout.ms = {ms:?} is not a positive number of ms."
                        )));
                        lines.push(Line::Disabled("retry_timeout_ms".into(), s(&ms)));
                    }
                }
            }
            ("pubsub", lines)
        }
        "kinesis" => {
            let mut lines = aws_lines(&mut get, "kinesis");
            if !lines.iter().any(|l| matches!(l, Line::Set(k, _) if k == "region")) {
                lines.push(Line::Comment(
                    "debezium.sink.kinesis.region is not set: the region comes from AWS_REGION or the profile.".into(),
                ));
            }
            lines.push(Line::Comment(
                "Debezium Server's Kinesis sink sends the value alone: \"payload\" keeps what consumers read.\n\
                 \"envelope\" (the relay's default) adds the event id to deduplicate on, the key and the headers\n\
                 in one JSON object (docs/sink-kinesis.md)."
                    .into(),
            ));
            lines.push(Line::Set("format".into(), s("payload")));
            ("kinesis", lines)
        }
        "sqs" => {
            let mut lines = aws_lines(&mut get, "sqs");
            if let Some(url) = get("sqs.queue.url") {
                let queue = url.trim_end_matches('/').rsplit('/').next().unwrap_or(&url).to_owned();
                if queue.ends_with(".fifo") {
                    lines.push(Line::Set("fifo".into(), toml::Value::Boolean(true)));
                }
                lines.push(Line::Comment(format!(
                    "Debezium Server sent every event to the one queue {queue:?} (debezium.sink.sqs.queue.url); the \n\
                     relay sends each event to the queue named by its routed name (the route rule): route every\n\
                     event to {queue:?} to keep one queue, or create a queue per routed name."
                )));
            }
            ("sqs", lines)
        }
        "sns" => {
            let mut lines = aws_lines(&mut get, "sns");
            let region_set = lines.iter().any(|l| matches!(l, Line::Set(k, _) if k == "region"));
            let arn = get("sns.topic.arn");
            let prefix = get("sns.topic.arn.prefix");
            // arn:aws:sns:<region>:<account>:<name>
            let region_of = |arn: &str| arn.split(':').nth(3).filter(|r| !r.is_empty()).map(str::to_owned);
            if !region_set {
                if let Some(region) = arn.as_deref().or(prefix.as_deref()).and_then(region_of) {
                    lines.push(Line::Set("region".into(), s(&region)));
                }
            }
            if let Some(arn) = &arn {
                let topic = arn.rsplit(':').next().unwrap_or(arn);
                if topic.ends_with(".fifo") {
                    lines.push(Line::Set("fifo".into(), toml::Value::Boolean(true)));
                }
                lines.push(Line::Comment(format!(
                    "Debezium Server published every event to the one topic {topic:?} (debezium.sink.sns.topic.arn);\n\
                     the relay publishes each event to the topic named by its routed name (the route rule), its ARN\n\
                     looked up in the relay's account and region: route every event to {topic:?} to keep one topic."
                )));
            } else if let Some(prefix) = &prefix {
                lines.push(Line::Comment(format!(
                    "Debezium Server published to {prefix}<destination> (debezium.sink.sns.topic.arn.prefix); the relay\n\
                     publishes to the topic named by the routed name in its own account and region (ARN looked up\n\
                     with ListTopics). Set fifo = true if the topics are FIFO topics (names ending in .fifo)."
                )));
            }
            ("sns", lines)
        }
        "" => {
            return Err(ImportError::Unsupported(format!(
                "{source}: a Debezium Server file without debezium.sink.type; set it (kafka, nats-jetstream, rabbitmq, \
                 redis, pubsub, sqs, sns or kinesis are the sinks outbox-relay has)"
            )))
        }
        other => {
            return Err(ImportError::Unsupported(format!(
                "{source}: debezium.sink.type is {other:?}; outbox-relay publishes to kafka, nats-jetstream, \
                 rabbitmq, redis, pubsub, sqs, sns and kinesis only"
            )))
        }
    };
    out.sink = vec![Line::Set("kind".into(), s(kind))];
    out.broker = Some((kind, lines));
    for (key, _) in sink.iter().filter(|(k, _)| !taken.contains(k)) {
        out.not_carried_over.push((key.clone(), sink_reason(key).to_owned()));
    }
    for key in server.other.keys() {
        out.not_carried_over.push((
            key.clone(),
            if key.starts_with("debezium.format.") {
                "Debezium Server's serialization format: the relay publishes the payload column's bytes (or Kafka \
                 Connect's converters under [debezium] with the kafka sink)"
            } else {
                "a Debezium Server (Quarkus) setting with no counterpart"
            }
            .to_owned(),
        ));
    }
    Ok(out)
}

/// What Debezium Server's AWS sinks (`sqs`, `sns`) share: `region`, `endpoint` (the endpoint
/// override) and `credentials.profile` (the relay's SDK chain reads `AWS_PROFILE`).
fn aws_lines(get: &mut impl FnMut(&str) -> Option<String>, sink: &str) -> Vec<Line> {
    let mut lines = Vec::new();
    if let Some(region) = get(&format!("{sink}.region")) {
        lines.push(Line::Set("region".into(), s(&region)));
    }
    if let Some(endpoint) = get(&format!("{sink}.endpoint")) {
        lines.push(Line::Set("endpoint_url".into(), s(&endpoint)));
    }
    if let Some(profile) = get(&format!("{sink}.credentials.profile")) {
        lines.push(Line::Comment(format!(
            "debezium.sink.{sink}.credentials.profile = {profile}: start the relay with AWS_PROFILE={profile}\n\
             (credentials come from the AWS SDK's default chain, never from this file)."
        )));
    }
    lines
}

/// The first lines of a sink whose URL is written without the password Debezium Server's file
/// has (`has_password`): where to put it instead (`var`, the sink's URL variable).
fn password_note(has_password: bool, var: &str) -> Vec<Line> {
    let note = format!("The password is not written here: put the whole URL, password included, in\n{var}.");
    has_password.then_some(Line::Comment(note)).into_iter().collect()
}

/// Why a Debezium Server sink option has no counterpart.
fn sink_reason(option: &str) -> &'static str {
    let o = option.trim_start_matches(SINK);
    match o {
        _ if o.ends_with("create-stream") => "`outbox-relay setup` creates the stream when it is missing",
        _ if o.ends_with("async.enabled") => "publishes are always pipelined; the WAL is confirmed after each PubAck",
        _ if o.ends_with("routingKey") || o.ends_with("routingKey.source") => {
            "the routed topic (EventRouter route rule) is the routing key"
        }
        _ if o.ends_with("deliveryMode") => "messages are always persistent (delivery mode 2)",
        _ if o.ends_with("ackTimeout") => {
            "confirms are awaited without a timeout of their own; an outage fails the session"
        }
        _ if o.ends_with("wait.enabled") || o.contains("wait.") => {
            "the relay does not WAIT for Redis replicas; a reply means the primary has it"
        }
        _ if o.ends_with("message.format") => "entries always carry the event's fields (docs/sink-redis.md)",
        _ if o.starts_with("kafka.producer.") => "set by the relay (serializers, acks=all, idempotence)",
        _ if o == "pubsub.ordering.enabled" => {
            "the ordering key is always the aggregate key: per-aggregate order is not optional (docs/sink-pubsub.md)"
        }
        _ if o == "pubsub.null.key" => "an outbox event always has a key (the aggregate id): none is null",
        _ if o.starts_with("pubsub.batch.") => {
            "one publish per aggregate is in flight; the client batches different aggregates' publishes (2 ms)"
        }
        _ if o.starts_with("pubsub.flowcontrol.") => {
            "relay.max_in_flight and relay.max_in_flight_bytes bound the publishes"
        }
        _ if o.starts_with("pubsub.retry.") => {
            "retries use Google's retryable codes and a backoff of 100 ms growing to 5 s; only \
             retry.total.timeout.ms (retry_timeout_ms) is a setting"
        }
        _ if o.starts_with("pubsub.wait.message.delivery") => {
            "each publish is awaited; the WAL is confirmed only after Pub/Sub acknowledged"
        }
        _ if o.starts_with("pubsub.") => "a Debezium Server Pub/Sub option with no counterpart",
        _ if o == "kinesis.batch.size" => {
            "PutRecords calls carry up to 500 records and 5 MiB, one record per aggregate; [kinesis] \
             max_concurrency bounds the aggregates on the wire (docs/sink-kinesis.md)"
        }
        _ if o == "kinesis.default.retries" => {
            "failed records are retried with backoff until Kinesis stores them, the WAL position held meanwhile \
             (Debezium Server gives up after default.retries and stops)"
        }
        _ if o == "kinesis.null.key" => {
            "an outbox event always has a key (the aggregate id): none is null; a key Kinesis would not take is \
             hashed (docs/sink-kinesis.md)"
        }
        _ if o.starts_with("kinesis.") => "a Debezium Server Kinesis option with no counterpart",
        _ if o == "sqs.fifo.message.group.id" || o.starts_with("sns.fifo.") && o.contains("group.id") => {
            "the message group is always the aggregate key (order per aggregate, aggregates in parallel), not one \
             fixed group for every event"
        }
        _ if o == "sns.fifo.message.dedup.id.header" => {
            "the deduplication id is the event's source position (exactly-once) or its event id"
        }
        _ if o == "sns.default.retries" => {
            "failed publishes are retried with backoff until SNS accepts them, the WAL position held meanwhile"
        }
        _ if o.starts_with("sqs.") => "a Debezium Server SQS option with no counterpart",
        _ if o.starts_with("sns.") => "a Debezium Server SNS option with no counterpart",
        _ => "a Debezium Server sink option with no counterpart",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(text: &str) -> BTreeMap<String, String> {
        text.lines()
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect()
    }

    #[test]
    fn a_server_file_splits_into_connector_sink_and_the_rest() {
        let o = opts(
            "debezium.source.connector.class=x\ndebezium.transforms=outbox\ndebezium.transforms.outbox.type=y\n\
             debezium.sink.type=redis\ndebezium.format.value=json\nquarkus.log.level=INFO",
        );
        let server = split(&o).unwrap();
        assert_eq!(server.connector.get("connector.class").map(String::as_str), Some("x"));
        assert_eq!(
            server.connector.get("transforms.outbox.type").map(String::as_str),
            Some("y")
        );
        assert_eq!(server.sink.len(), 1);
        assert_eq!(server.other.len(), 2);
        assert_eq!(
            split(&opts("connector.class=x")),
            None,
            "a Kafka Connect file is not split"
        );
    }

    #[test]
    fn an_unknown_sink_type_is_refused_by_name() {
        let server = split(&opts("debezium.source.a=b\ndebezium.sink.type=eventhubs")).unwrap();
        let err = map_sink(&server, "app.properties").unwrap_err().to_string();
        assert!(err.contains("\"eventhubs\"") && err.contains("pubsub"), "{err}");
    }
}
