//! [`OutboxEvent`]: one outbox event, whatever it was read from, and the one way it becomes a
//! Kafka record.
//!
//! Four sources give an event, each in one place:
//!
//! | source | where | produced by |
//! |---|---|---|
//! | an inserted row, streamed (pgoutput) | `relay::decode` | [`OutboxLayout::extract`](super::layout::OutboxLayout::extract) |
//! | a `pg_logical_emit_message`, streamed | `relay::publish` | [`OutboxEvent::from_message`] (`message.rs`) |
//! | a row claimed by the polling relayer | `poll::worker` | [`OutboxEvent::from_columns`] |
//! | a pending row read by the backfill | `control::backfill` | [`OutboxEvent::from_columns`] |
//!
//! and [`OutboxEvent::record`] is the only way to a record: the route-by value goes through the
//! [`TopicRoute`](crate::config::outbox::TopicRoute), the topic is checked against Kafka's rules, the id becomes the first header
//! (`id`), the extra headers follow in the mapping's order, then `traceparent`/`tracestate` from
//! the trace columns; under `[cloudevents]` value and headers are the CloudEvent's
//! (`outbox::cloudevents`). So the same content gives
//! byte-identical records from every source (the unit tests below, and `tests/it/poll.rs`
//! against a broker).
//!
//! An event borrows from what it was read from (the decoded WAL message, the claimed row): on
//! the streaming path, building it allocates nothing but the header list, and only when header
//! columns are mapped — and a `bytea` payload's decoded bytes (`payload.rs`), the one value that
//! is not the column's text. [`OutboxEvent::into_owned`] detaches it where it must outlive its source.

use std::borrow::Cow;
use std::sync::Arc;

use crate::config::ident::TableName;
use crate::config::outbox::{ColumnTemplate, OutboxMapping};
use crate::config::Settings;
use crate::ops::tracing_export::{ProducerSpan, SpanFields, Tracer};
use crate::outbox::bad_event::BadEvent;
use crate::outbox::cloudevents;
use crate::outbox::connect::ConnectLayout;
use crate::outbox::payload::PayloadFormat;
use crate::outbox::routing;
use crate::outbox::timestamp::parse_timestamp_ms;
use crate::outbox::trace_context;
use crate::sink::{RecordHeader, SinkLimits, SinkRecord};

/// How a row read with SQL (claimed by the poller, read by the backfill) becomes an event, from
/// the column types preflight checked: the payload's decoding and the `[debezium]` layout.
#[derive(Debug, Clone, Default)]
pub(crate) struct RowFormat {
    pub(crate) payload: PayloadFormat,
    pub(crate) connect: Option<Arc<ConnectLayout>>,
}

/// One outbox event: the values its record is made of, before routing.
///
/// Values are the text PostgreSQL's output functions render (for a message, the JSON text as
/// written), passed through as bytes; a `bytea` payload is the column's bytes, decoded from that
/// text ([`PayloadFormat`]). Fields are `Cow`s: borrowed from the source where it
/// holds them as they are (rows; a message's payload), owned where the source had to make them
/// (a message's id and key, which may be JSON numbers or escaped strings).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct OutboxEvent<'a> {
    /// The `id` header.
    pub(crate) id: Cow<'a, [u8]>,
    /// The record key (the aggregate id).
    pub(crate) key: Cow<'a, [u8]>,
    /// What the topic is routed from (Debezium's `routedByValue`).
    pub(crate) route_value: Cow<'a, str>,
    /// The record value; `None` (a NULL payload) only under `[debezium]`, which writes what
    /// Debezium writes for it — otherwise a NULL payload is a bad event.
    pub(crate) payload: Option<Cow<'a, [u8]>>,
    /// The record timestamp; `None` leaves it to the producer.
    pub(crate) timestamp_ms: Option<i64>,
    /// Headers after `id`, in the mapping's order (`header_columns`); a NULL gives a null header.
    pub(crate) headers: Vec<RecordHeader<'a>>,
    /// The `[debezium]` placed columns' text (`OutboxMapping::placed` order, `None` = NULL).
    pub(crate) placed: Vec<Option<Cow<'a, [u8]>>>,
    /// `[debezium]`: how this table's events become Debezium's records; `None`: the columns'
    /// text as it is.
    pub(crate) connect: Option<Arc<ConnectLayout>>,
    /// The outbox table the row was read from (one of `outbox.table`); `None` for a logical
    /// message, which has no table.
    pub(crate) table: Option<Cow<'a, TableName>>,
    /// How the payload column's text became `payload` (`[cloudevents]` derives the content type
    /// from it).
    pub(crate) payload_format: PayloadFormat,
    /// The transaction's commit time (Unix µs), where the source knows it (the stream); the
    /// CloudEvents `time` when no timestamp column gives one.
    pub(crate) commit_time_us: Option<i64>,
    /// `outbox.trace_column`'s text, as it is (`None`: not configured, or NULL).
    pub(crate) traceparent: Option<Cow<'a, [u8]>>,
    /// `outbox.tracestate_column`'s text.
    pub(crate) tracestate: Option<Cow<'a, [u8]>>,
    /// `[cloudevents]` extension columns' text, in `CloudEventsSettings::extensions` order
    /// (`None` = NULL: the attribute is left out).
    pub(crate) extensions: Vec<Option<Cow<'a, [u8]>>>,
    /// `[route]` template and `[filter] where` columns' text, in `OutboxMapping::routing_columns` order (`None` = NULL);
    /// empty for a logical message, whose templates read its own fields.
    pub(crate) routing_columns: Vec<Option<Cow<'a, [u8]>>>,
}

