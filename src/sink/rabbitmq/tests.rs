//! The adapter against the real broker at 127.0.0.1:5672 (guest/guest, vhost `/`), which CI
//! starts. Each test uses its own exchange and queue, deleted at the end.

use std::borrow::Cow;
use std::collections::HashMap;
use std::time::Duration;

use lapin::options::{
    BasicGetOptions, ExchangeDeclareOptions, ExchangeDeleteOptions, QueueBindOptions, QueueDeclareOptions,
    QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Channel, Connection, ExchangeKind};

use super::publisher::Publisher;
use super::*;
use crate::config::cloudevents::CloudEventsMode;
use crate::config::secret::Secret;
use crate::sink::memory::{binary_ce_record, send_taken};
use crate::sink::{Completions, FailureKind, Handover, Sink, SinkRecord};

const URL: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";
const LIMIT: Duration = Duration::from_secs(20);

fn unique(prefix: &str) -> String {
    format!("{prefix}-{}-{}", std::process::id(), uuid::Uuid::new_v4().simple())
}

fn settings(exchange: &str) -> RabbitMqSettings {
    RabbitMqSettings {
        url: Secret::new(URL),
        exchange: exchange.to_owned(),
    }
}

/// A unique exchange (declared by `prepare`) with a queue bound by `pattern`.
struct Fixture {
    settings: RabbitMqSettings,
    queue: String,
    connection: Connection,
    channel: Channel,
}

impl Fixture {
    async fn new(pattern: &str) -> Fixture {
        let settings = settings(&unique("t-rmq"));
        RabbitMq.prepare(&settings).await.expect("prepare");
        let (connection, channel) = connect(&settings).await.expect("connect");
        let queue = unique("t-rmq-q");
        let durable = QueueDeclareOptions {
            durable: true,
            ..QueueDeclareOptions::default()
        };
        bound_queue(
            &channel,
            &settings.exchange,
            &queue,
            pattern,
            durable,
            FieldTable::default(),
        )
        .await;
        Fixture {
            settings,
            queue,
            connection,
            channel,
        }
    }

    /// A publisher to the fixture's exchange with a queue of `max_in_flight`.
    async fn publisher(
        &self,
        max_in_flight: usize,
        cloudevents: Option<CloudEventsMode>,
    ) -> (Publisher<u32>, Completions<u32>) {
        Publisher::create(&self.settings, max_in_flight, cloudevents)
            .await
            .expect("create")
    }

    /// Every message in the queue, in queue order.
    async fn drain(&self) -> Vec<lapin::message::BasicGetMessage> {
        let mut out = Vec::new();
        while let Some(m) = self
            .channel
            .basic_get(&self.queue, BasicGetOptions { no_ack: true })
            .await
            .unwrap()
        {
            out.push(m);
        }
        out
    }

    /// Abandons `sink` (a second for what is on the wire), then [`Fixture::clean`].
    async fn finish(self, sink: Publisher<u32>) {
        Box::new(sink).abandon(Duration::from_secs(1));
        self.clean().await;
    }

    async fn clean(self) {
        let _ = self
            .channel
            .queue_delete(&self.queue, QueueDeleteOptions::default())
            .await;
        let _ = self
            .channel
            .exchange_delete(&self.settings.exchange, ExchangeDeleteOptions::default())
            .await;
        let _ = self.connection.close(200, "").await;
    }
}

/// Declares `queue` (`options`, `args`) and binds it to `exchange` with `pattern`.
async fn bound_queue(
    channel: &Channel,
    exchange: &str,
    queue: &str,
    pattern: &str,
    options: QueueDeclareOptions,
    args: FieldTable,
) {
    channel.queue_declare(queue, options, args).await.unwrap();
    channel
        .queue_bind(
            queue,
            exchange,
            pattern,
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
}

fn record<'a>(destination: &'a str, key: &'a str, value: &'a [u8], id: &'a [u8]) -> SinkRecord<'a> {
    SinkRecord {
        timestamp_ms: Some(1_700_000_000_123),
        headers: Cow::Owned(vec![
            (Cow::Borrowed("tenant"), Some(Cow::Borrowed(&b"acme"[..]))),
            (Cow::Borrowed("nothing"), None),
        ]),
        ..crate::sink::memory::record(destination, key.as_bytes(), value, id)
    }
}

async fn completions(rx: &mut Completions<u32>, n: usize) -> Vec<(u32, Result<(), crate::sink::SinkFailure>)> {
    let mut out = Vec::new();
    while out.len() < n {
        let c = tokio::time::timeout(LIMIT, rx.recv())
            .await
            .expect("completions in time")
            .expect("channel open");
        out.push((*c.tag, c.outcome));
    }
    out
}

fn header<'a>(m: &'a lapin::message::BasicGetMessage, name: &str) -> Option<&'a AMQPValue> {
    m.delivery
        .properties
        .headers()
        .as_ref()
        .and_then(|h| h.inner().get(name))
}