impl<'a> OutboxEvent<'a> {
    /// This event's values as `[cloudevents]` renders them.
    pub(crate) fn cloud_event(&self) -> cloudevents::Source<'_> {
        cloudevents::Source {
            id: &self.id,
            key: &self.key,
            route_value: &self.route_value,
            payload: self.payload.as_deref(),
            payload_format: self.payload_format,
            timestamp_ms: self.timestamp_ms,
            commit_time_us: self.commit_time_us,
            table: self.table.as_deref(),
            headers: &self.headers,
            traceparent: self.traceparent.as_deref(),
            tracestate: self.tracestate.as_deref(),
            extensions: &self.extensions,
        }
    }

    /// The sink's record of this event: destination routed by `router` and checked against the
    /// sink's name rule (an illegal name is [`BadEvent::Topic`]); everything else borrowed.
    ///
    /// Under `[debezium]` key, value, placed headers and partition are rendered as Debezium
    /// renders them ([`ConnectLayout::render`]); `header_columns` follow the placed headers.
    ///
    /// Under `[cloudevents]` value and headers are the CloudEvent's (`outbox::cloudevents`).
    /// Otherwise a `traceparent`/`tracestate` from `outbox.trace_column` follow the other
    /// headers; without a trace column and `[cloudevents]`, nothing is copied.
    pub(crate) fn record<'r>(
        &'r self,
        settings: &'r Settings,
        limits: &SinkLimits,
    ) -> Result<SinkRecord<'r>, BadEvent> {
        let topic = self.destination(settings, limits)?;
        let key: Cow<'r, [u8]> = match &settings.router.key {
            None => Cow::Borrowed(&self.key),
            Some(template) => Cow::Owned(self.render(&settings.outbox, template)?),
        };
        if let Some(ce) = &settings.cloudevents {
            // `subject` stays the aggregate id (`key_column`); `route.key` is the broker's key.
            let rendered = cloudevents::render(self.cloud_event(), ce);
            return Ok(SinkRecord {
                destination: topic,
                key,
                value: rendered.value,
                event_id: &self.id,
                timestamp_ms: self.timestamp_ms,
                headers: Cow::Owned(rendered.headers),
                partition: None,
            });
        }
        let Some(connect) = &self.connect else {
            return Ok(SinkRecord {
                destination: topic,
                key,
                value: self.payload.as_deref().map(Cow::Borrowed),
                event_id: &self.id,
                timestamp_ms: self.timestamp_ms,
                headers: if self.traceparent.is_none() {
                    Cow::Borrowed(&self.headers)
                } else {
                    let mut headers = self.headers.clone();
                    self.push_trace_headers(&mut headers);
                    Cow::Owned(headers)
                },
                partition: None,
            });
        };
        let rendered = connect.render(&self.key, self.payload.as_deref(), &self.placed, &self.route_value)?;
        let mut headers: Vec<RecordHeader<'r>> = rendered
            .headers
            .into_iter()
            .map(|(name, value)| (Cow::Owned(name), value.map(Cow::Owned)))
            .collect();
        headers.extend(self.headers.iter().cloned());
        self.push_trace_headers(&mut headers);
        Ok(SinkRecord {
            destination: topic,
            key: Cow::Owned(rendered.key),
            value: rendered.value.map(Cow::Owned),
            event_id: &self.id,
            timestamp_ms: self.timestamp_ms,
            headers: Cow::Owned(headers),
            partition: rendered.partition,
        })
    }

    /// The destination of this event: `[route] topic`'s template over its columns, or its
    /// route-by value through the regex rule; then checked against the sink's name rule.
    pub(crate) fn destination<'r>(
        &'r self,
        settings: &Settings,
        limits: &SinkLimits,
    ) -> Result<Cow<'r, str>, BadEvent> {
        let Some(template) = &settings.router.topic else {
            return routing::destination(&settings.router, limits, &self.route_value);
        };
        let name = String::from_utf8(self.render(&settings.outbox, template)?).map_err(|_| BadEvent::NotUtf8 {
            column: "[route] topic".into(),
            role: "destination",
        })?;
        (limits.check_name)(&name).map_err(BadEvent::Topic)?;
        Ok(Cow::Owned(name))
    }

    /// `template` with this event's column values put in; a NULL column is a bad event naming it.
    fn render(&self, mapping: &OutboxMapping, template: &ColumnTemplate) -> Result<Vec<u8>, BadEvent> {
        template
            .render(|i| self.template_value(mapping, i))
            .map_err(|i| BadEvent::Null {
                column: mapping
                    .routing_columns
                    .get(i)
                    .map_or_else(String::new, |(c, _)| c.as_str().to_owned()),
                role: mapping.routing_columns.get(i).map_or("route template", |(_, key)| key),
            })
    }

    /// The `i`-th template column's text. A logical message has no columns: its route-by value,
    /// key and id stand for the columns they are mapped from (anything else is NULL).
    fn template_value(&self, mapping: &OutboxMapping, i: usize) -> Option<&[u8]> {
        if self.table.is_some() {
            return self.routing_columns.get(i)?.as_deref();
        }
        let (column, _) = mapping.routing_columns.get(i)?;
        if *column == mapping.route_by {
            Some(self.route_value.as_bytes())
        } else if *column == mapping.key {
            Some(&self.key)
        } else if *column == mapping.id {
            Some(&self.id)
        } else {
            None
        }
    }

    /// Whether `[filter]` lets this event through (always, without the section). A
    /// `where` column whose text is not UTF-8 matches no pattern.
    pub(crate) fn passes(&self, settings: &Settings) -> bool {
        let Some(filter) = &settings.filter else {
            return true;
        };
        filter.admits_values(&self.route_value, |i| {
            self.template_value(&settings.outbox, i)
                .and_then(|v| std::str::from_utf8(v).ok())
        })
    }

    /// The W3C `traceparent` and `tracestate` headers of the trace columns, when not NULL.
    fn push_trace_headers<'r>(&'r self, headers: &mut Vec<RecordHeader<'r>>) {
        if let Some(tp) = &self.traceparent {
            headers.push((Cow::Borrowed("traceparent"), Some(Cow::Borrowed(tp))));
            if let Some(ts) = &self.tracestate {
                headers.push((Cow::Borrowed("tracestate"), Some(Cow::Borrowed(ts))));
            }
        }
    }

    /// This event with its transaction's commit time (the stream knows it; SQL reads do not).
    pub(crate) fn with_commit_time(mut self, unix_us: i64) -> Self {
        self.commit_time_us = Some(unix_us);
        self
    }

    /// `[tracing]`: the event's PRODUCER span, started at `start_unix_us`, and the event as it is
    /// then sent, its `traceparent` naming the span (same trace, the span's id, its sampled flag;
    /// `tracestate` as read). The rule every source follows (the stream's publish step, the
    /// poller): a valid parent is followed; a row's invalid `traceparent` is kept untouched and
    /// the span is a root. `None`: an unsampled root (sent as read), or the destination is bad
    /// (the record's routing reports it).
    pub(crate) fn traced(
        &self,
        tracer: &Tracer,
        settings: &Settings,
        limits: &SinkLimits,
        start_unix_us: i64,
    ) -> Option<(Box<ProducerSpan>, OutboxEvent<'a>)> {
        let destination = self.destination(settings, limits).ok()?;
        let valid = self
            .traceparent
            .as_deref()
            .filter(|tp| trace_context::check_traceparent(tp).is_ok());
        let names = crate::sink::trace_names(settings);
        let fields = SpanFields {
            system: names.messaging_system,
            destination: &destination,
            message_id: &self.id,
            key: names.key_attribute.map(|attribute| (attribute, &self.key[..])),
            partition: None,
            tracestate: self.tracestate.as_deref(),
        };
        let span = tracer.start(valid, start_unix_us, &fields)?;
        let mut traced = self.clone();
        if valid.is_some() || self.traceparent.is_none() {
            traced.traceparent = Some(Cow::Owned(span.traceparent().into_bytes()));
        }
        Some((Box::new(span), traced))
    }

    /// Whether the trace column holds a value that is no W3C `traceparent`: it is published
    /// untouched all the same; the caller counts it (`outbox_relay_traceparent_invalid_total`).
    pub(crate) fn has_invalid_traceparent(&self) -> bool {
        self.traceparent
            .as_deref()
            .is_some_and(|tp| trace_context::check_traceparent(tp).is_err())
    }

    /// The same event owning all its values, to outlive its source (a suspect the relay holds
    /// back, `relay::quarantine`). Copies; never on the streaming path's normal course.
    pub(crate) fn into_owned(self) -> OutboxEvent<'static> {
        OutboxEvent {
            id: Cow::Owned(self.id.into_owned()),
            key: Cow::Owned(self.key.into_owned()),
            route_value: Cow::Owned(self.route_value.into_owned()),
            payload: self.payload.map(|p| Cow::Owned(p.into_owned())),
            timestamp_ms: self.timestamp_ms,
            headers: self
                .headers
                .into_iter()
                .map(|(name, value)| (Cow::Owned(name.into_owned()), value.map(|v| Cow::Owned(v.into_owned()))))
                .collect(),
            placed: self
                .placed
                .into_iter()
                .map(|v| v.map(|v| Cow::Owned(v.into_owned())))
                .collect(),
            connect: self.connect,
            table: self.table.map(|t| Cow::Owned(t.into_owned())),
            payload_format: self.payload_format,
            commit_time_us: self.commit_time_us,
            traceparent: self.traceparent.map(|v| Cow::Owned(v.into_owned())),
            tracestate: self.tracestate.map(|v| Cow::Owned(v.into_owned())),
            extensions: self
                .extensions
                .into_iter()
                .map(|v| v.map(|v| Cow::Owned(v.into_owned())))
                .collect(),
            routing_columns: self
                .routing_columns
                .into_iter()
                .map(|v| v.map(|v| Cow::Owned(v.into_owned())))
                .collect(),
        }
    }

    /// The event of a row of `table` (one of `mapping.tables`) read with SQL: `values` are the mapped columns' text in
    /// [`OutboxMapping::columns`] order (`None` = NULL), as the polling relayer's claim query
    /// and the backfill's snapshot read select them (in text format, under the replication
    /// connection's output settings, so the text is what pgoutput would have sent).
    ///
    /// The rules are the streaming path's: id, key, route-by value and payload must not be
    /// NULL; the payload's text becomes the record value per `payload` (a `bytea` column's hex
    /// text is decoded to its bytes); an unparseable timestamp leaves the record timestamp to the
    /// producer; a NULL header column gives a null header.
    ///
    /// Under a `[debezium]` layout (`format.connect`) a NULL payload is an event.
    pub(crate) fn from_columns(
        mapping: &'a OutboxMapping,
        table: &'a TableName,
        values: &[Option<&'a str>],
        format: &RowFormat,
    ) -> Result<Self, BadEvent> {
        let (payload, connect) = (format.payload, format.connect.as_ref());
        let value = |i: usize| values.get(i).copied().flatten();
        let required = |i: usize, role: &'static str| {
            value(i).ok_or_else(|| BadEvent::Null {
                column: mapping.columns()[i].1.as_str().to_owned(),
                role,
            })
        };
        let id = required(0, "event id")?;
        let key = required(1, "message key")?;
        let route_value = required(2, "route-by value")?;
        let payload_text = if connect.is_some() {
            value(3)
        } else {
            Some(required(3, "payload")?)
        };
        let payload = payload_text
            .map(|t| payload.value(t.as_bytes(), || mapping.columns()[3].1.as_str().to_owned()))
            .transpose()?;
        let mut next = 4;
        let timestamp_ms = if mapping.timestamp.is_some() {
            next += 1;
            value(4).and_then(|t| parse_timestamp_ms(t.as_bytes()))
        } else {
            None
        };
        let headers = mapping
            .headers
            .iter()
            .enumerate()
            .map(|(i, (_, name))| {
                (
                    Cow::Borrowed(name.as_str()),
                    value(next + i).map(|v| Cow::Borrowed(v.as_bytes())),
                )
            })
            .collect();
        next += mapping.headers.len();
        let placed = (0..mapping.placed.len())
            .map(|i| value(next + i).map(|v| Cow::Borrowed(v.as_bytes())))
            .collect();
        next += mapping.placed.len();
        let mut optional = |configured: bool| {
            configured.then(|| {
                next += 1;
                value(next - 1).map(|v| Cow::Borrowed(v.as_bytes()))
            })
        };
        let traceparent = optional(mapping.traceparent.is_some()).flatten();
        let tracestate = optional(mapping.tracestate.is_some()).flatten();
        let extensions = (0..mapping.extensions.len())
            .map(|i| value(next + i).map(|v| Cow::Borrowed(v.as_bytes())))
            .collect();
        next += mapping.extensions.len();
        let routing_columns = (0..mapping.routing_columns.len())
            .map(|i| value(next + i).map(|v| Cow::Borrowed(v.as_bytes())))
            .collect();
        Ok(OutboxEvent {
            id: Cow::Borrowed(id.as_bytes()),
            key: Cow::Borrowed(key.as_bytes()),
            route_value: Cow::Borrowed(route_value),
            payload,
            timestamp_ms,
            headers,
            placed,
            connect: connect.cloned(),
            table: Some(Cow::Borrowed(table)),
            payload_format: format.payload,
            commit_time_us: None,
            traceparent,
            tracestate,
            extensions,
            routing_columns,
        })
    }

    /// The event id of `values` (as for [`from_columns`](Self::from_columns)) for error
    /// messages, also when they are no event: `?` when the id itself is NULL.
    pub(crate) fn id_of_columns<'v>(values: &[Option<&'v str>]) -> &'v str {
        values.first().copied().flatten().unwrap_or("?")
    }
}

#[cfg(test)]
mod tests {
    //! [`OutboxEvent`] from every source, and its record.

    use std::borrow::Cow;

    use bytes::Bytes;
    use proptest::prelude::*;

    use super::*;

    /// The default sink's name rule and size limit (Kafka's), as its plugin's limits carry them.
    static LIMITS: std::sync::LazyLock<SinkLimits> = std::sync::LazyLock::new(|| crate::sink::limits(&settings("")));

    use crate::outbox::layout::OutboxLayout;
    use crate::outbox::payload::ByteaTypes;
    use crate::postgres::pgoutput::{ColumnValue, Relation, TupleData};

    use crate::config::test_support::settings;

    /// Rows whose payload column is `bytea`, without `[debezium]`.
    const BYTEA_ROWS: RowFormat = RowFormat {
        payload: PayloadFormat::Bytea,
        connect: None,
    };

    /// A timestamp column, two header columns and a prefix-routing rule.
    const FULL: &str =
        "[outbox]\ntimestamp_column = \"created_at\"\nheader_columns = { a_col = \"x-a\", b_col = \"x-b\" }\n\
                        [route]\ntopic_regex = '^(?<routedByValue>[^.]+)\\..*$'\n";

    fn relation(names: &[&str]) -> Relation {
        Relation::text_columns("public", "outbox", names)
    }