fn bytes(v: Option<&AMQPValue>) -> Vec<u8> {
    match v {
        Some(AMQPValue::LongString(s)) => s.as_bytes().to_vec(),
        other => panic!("not a long string: {other:?}"),
    }
}

#[tokio::test]
async fn every_record_is_confirmed_and_arrives_with_its_properties_in_key_order() {
    let fx = Fixture::new("#").await;
    let (sink, mut rx) = fx.publisher(1000, None).await;
    let n = 300u32;
    let ids: Vec<String> = (0..n).map(|i| format!("id-{i}")).collect();
    for i in 0..n {
        let key = format!("agg-{}", i % 7);
        let value = format!("{{\"seq\":{i},\"key\":\"{key}\"}}");
        let r = record("orders.created", &key, value.as_bytes(), ids[i as usize].as_bytes());
        let extra: &[(&str, &[u8])] = &[("x-extra", b"e")];
        send_taken(&sink, Handover::of(&r).with_extra(extra), i);
    }
    let done = completions(&mut rx, n as usize).await;
    assert!(
        done.iter().all(|(_, o)| o.is_ok()),
        "{:?}",
        done.iter().find(|(_, o)| o.is_err())
    );
    let mut tags: Vec<u32> = done.iter().map(|(t, _)| *t).collect();
    tags.sort_unstable();
    assert_eq!(tags, (0..n).collect::<Vec<_>>(), "one completion per record");
    let messages = fx.drain().await;
    assert_eq!(messages.len(), n as usize);
    let mut last_seq: HashMap<Vec<u8>, i64> = HashMap::new();
    for m in &messages {
        let p = &m.delivery.properties;
        let body: serde_json::Value = serde_json::from_slice(&m.delivery.data).unwrap();
        let seq = body["seq"].as_i64().unwrap();
        assert_eq!(m.delivery.routing_key.as_str(), "orders.created");
        assert_eq!(p.delivery_mode(), &Some(2));
        assert_eq!(
            p.message_id().as_ref().map(|s| s.as_str().to_owned()),
            Some(format!("id-{seq}"))
        );
        assert_eq!(p.content_type().as_ref().map(|s| s.as_str()), Some("application/json"));
        assert_eq!(p.timestamp(), &Some(1_700_000_000));
        assert_eq!(bytes(header(m, "id")), format!("id-{seq}").into_bytes());
        let key = bytes(header(m, "key"));
        assert_eq!(key, format!("agg-{}", seq % 7).into_bytes());
        assert_eq!(bytes(header(m, "tenant")), b"acme");
        assert_eq!(bytes(header(m, "x-extra")), b"e");
        assert_eq!(header(m, "nothing"), Some(&AMQPValue::Void));
        let last = last_seq.insert(key, seq);
        assert!(last.is_none_or(|l| l < seq), "order of one key broken at {seq}");
    }
    fx.finish(sink).await;
}

#[tokio::test]
async fn unroutable_records_are_refused_and_what_waits_behind_them_is_not_published() {
    let fx = Fixture::new("orders.#").await;
    let (sink, mut rx) = fx.publisher(10, None).await;
    send_taken(&sink, Handover::of(&record("orders.a", "k", b"1", b"i1")), 1);
    send_taken(&sink, Handover::of(&record("nowhere.a", "k", b"2", b"i2")), 2);
    // Same key: waits behind the unroutable one, so it is not published but fails (replayed).
    send_taken(&sink, Handover::of(&record("orders.b", "k", b"3", b"i3")), 3);
    // Another key: unaffected.
    send_taken(&sink, Handover::of(&record("orders.c", "other", b"4", b"i4")), 4);
    let mut done = completions(&mut rx, 4).await;
    done.sort_by_key(|(t, _)| *t);
    assert!(done[0].1.is_ok() && done[3].1.is_ok(), "{done:?}");
    let behind = done[2].1.as_ref().unwrap_err();
    assert_eq!(behind.kind, FailureKind::Transient, "{behind}");
    let refused = done[1].1.as_ref().unwrap_err();
    assert_eq!(refused.kind, FailureKind::Refused, "{refused}");
    assert!(
        refused.cause.contains("unroutable") && refused.cause.contains("312"),
        "{refused}"
    );
    assert_eq!(refused.event_id.as_deref(), Some("i2"));
    let bodies: Vec<Vec<u8>> = fx.drain().await.into_iter().map(|m| m.delivery.data).collect();
    assert_eq!(bodies.len(), 2, "{bodies:?}");
    assert!(
        bodies.contains(&b"1".to_vec()) && bodies.contains(&b"4".to_vec()),
        "{bodies:?}"
    );
    // A record of the key handed over after the refusal is not published either: stored now,
    // it would land ahead of record 3, which the caller replays after deciding about record 2.
    send_taken(&sink, Handover::of(&record("orders.d", "k", b"5", b"i5")), 5);
    let stopped = completions(&mut rx, 1).await.remove(0).1.unwrap_err();
    assert_eq!(stopped.kind, FailureKind::Transient, "{stopped}");
    assert!(stopped.cause.contains("refused"), "{stopped}");
    // Other keys pass meanwhile.
    send_taken(&sink, Handover::of(&record("orders.e", "other", b"6", b"i6")), 6);
    assert!(completions(&mut rx, 1).await[0].1.is_ok());
    // Once the caller has decided, the key's records are published again.
    sink.release(b"k");
    send_taken(&sink, Handover::of(&record("orders.d", "k", b"7", b"i7")), 7);
    assert!(completions(&mut rx, 1).await[0].1.is_ok());
    let bodies: Vec<Vec<u8>> = fx.drain().await.into_iter().map(|m| m.delivery.data).collect();
    assert_eq!(bodies, vec![b"6".to_vec(), b"7".to_vec()], "5 was never published");
    fx.finish(sink).await;
}

#[tokio::test]
async fn long_routing_keys_and_oversized_messages_are_refused_on_sight() {
    let fx = Fixture::new("#").await;
    let (sink, _rx) = fx.publisher(10, None).await;
    let long = "r".repeat(256);
    let refusal = sink
        .send(Handover::of(&record(&long, "k", b"v", b"i")), Box::new(1))
        .unwrap_err();
    assert_eq!(refusal.failure.kind, FailureKind::Refused);
    assert!(refusal.failure.cause.contains("255"), "{}", refusal.failure);
    let big = vec![b'x'; MAX_MESSAGE_BYTES + 1];
    let refusal = sink
        .send(Handover::of(&record("orders", "k", &big, b"i")), Box::new(2))
        .unwrap_err();
    assert_eq!(refusal.failure.kind, FailureKind::Refused);
    assert!(
        refusal.failure.cause.contains("max_message_size"),
        "{}",
        refusal.failure
    );
    assert!((RabbitMq.limits(&fx.settings).check_name)(&long).is_err());
    assert_eq!(RabbitMq.limits(&fx.settings).max_message_bytes, MAX_MESSAGE_BYTES);
    fx.finish(sink).await;
}