    /// The layout of `table` as the first configured outbox table, no `bytea` types known.
    fn layout_of(s: &Settings, table: &Relation) -> OutboxLayout {
        OutboxLayout::resolve(&s.outbox, &s.outbox.tables[0], table, &ByteaTypes::default(), None).unwrap()
    }

    /// The event of `values` (mapped columns, text payload) read from the first outbox table.
    fn from_text_columns<'a>(s: &'a Settings, values: &[Option<&'a str>]) -> Result<OutboxEvent<'a>, BadEvent> {
        OutboxEvent::from_columns(&s.outbox, &s.outbox.tables[0], values, &RowFormat::default())
    }

    fn tuple(values: &[Option<&str>]) -> TupleData {
        TupleData {
            columns: values
                .iter()
                .map(|v| {
                    v.map_or(ColumnValue::Null, |t| {
                        ColumnValue::Text(Bytes::copy_from_slice(t.as_bytes()))
                    })
                })
                .collect(),
        }
    }

    /// The outbox table as pgoutput describes it: the mapped columns in another order than the
    /// mapping's, and an unmapped one in between.
    const TABLE: [&str; 8] = [
        "b_col",
        "payload",
        "note",
        "id",
        "type",
        "created_at",
        "aggregate_id",
        "a_col",
    ];

    /// The same row as [`TABLE`]'s tuple and as mapped columns in `OutboxMapping::columns` order.
    struct Row<'a> {
        id: &'a str,
        key: &'a str,
        route: &'a str,
        payload: &'a str,
        created_at: Option<&'a str>,
        a: Option<&'a str>,
        b: Option<&'a str>,
    }