#[tokio::test]
async fn a_lost_channel_fails_everything_in_flight_and_later_as_transient() {
    let fx = Fixture::new("#").await;
    let (sink, mut rx) = fx.publisher(1000, None).await;
    // Deleting the exchange makes the broker close the publishing channel (404) at the next
    // publish: every record from then on must fail as transient, none be lost silently.
    fx.channel
        .exchange_delete(&fx.settings.exchange, ExchangeDeleteOptions::default())
        .await
        .unwrap();
    for i in 0..50u32 {
        let key = format!("k{}", i % 3);
        send_taken(&sink, Handover::of(&record("orders", &key, b"v", b"i")), i);
    }
    let done = completions(&mut rx, 50).await;
    assert!(
        done.iter()
            .all(|(_, o)| o.as_ref().is_err_and(|f| f.kind == FailureKind::Transient)),
        "{done:?}"
    );
    // Records sent to a broken sink still get their completion.
    send_taken(&sink, Handover::of(&record("orders", "k", b"v", b"i")), 99);
    let late = completions(&mut rx, 1).await;
    assert_eq!(late[0].0, 99);
    assert_eq!(late[0].1.as_ref().unwrap_err().kind, FailureKind::Transient);
    let started = std::time::Instant::now();
    Box::new(sink).abandon(Duration::from_secs(2));
    assert!(started.elapsed() < Duration::from_secs(6));
    fx.clean().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abandon_drops_what_is_queued_and_returns_in_bounded_time() {
    let fx = Fixture::new("#").await;
    let (sink, mut rx) = fx.publisher(10_000, None).await;
    // One key: each waits for the previous one's confirm, so most are still queued.
    for i in 0..2000u32 {
        send_taken(&sink, Handover::of(&record("orders", "hot", b"v", b"i")), i);
    }
    let started = std::time::Instant::now();
    tokio::task::spawn_blocking(move || Box::new(sink).abandon(Duration::from_secs(2)))
        .await
        .unwrap();
    assert!(started.elapsed() < Duration::from_secs(6), "{:?}", started.elapsed());
    let mut completed = 0;
    while let Ok(Some(_)) = tokio::time::timeout(Duration::from_millis(200), rx.recv()).await {
        completed += 1;
    }
    let stored = fx.drain().await.len();
    assert!(
        completed <= stored && stored < 2000,
        "completed {completed}, stored {stored}"
    );
    fx.clean().await;
}

#[tokio::test]
async fn create_classifies_what_is_wrong() {
    // Nothing listens on port 1: unreachable, transient.
    let mut s = settings("outbox");
    s.url = Secret::new("amqp://guest:guest@127.0.0.1:1/%2f");
    let e = Publisher::<u32>::create(&s, 1, None).await.err().expect("unreachable");
    assert!(e.transient, "{e}");
    // Bad password: the operator's.
    s.url = Secret::new("amqp://guest:wrong-secret@127.0.0.1:5672/%2f");
    let e = Publisher::<u32>::create(&s, 1, None).await.err().expect("bad login");
    assert!(!e.transient, "{e}");
    assert!(!e.to_string().contains("wrong-secret"), "{e}");
    // Unknown vhost.
    s.url = Secret::new("amqp://guest:guest@127.0.0.1:5672/no-such-vhost");
    let e = Publisher::<u32>::create(&s, 1, None).await.err().expect("bad vhost");
    assert!(!e.transient, "{e}");
    assert!(e.to_string().contains("vhost"), "{e}");
    // Missing exchange: tells to run setup.
    let s = settings(&unique("t-rmq-missing"));
    let e = Publisher::<u32>::create(&s, 1, None)
        .await
        .err()
        .expect("missing exchange");
    assert!(!e.transient && e.to_string().contains("setup"), "{e}");
    let e = RabbitMq.probe(&s).await.unwrap_err();
    assert!(e.to_string().contains("setup"), "{e}");
}

#[tokio::test]
async fn prepare_is_idempotent_and_refuses_an_exchange_of_another_type() {
    let s = settings(&unique("t-rmq-prep"));
    let first = RabbitMq.prepare(&s).await.unwrap();
    assert!(first[0].contains("declared"), "{first:?}");
    let again = RabbitMq.prepare(&s).await.unwrap();
    assert!(again[0].contains("exists"), "{again:?}");
    let shown = RabbitMq.probe(&s).await.unwrap();
    assert!(shown.contains(&s.exchange) && !shown.contains("guest:guest"), "{shown}");
    let (connection, channel) = connect(&s).await.unwrap();
    channel
        .exchange_delete(&s.exchange, ExchangeDeleteOptions::default())
        .await
        .unwrap();
    channel
        .exchange_declare(
            &s.exchange,
            ExchangeKind::Fanout,
            ExchangeDeclareOptions {
                durable: true,
                ..ExchangeDeclareOptions::default()
            },
            FieldTable::default(),
        )
        .await
        .unwrap();
    let e = RabbitMq.prepare(&s).await.unwrap_err();
    assert!(!e.transient && e.to_string().contains("another type"), "{e}");
    channel
        .exchange_delete(&s.exchange, ExchangeDeleteOptions::default())
        .await
        .unwrap();
    let _ = connection.close(200, "").await;
}

#[tokio::test]
async fn one_hot_key_gets_one_message_per_confirm_round_trip() {
    let fx = Fixture::new("#").await;
    let (sink, mut rx) = fx.publisher(1000, None).await;
    let started = std::time::Instant::now();
    for i in 0..500u32 {
        send_taken(&sink, Handover::of(&record("orders", "hot", b"{}", b"i")), i);
    }
    let done = completions(&mut rx, 500).await;
    let hot = started.elapsed();
    assert!(done.iter().all(|(_, o)| o.is_ok()));
    let started = std::time::Instant::now();
    for i in 0..500u32 {
        let key = format!("k{i}");
        send_taken(&sink, Handover::of(&record("orders", &key, b"{}", b"i")), i);
    }
    let done = completions(&mut rx, 500).await;
    let spread = started.elapsed();
    assert!(done.iter().all(|(_, o)| o.is_ok()));
    eprintln!("500 persistent messages: one key {hot:?}, 500 keys {spread:?}");
    fx.finish(sink).await;
}

#[tokio::test]
async fn a_nack_breaks_the_sink_and_nothing_of_its_key_is_stored_past_it() {
    // A queue that takes 5 messages and then makes the broker nack publishes (reject-publish).
    let settings = settings(&unique("t-rmq-nack"));
    RabbitMq.prepare(&settings).await.expect("prepare");
    let (connection, channel) = connect(&settings).await.unwrap();
    let queue = unique("t-rmq-nack-q");
    let mut args = FieldTable::default();
    args.insert("x-max-length".into(), AMQPValue::LongLongInt(5));
    args.insert("x-overflow".into(), AMQPValue::LongString("reject-publish".into()));
    bound_queue(
        &channel,
        &settings.exchange,
        &queue,
        "#",
        QueueDeclareOptions::default(),
        args,
    )
    .await;
    let (sink, mut rx) = Publisher::<u32>::create(&settings, 100, None).await.expect("create");
    let values: Vec<String> = (0..20).map(|i| i.to_string()).collect();
    for (i, v) in values.iter().enumerate() {
        send_taken(
            &sink,
            Handover::of(&record("orders", "k", v.as_bytes(), b"i")),
            i as u32,
        );
    }
    let mut done = completions(&mut rx, 20).await;
    done.sort_by_key(|(t, _)| *t);
    for (i, outcome) in &done {
        if *i < 5 {
            assert!(outcome.is_ok(), "{i}: {outcome:?}");
        } else {
            let f = outcome.as_ref().unwrap_err();
            assert_eq!(f.kind, FailureKind::Transient, "{i}: {f}");
        }
    }
    assert!(
        done[5].1.as_ref().unwrap_err().cause.contains("nacked"),
        "{:?}",
        done[5]
    );
    let mut bodies = Vec::new();
    while let Some(m) = channel
        .basic_get(&queue, BasicGetOptions { no_ack: true })
        .await
        .unwrap()
    {
        bodies.push(String::from_utf8(m.delivery.data).unwrap());
    }
    assert_eq!(
        bodies,
        values[..5].to_vec(),
        "the first five, in order, and nothing past the nack"
    );
    Box::new(sink).abandon(Duration::from_secs(1));
    let _ = channel.queue_delete(&queue, QueueDeleteOptions::default()).await;
    let _ = channel
        .exchange_delete(&settings.exchange, ExchangeDeleteOptions::default())
        .await;
    let _ = connection.close(200, "").await;
}

#[tokio::test]
async fn cloudevents_binary_mode_writes_the_amqp_bindings_application_properties() {
    let fx = Fixture::new("#").await;
    let (sink, mut rx) = fx.publisher(10, Some(CloudEventsMode::Binary)).await;
    send_taken(&sink, Handover::of(&binary_ce_record("orders.created", b"ev-1")), 1);
    let done = completions(&mut rx, 1).await;
    assert!(done[0].1.is_ok(), "{done:?}");
    let messages = fx.drain().await;
    assert_eq!(messages.len(), 1);
    let m = &messages[0];
    let p = &m.delivery.properties;
    assert_eq!(
        m.delivery.data, b"{\"total\":12}",
        "binary mode: the body is the payload as is"
    );
    // The datacontenttype is the AMQP content_type property, never an application property,
    // and never the body-derived application/json the plain mode would set.
    assert_eq!(
        p.content_type().as_ref().map(|s| s.as_str()),
        Some("application/vnd.acme+json")
    );
    let names: std::collections::BTreeSet<String> = p
        .headers()
        .as_ref()
        .unwrap()
        .inner()
        .keys()
        .map(|k| k.as_str().to_owned())
        .collect();
    let expected: std::collections::BTreeSet<String> = [
        "cloudEvents:specversion",
        "cloudEvents:id",
        "cloudEvents:source",
        "cloudEvents:type",
        "cloudEvents:time",
        "cloudEvents:subject",
        "cloudEvents:tenant",
        "cloudEvents:traceparent",
        "region",
        "id",
        "key",
    ]
    .into_iter()
    .map(str::to_owned)
    .collect();
    assert_eq!(names, expected, "no ce_* or content-type header is left over");
    for (name, value) in [
        ("cloudEvents:specversion", &b"1.0"[..]),
        ("cloudEvents:id", b"ev-1"),
        ("cloudEvents:source", b"/outbox-relay/app/public.outbox"),
        ("cloudEvents:type", b"orders.created"),
        ("cloudEvents:time", b"2023-11-14T22:13:20.123Z"),
        ("cloudEvents:subject", b"order-7"),
        ("cloudEvents:tenant", b"acme"),
        (
            "cloudEvents:traceparent",
            b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        ),
        ("region", b"eu"),
        ("id", b"ev-1"),
        ("key", b"order-7"),
    ] {
        assert_eq!(bytes(header(m, name)), value, "{name}");
    }
    assert_eq!(p.message_id().as_ref().map(|s| s.as_str()), Some("ev-1"));
    fx.finish(sink).await;
}

#[tokio::test]
async fn cloudevents_structured_mode_sets_the_event_formats_content_type() {
    let fx = Fixture::new("#").await;
    let (sink, mut rx) = fx.publisher(10, Some(CloudEventsMode::Structured)).await;
    let envelope = br#"{"specversion":"1.0","id":"ev-2","source":"/s","type":"t","data":{"a":1}}"#;
    let record = SinkRecord {
        destination: Cow::Borrowed("orders.created"),
        key: Cow::Borrowed(b"order-7"),
        value: Some(Cow::Borrowed(envelope)),
        event_id: b"ev-2",
        timestamp_ms: None,
        headers: Cow::Owned(vec![
            (
                Cow::Borrowed("content-type"),
                // The domain's structured content type, written out: a sink does not import the
                // domain (tests/it/layering.rs).
                Some(Cow::Borrowed(&b"application/cloudevents+json; charset=UTF-8"[..])),
            ),
            (
                Cow::Borrowed("traceparent"),
                Some(Cow::Borrowed(
                    &b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"[..],
                )),
            ),
        ]),
        partition: None,
    };
    send_taken(&sink, Handover::of(&record), 2);
    let done = completions(&mut rx, 1).await;
    assert!(done[0].1.is_ok(), "{done:?}");
    let messages = fx.drain().await;
    assert_eq!(messages.len(), 1);
    let m = &messages[0];
    assert_eq!(m.delivery.data, envelope);
    assert_eq!(
        m.delivery.properties.content_type().as_ref().map(|s| s.as_str()),
        Some("application/cloudevents+json; charset=UTF-8")
    );
    assert_eq!(
        header(m, "content-type"),
        None,
        "the content type is a property, not a header"
    );
    assert_eq!(
        bytes(header(m, "traceparent")),
        b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    );
    assert_eq!(bytes(header(m, "id")), b"ev-2");
    assert_eq!(bytes(header(m, "key")), b"order-7");
    fx.finish(sink).await;
}