    impl<'a> Row<'a> {
        fn streamed(&self) -> TupleData {
            tuple(&[
                self.b,
                Some(self.payload),
                Some("unmapped"),
                Some(self.id),
                Some(self.route),
                self.created_at,
                Some(self.key),
                self.a,
            ])
        }

        fn columns(&self) -> Vec<Option<&'a str>> {
            vec![
                Some(self.id),
                Some(self.key),
                Some(self.route),
                Some(self.payload),
                self.created_at,
                self.a,
                self.b,
            ]
        }
    }

    const ROW: Row<'static> = Row {
        id: "42",
        key: "agg-1",
        route: "order.placed",
        payload: "{\"a\": 1}",
        created_at: Some("1970-01-01 00:00:01.5+00"),
        a: None,
        b: Some("v"),
    };

    #[test]
    fn maps_columns_like_the_streaming_path() {
        let s = settings(FULL);
        let values = ROW.columns();
        let event = from_text_columns(&s, &values).unwrap();
        let record = event.record(&s, &LIMITS).unwrap();
        assert_eq!(record.destination, "order");
        assert_eq!(record.event_id, b"42");
        assert_eq!(&*record.key, b"agg-1");
        assert_eq!(record.value.as_deref(), Some(&b"{\"a\": 1}"[..]));
        assert_eq!(record.timestamp_ms, Some(1500));
        // BTreeMap order of the header columns, as the streaming path uses.
        assert_eq!(
            record.headers.as_ref(),
            [
                (Cow::Borrowed("x-a"), None),
                (Cow::Borrowed("x-b"), Some(Cow::Borrowed(&b"v"[..])))
            ]
        );
    }

    #[test]
    fn each_outbox_table_resolves_its_own_layout_and_events_name_their_table() {
        let s = settings("[outbox]\ntable = [\"sales.outbox\", \"billing.outbox\"]\n");
        let (sales, billing) = (&s.outbox.tables[0], &s.outbox.tables[1]);
        // Same mapped columns, other positions and an extra column in the second table.
        let sales_rel = Relation::text_columns("sales", "outbox", &["id", "aggregate_id", "type", "payload"]);
        let billing_rel =
            Relation::text_columns("billing", "outbox", &["note", "payload", "type", "aggregate_id", "id"]);
        let bytea = ByteaTypes::default();
        let sales_layout = OutboxLayout::resolve(&s.outbox, sales, &sales_rel, &bytea, None).unwrap();
        let billing_layout = OutboxLayout::resolve(&s.outbox, billing, &billing_rel, &bytea, None).unwrap();
        let sales_row = tuple(&[Some("1"), Some("agg"), Some("order.placed"), Some("{}")]);
        let billing_row = tuple(&[Some("n"), Some("{}"), Some("order.placed"), Some("agg"), Some("1")]);
        let from_sales = sales_layout.extract(&sales_rel, &sales_row).unwrap();
        let from_billing = billing_layout.extract(&billing_rel, &billing_row).unwrap();
        assert_eq!(from_sales.table.as_deref(), Some(sales));
        assert_eq!(from_billing.table.as_deref(), Some(billing));
        assert_eq!(
            from_sales.record(&s, &LIMITS).unwrap(),
            from_billing.record(&s, &LIMITS).unwrap(),
            "the same content gives the same record whichever table holds it"
        );
        assert_eq!(from_billing.clone().into_owned().table.as_deref(), Some(billing));
        let polled = OutboxEvent::from_columns(
            &s.outbox,
            billing,
            &[Some("1"), Some("agg"), Some("order.placed"), Some("{}")],
            &RowFormat::default(),
        )
        .unwrap();
        assert_eq!(polled, from_billing);
        let message = OutboxEvent::from_message(br#"{"type":"t","aggregate_id":"a","id":1,"payload":{}}"#).unwrap();
        assert_eq!(message.table, None, "a logical message has no table");

        // A mapped column missing from one table's Relation names that table.
        let short = Relation::text_columns("billing", "outbox", &["id", "aggregate_id", "type"]);
        let err = OutboxLayout::resolve(&s.outbox, billing, &short, &bytea, None).unwrap_err();
        assert!(err.to_string().contains(r#"table "billing"."outbox""#), "{err}");
    }

    #[test]
    fn every_source_gives_the_same_record_for_the_same_content() {
        let s = settings(FULL);
        let layout = layout_of(&s, &relation(&TABLE));
        let streamed = ROW.streamed();
        let from_wal = layout.extract(&relation(&TABLE), &streamed).unwrap();
        // The poller's claim borrows from the query's row; the backfill reads owned strings.
        let polled_values = ROW.columns();
        let polled = from_text_columns(&s, &polled_values).unwrap();
        let pending: Vec<Option<String>> = ROW.columns().iter().map(|v| v.map(str::to_owned)).collect();
        let pending_values: Vec<Option<&str>> = pending.iter().map(Option::as_deref).collect();
        let backfilled = from_text_columns(&s, &pending_values).unwrap();
        assert_eq!(from_wal, polled);
        assert_eq!(from_wal, backfilled);
        let record = from_wal.record(&s, &LIMITS).unwrap();
        assert_eq!(record, polled.record(&s, &LIMITS).unwrap());
        assert_eq!(record, backfilled.record(&s, &LIMITS).unwrap());
        assert_eq!(record, from_wal.clone().into_owned().record(&s, &LIMITS).unwrap());

        // A message carries no timestamp or headers: compare with a row mapped without them.
        let plain = settings("[route]\ntopic_regex = '^(?<routedByValue>[^.]+)\\..*$'\n");
        let message =
            OutboxEvent::from_message(br#"{"type":"order.placed","aggregate_id":"agg-1","id":42,"payload":{"a": 1}}"#)
                .unwrap();
        let table = relation(&["id", "aggregate_id", "type", "payload"]);
        let row = tuple(&[Some("42"), Some("agg-1"), Some("order.placed"), Some("{\"a\": 1}")]);
        let plain_layout = layout_of(&plain, &table);
        let from_wal = plain_layout.extract(&table, &row).unwrap();
        let values = [Some("42"), Some("agg-1"), Some("order.placed"), Some("{\"a\": 1}")];
        let polled = from_text_columns(&plain, &values).unwrap();
        let record = message.record(&plain, &LIMITS).unwrap();
        assert_eq!(record.destination, "order");
        assert_eq!(record, from_wal.record(&plain, &LIMITS).unwrap());
        assert_eq!(record, polled.record(&plain, &LIMITS).unwrap());
    }

    #[test]
    fn trace_and_extension_columns_are_read_alike_from_every_source() {
        const TP: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        for ce in ["", "[cloudevents]\nextensions = { tenant = \"tenant\" }\n"] {
            let s = settings(&format!(
                "[outbox]\ntrace_column = \"tp\"\ntracestate_column = \"ts\"\nheader_columns = {{ h = \"x-h\" }}\n{ce}"
            ));
            // pgoutput's order differs from the mapping's.
            let mut names = vec!["ts", "payload", "tp", "id", "h", "type", "aggregate_id"];
            let mut streamed = vec![
                Some("st=1"),
                Some("{}"),
                Some(TP),
                Some("1"),
                Some("hv"),
                Some("t"),
                Some("k"),
            ];
            let mut polled = vec![
                Some("1"),
                Some("k"),
                Some("t"),
                Some("{}"),
                Some("hv"),
                Some(TP),
                Some("st=1"),
            ];
            if !ce.is_empty() {
                names.insert(0, "tenant");
                streamed.insert(0, Some("acme"));
                polled.push(Some("acme"));
            }
            let table = relation(&names);
            let layout = layout_of(&s, &table);
            let row = tuple(&streamed);
            let from_wal = layout.extract(&table, &row).unwrap();
            let from_sql = from_text_columns(&s, &polled).unwrap();
            assert_eq!(from_wal, from_sql);
            assert_eq!(from_wal.traceparent.as_deref(), Some(TP.as_bytes()));
            assert_eq!(from_wal.tracestate.as_deref(), Some(&b"st=1"[..]));
            assert!(!from_wal.has_invalid_traceparent());
            let record = from_wal.record(&s, &LIMITS).unwrap();
            assert_eq!(record, from_sql.record(&s, &LIMITS).unwrap());
            let names: Vec<&str> = record.headers.iter().map(|(n, _)| &**n).collect();
            if ce.is_empty() {
                assert_eq!(names, ["x-h", "traceparent", "tracestate"]);
            } else {
                assert!(
                    names.contains(&"ce_traceparent") && names.contains(&"ce_tenant"),
                    "{names:?}"
                );
                assert!(
                    !names.contains(&"traceparent"),
                    "binary mode names it ce_traceparent: {names:?}"
                );
            }
        }
        // A NULL trace column gives no header; a malformed one is kept as it is, and flagged.
        let s = settings("[outbox]\ntrace_column = \"tp\"\n");
        let null = [Some("1"), Some("k"), Some("t"), Some("{}"), None];
        let event = from_text_columns(&s, &null).unwrap();
        assert!(matches!(event.record(&s, &LIMITS).unwrap().headers, Cow::Borrowed([])));
        assert!(!event.has_invalid_traceparent());
        let bad = [Some("1"), Some("k"), Some("t"), Some("{}"), Some("00-zz")];
        let event = from_text_columns(&s, &bad).unwrap();
        assert!(event.has_invalid_traceparent());
        assert_eq!(
            event.record(&s, &LIMITS).unwrap().headers.as_ref(),
            [(Cow::Borrowed("traceparent"), Some(Cow::Borrowed(&b"00-zz"[..])))]
        );
    }

    #[test]
    fn a_streamed_row_is_borrowed_not_copied() {
        let s = settings(FULL);
        let table = relation(&TABLE);
        let layout = layout_of(&s, &table);
        let streamed = ROW.streamed();
        let event = layout.extract(&table, &streamed).unwrap();
        let borrowed = |c: &Cow<'_, [u8]>| matches!(c, Cow::Borrowed(_));
        assert!(borrowed(&event.id) && borrowed(&event.key) && borrowed(event.payload.as_ref().unwrap()));
        assert!(matches!(event.route_value, Cow::Borrowed(_)));
        assert!(event
            .headers
            .iter()
            .all(|(name, value)| matches!(name, Cow::Borrowed(_)) && value.as_ref().is_none_or(borrowed)));
        // The default rule routes to the value itself without building a topic.
        let default = settings("");
        let record = OutboxEvent::from_columns(
            &default.outbox,
            &default.outbox.tables[0],
            &[Some("1"), Some("k"), Some("t"), Some("{}")],
            &RowFormat::default(),
        )
        .unwrap();
        assert!(matches!(
            record.record(&default, &LIMITS).unwrap().destination,
            Cow::Borrowed("t")
        ));
    }

    #[test]
    fn null_required_columns_and_bad_topics_are_bad_events() {
        let s = settings("");
        let values = [Some("7"), None, Some("t"), Some("{}")];
        let err = from_text_columns(&s, &values).unwrap_err();
        assert_eq!(OutboxEvent::id_of_columns(&values), "7");
        assert_eq!(
            err,
            BadEvent::Null {
                column: "aggregate_id".into(),
                role: "message key"
            }
        );
        let values = [None, Some("k"), Some("t"), Some("{}")];
        assert!(from_text_columns(&s, &values).is_err());
        assert_eq!(OutboxEvent::id_of_columns(&values), "?");
        let values = [Some("8"), Some("k"), Some("has space"), Some("{}")];
        let event = from_text_columns(&s, &values).unwrap();
        assert_eq!(OutboxEvent::id_of_columns(&values), "8");
        assert!(matches!(event.record(&s, &LIMITS).unwrap_err(), BadEvent::Topic(_)));
    }

    #[test]
    fn unparseable_timestamps_leave_the_record_timestamp_to_the_producer() {
        let s = settings("[outbox]\ntimestamp_column = \"created_at\"\n");
        let values = [Some("1"), Some("k"), Some("t"), Some("{}"), Some("infinity")];
        let event = from_text_columns(&s, &values).unwrap();
        assert_eq!(event.timestamp_ms, None);
    }

    #[test]
    fn streamed_rows_that_are_no_event_name_the_column() {
        let s = settings(FULL);
        let table = relation(&TABLE);
        let layout = layout_of(&s, &table);
        let with = |i: usize, value: ColumnValue| {
            let mut t = ROW.streamed();
            t.columns[i] = value;
            t
        };
        let null_type = with(4, ColumnValue::Null);
        assert_eq!(
            layout.extract(&table, &null_type).unwrap_err(),
            BadEvent::Null {
                column: "type".into(),
                role: "route-by value"
            }
        );
        assert_eq!(layout.id_for_error(&null_type), b"42");
        let not_utf8 = with(4, ColumnValue::Text(Bytes::from_static(b"\xff")));
        assert!(
            matches!(layout.extract(&table, &not_utf8).unwrap_err(), BadEvent::NotUtf8 { column, .. } if column == "type")
        );
        let binary = with(1, ColumnValue::Binary(Bytes::from_static(b"\x00")));
        assert_eq!(
            layout.extract(&table, &binary).unwrap_err(),
            BadEvent::Binary {
                column: "payload".into()
            }
        );
        let null_id = with(3, ColumnValue::Null);
        assert_eq!(layout.id_for_error(&null_id), b"?");
        let mut short = ROW.streamed();
        short.columns.truncate(5);
        assert_eq!(
            layout.extract(&table, &short).unwrap_err(),
            BadEvent::ShortTuple { got: 5, expected: 8 }
        );
        // A NULL header column is a null header, not a bad event.
        let null_header = with(0, ColumnValue::Null);
        let event = layout.extract(&table, &null_header).unwrap();
        assert_eq!(event.headers[1], (Cow::Borrowed("x-b"), None));
    }

    /// The outbox table with its payload column of type `type_oid`.
    fn typed_payload(type_oid: u32) -> Relation {
        let mut table = relation(&["id", "aggregate_id", "type", "payload"]);
        table.columns[3].type_oid = type_oid;
        table
    }

    #[test]
    fn a_bytea_payload_is_its_bytes_from_every_source() {
        use crate::outbox::payload::BYTEA_OID;
        const DOMAIN_OID: u32 = 16_999;
        let s = settings("");
        let hex = r"\x00ff80c328";
        let bytes = [0x00, 0xFF, 0x80, 0xC3, 0x28];
        let row = tuple(&[Some("9"), Some("k"), Some("t"), Some(hex)]);
        let bytea = ByteaTypes::with_domains([DOMAIN_OID]);
        for type_oid in [BYTEA_OID, DOMAIN_OID] {
            let table = typed_payload(type_oid);
            let layout = OutboxLayout::resolve(&s.outbox, &s.outbox.tables[0], &table, &bytea, None).unwrap();
            let streamed = layout.extract(&table, &row).unwrap();
            assert_eq!(streamed.payload.as_deref(), Some(&bytes[..]));
            let values = [Some("9"), Some("k"), Some("t"), Some(hex)];
            let polled = OutboxEvent::from_columns(&s.outbox, &s.outbox.tables[0], &values, &BYTEA_ROWS).unwrap();
            assert_eq!(streamed, polled);
            assert_eq!(streamed.record(&s, &LIMITS).unwrap().value.as_deref(), Some(&bytes[..]));
        }
        // A domain the session does not know of, and text types, pass the text unchanged.
        let table = typed_payload(DOMAIN_OID);
        let layout = layout_of(&s, &table);
        let event = layout.extract(&table, &row).unwrap();
        assert!(matches!(event.payload, Some(Cow::Borrowed(p)) if p == hex.as_bytes()));
        let values = [Some("9"), Some("k"), Some("t"), Some(hex)];
        let text = from_text_columns(&s, &values).unwrap();
        assert!(matches!(text.payload, Some(Cow::Borrowed(p)) if p == hex.as_bytes()));
    }

    #[test]
    fn a_malformed_bytea_payload_is_a_bad_event_naming_the_column() {
        let s = settings("");
        let table = typed_payload(crate::outbox::payload::BYTEA_OID);
        let layout = layout_of(&s, &table);
        for bad in [r"\x0", r"\xzz", "00ff"] {
            let row = tuple(&[Some("9"), Some("k"), Some("t"), Some(bad)]);
            let err = layout.extract(&table, &row).unwrap_err();
            assert!(
                matches!(&err, BadEvent::Bytea { column, .. } if column == "payload"),
                "{err}"
            );
            assert_eq!(layout.id_for_error(&row), b"9");
            let values = [Some("9"), Some("k"), Some("t"), Some(bad)];
            let polled = OutboxEvent::from_columns(&s.outbox, &s.outbox.tables[0], &values, &BYTEA_ROWS).unwrap_err();
            assert_eq!(polled, err);
        }
        // A NULL payload is still a NULL, whatever its type.
        let row = tuple(&[Some("9"), Some("k"), Some("t"), None]);
        assert!(matches!(
            layout.extract(&table, &row).unwrap_err(),
            BadEvent::Null { .. }
        ));
    }

    #[test]
    fn route_templates_give_one_destination_and_key_from_every_source() {
        let s = settings("[route]\ntopic = \"${tenant}.${type}\"\nkey = \"${tenant}:${aggregate_id}\"\n");
        // pgoutput's order: the tenant column first, unmapped otherwise.
        let table = relation(&["tenant", "id", "aggregate_id", "type", "payload"]);
        let layout = layout_of(&s, &table);
        let row = tuple(&[Some("acme"), Some("1"), Some("agg"), Some("order.placed"), Some("{}")]);
        let from_wal = layout.extract(&table, &row).unwrap();
        // SQL reads select the mapped columns, then the routing_columns ones (tenant, type, aggregate_id).
        let values = [
            Some("1"),
            Some("agg"),
            Some("order.placed"),
            Some("{}"),
            Some("acme"),
            Some("order.placed"),
            Some("agg"),
        ];
        let polled = from_text_columns(&s, &values).unwrap();
        let record = from_wal.record(&s, &LIMITS).unwrap();
        assert_eq!(record.destination, "acme.order.placed");
        assert_eq!(&*record.key, b"acme:agg");
        assert_eq!(record.event_id, b"1");
        assert_eq!(record, polled.record(&s, &LIMITS).unwrap());
        assert_eq!(record, from_wal.clone().into_owned().record(&s, &LIMITS).unwrap());

        // A NULL template column is a bad event naming the column and the key.
        let null_tenant = tuple(&[None, Some("1"), Some("agg"), Some("order.placed"), Some("{}")]);
        let err = layout
            .extract(&table, &null_tenant)
            .unwrap()
            .record(&s, &LIMITS)
            .unwrap_err();
        assert_eq!(
            err,
            BadEvent::Null {
                column: "tenant".into(),
                role: "route.topic"
            }
        );
        // An illegal routed name is one too, as under the regex rule.
        let spaced = tuple(&[Some("a b"), Some("1"), Some("agg"), Some("t"), Some("{}")]);
        assert!(matches!(
            layout
                .extract(&table, &spaced)
                .unwrap()
                .record(&s, &LIMITS)
                .unwrap_err(),
            BadEvent::Topic(_)
        ));
        // A template column missing from the Relation names the template's key.
        let short = relation(&["id", "aggregate_id", "type", "payload"]);
        let err = OutboxLayout::resolve(&s.outbox, &s.outbox.tables[0], &short, &ByteaTypes::default(), None)
            .unwrap_err()
            .to_string();
        assert!(err.contains("\"tenant\" (route.topic)"), "{err}");
        let text = |name: &str| crate::postgres::client::CatalogColumn {
            name: name.into(),
            type_name: "text".into(),
            base_oid: 25,
            base_name: "text".into(),
            base_kind: "b".into(),
            not_null: false,
        };
        let columns: Vec<_> = ["id", "aggregate_id", "type", "payload"].map(text).to_vec();
        let err = crate::outbox::column_types::check_mapping(&s.outbox, &s.outbox.tables[0], &columns)
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with(
                "route.topic = \"tenant\", but the outbox table \"public\".\"events_outbox\" has no such column"
            ) && err.contains("\"id\", \"aggregate_id\", \"type\", \"payload\""),
            "{err}"
        );

        // A logical message's fields stand for the columns they are mapped from.
        let by_type = settings("[outbox]\nmessage_prefix = \"outbox\"\n[route]\ntopic = \"events.${type}\"\nkey = \"${aggregate_id}-${id}\"\n");
        let message = OutboxEvent::from_message(br#"{"type":"order","aggregate_id":"a","id":7,"payload":{}}"#).unwrap();
        let record = message.record(&by_type, &LIMITS).unwrap();
        assert_eq!(record.destination, "events.order");
        assert_eq!(&*record.key, b"a-7");
        let err = message.record(&s, &LIMITS).unwrap_err();
        assert!(
            matches!(err, BadEvent::Null { ref column, .. } if column == "tenant"),
            "{err}"
        );
    }

    proptest! {
        #[test]
        fn a_streamed_row_and_the_same_row_read_with_sql_give_one_record(
            id in "[0-9]{1,8}", key in "\\PC{0,12}", route in "[a-z]{1,8}(\\.[a-z]{1,8})?", payload in "\\PC{0,40}",
            created_at in proptest::option::of("20[0-9]{2}-0[1-9]-1[0-9] 1[0-9]:[0-5][0-9]:[0-5][0-9](\\.[0-9]{1,6})?\\+00"),
            a in proptest::option::of("\\PC{0,8}"), b in proptest::option::of("\\PC{0,8}"),
        ) {
            let s = settings(FULL);
            let table = relation(&TABLE);
            let layout = OutboxLayout::resolve(&s.outbox, &s.outbox.tables[0], &table, &ByteaTypes::default(), None).unwrap();
            let row = Row {
                id: &id, key: &key, route: &route, payload: &payload,
                created_at: created_at.as_deref(), a: a.as_deref(), b: b.as_deref(),
            };
            let streamed = row.streamed();
            let from_wal = layout.extract(&table, &streamed).unwrap();
            let values = row.columns();
            let polled = from_text_columns(&s, &values).unwrap();
            prop_assert_eq!(from_wal.record(&s, &LIMITS).unwrap(), polled.record(&s, &LIMITS).unwrap());
            prop_assert_eq!(from_wal.timestamp_ms.is_some(), created_at.is_some());
        }
    }
}
