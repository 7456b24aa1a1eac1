//! From a streamed outbox row (a pgoutput Insert) to an [`OutboxEvent`].
//!
//! pgoutput describes a table once per session (and again after any `ALTER TABLE`) in a Relation
//! message, then sends rows as positional tuples. [`OutboxLayout`] resolves the configured column
//! names to positions for the current Relation, so a column added or dropped mid-stream only
//! shifts positions; a *mapped* column disappearing is an error the operator must act on.
//!
//! With several outbox tables (`outbox.table` a list) each table's Relation resolves a layout of
//! its own: the tables share the column names, not their positions or types. A layout knows its
//! table, so every event it extracts says which table it came from.
//!
//! Values arrive in text format, i.e. exactly as PostgreSQL's output functions render them (for
//! `jsonb` that is its canonical text), and are passed through as bytes without re-encoding —
//! except a `bytea` payload (or one of a domain over `bytea`), whose hex text is decoded to its
//! bytes (`payload.rs`); which one it is follows from the column's type OID in the Relation.

use std::borrow::Cow;
use std::sync::Arc;

use crate::config::debezium::DebeziumFormat;
use crate::config::ident::TableName;
use crate::config::outbox::OutboxMapping;
use crate::outbox::bad_event::BadEvent;
use crate::outbox::connect::{ColumnFacts, ConnectLayout, ConnectLayoutError};
use crate::outbox::event::OutboxEvent;
use crate::outbox::payload::{ByteaTypes, PayloadFormat};
use crate::outbox::timestamp::parse_timestamp_ms;
use crate::postgres::pgoutput::{ColumnValue, Relation, TupleData};

/// Positions of the mapped columns in the current Relation of one outbox table.
#[derive(Debug, Clone)]
pub(crate) struct OutboxLayout {
    /// The configured outbox table this Relation is.
    table: TableName,
    id: usize,
    key: usize,
    route_by: usize,
    payload: usize,
    /// From the payload column's type in the Relation: decided once, not per row.
    payload_format: PayloadFormat,
    timestamp: Option<usize>,
    headers: Vec<(usize, String)>,
    /// `[debezium]` placed columns, in `OutboxMapping::placed` order.
    placed: Vec<usize>,
    /// `outbox.trace_column` and `outbox.tracestate_column`.
    traceparent: Option<usize>,
    tracestate: Option<usize>,
    /// `[cloudevents]` extension columns, in `OutboxMapping::extensions` order.
    extensions: Vec<usize>,
    /// `[route]` template columns, in `OutboxMapping::routing_columns` order.
    routing_columns: Vec<usize>,
    /// `[debezium]`: the table's record format, shared by its events.
    connect: Option<Arc<ConnectLayout>>,
}

/// What `[debezium]` needs besides the Relation: the format, and which columns of each outbox
/// table are NOT NULL (a Relation does not say; read from the catalog when the session starts).
#[derive(Debug, Clone)]
pub(crate) struct DebeziumColumns {
    pub(crate) format: DebeziumFormat,
    /// (table, its NOT NULL columns), one entry per configured outbox table.
    pub(crate) not_null: Vec<(TableName, Vec<String>)>,
}

impl DebeziumColumns {
    /// The NOT NULL columns of `table` (none when the session did not read them).
    fn not_null_of(&self, table: &TableName) -> &[String] {
        self.not_null
            .iter()
            .find(|(t, _)| t == table)
            .map_or(&[], |(_, cols)| cols.as_slice())
    }
}

/// The outbox table changed shape in a way the mapping cannot follow.
#[derive(Debug, thiserror::Error)]
pub enum LayoutError {
    #[error(
        "column {column:?} ({config_key}) is no longer in table {table} (it now has: {present}); it was dropped or renamed \
         while the relay was streaming. Restore the column or change {config_key}, then restart"
    )]
    Missing {
        column: String,
        config_key: &'static str,
        table: String,
        present: String,
    },
    #[error(transparent)]
    Debezium(#[from] ConnectLayoutError),
}

impl OutboxLayout {
    /// The layout of `relation`, a Relation of the configured outbox table `table`. `bytea` tells
    /// which column types are binary payloads (`bytea` and the domains over it).
    pub(crate) fn resolve(
        mapping: &OutboxMapping,
        table: &TableName,
        relation: &Relation,
        bytea: &ByteaTypes,
        debezium: Option<&DebeziumColumns>,
    ) -> Result<Self, LayoutError> {
        let find = |col: &crate::config::ident::Ident, config_key: &'static str| {
            relation
                .columns
                .iter()
                .position(|c| c.name == col.as_str())
                .ok_or_else(|| LayoutError::Missing {
                    column: col.as_str().to_owned(),
                    config_key,
                    table: table.to_string(),
                    present: relation
                        .columns
                        .iter()
                        .map(|c| c.name.as_str())
                        .collect::<Vec<_>>()
                        .join(", "),
                })
        };
        let mut headers = Vec::with_capacity(mapping.headers.len());
        for (col, header) in &mapping.headers {
            headers.push((find(col, "outbox.header_columns")?, header.clone()));
        }
        let payload = find(&mapping.payload, "outbox.payload_column")?;
        let payload_format = relation
            .columns
            .get(payload)
            .map_or(PayloadFormat::Text, |c| bytea.format_of(c.type_oid));
        let mut placed = Vec::with_capacity(mapping.placed.len());
        for col in &mapping.placed {
            placed.push(find(col, "debezium.\"table.fields.additional.placement\"")?);
        }
        let connect = match debezium {
            None => None,
            Some(d) => Some(Arc::new(ConnectLayout::new(&d.format, mapping, table, |ident| {
                relation
                    .columns
                    .iter()
                    .find(|c| c.name == ident.as_str())
                    .map(|c| ColumnFacts {
                        // A domain over bytea is a binary payload too.
                        type_oid: if bytea.format_of(c.type_oid) == PayloadFormat::Bytea {
                            17
                        } else {
                            c.type_oid
                        },
                        not_null: d.not_null_of(table).contains(&c.name),
                    })
            })?)),
        };
        Ok(OutboxLayout {
            table: table.clone(),
            id: find(&mapping.id, "outbox.id_column")?,
            key: find(&mapping.key, "outbox.key_column")?,
            route_by: find(&mapping.route_by, "outbox.route_by_column")?,
            payload,
            payload_format,
            timestamp: mapping
                .timestamp
                .as_ref()
                .map(|c| find(c, "outbox.timestamp_column"))
                .transpose()?,
            headers,
            placed,
            connect,
            traceparent: mapping
                .traceparent
                .as_ref()
                .map(|c| find(c, "outbox.trace_column"))
                .transpose()?,
            tracestate: mapping
                .tracestate
                .as_ref()
                .map(|c| find(c, "outbox.tracestate_column"))
                .transpose()?,
            extensions: mapping
                .extensions
                .iter()
                .map(|c| find(c, "cloudevents.extensions"))
                .collect::<Result<_, _>>()?,
            routing_columns: mapping
                .routing_columns
                .iter()
                .map(|(c, key)| find(c, key))
                .collect::<Result<_, _>>()?,
        })
    }

    /// The event of one inserted row, borrowing its values from `tuple` and its header names
    /// from the layout; column names in errors come from `relation`.
    pub(crate) fn extract<'a>(
        &'a self,
        relation: &Relation,
        tuple: &'a TupleData,
    ) -> Result<OutboxEvent<'a>, BadEvent> {
        let column = |idx: usize| {
            relation
                .columns
                .get(idx)
                .map_or_else(|| format!("#{idx}"), |c| c.name.clone())
        };
        let text = |idx: usize, role: &'static str| -> Result<Option<&'a [u8]>, BadEvent> {
            match tuple.columns.get(idx) {
                None => Err(BadEvent::ShortTuple {
                    got: tuple.columns.len(),
                    expected: relation.columns.len(),
                }),
                Some(ColumnValue::Text(b)) => Ok(Some(&b[..])),
                Some(ColumnValue::Null) => Ok(None),
                // Inserts always carry full values; an unchanged-TOAST marker here means the row
                // came from an UPDATE, which the caller never passes in.
                Some(ColumnValue::UnchangedToast) => Ok(None),
                Some(ColumnValue::Binary(_)) => Err(BadEvent::Binary { column: column(idx) }),
            }
            .and_then(|v| match v {
                Some(b) => Ok(Some(b)),
                None if role == "header" => Ok(None),
                None => Err(BadEvent::Null {
                    column: column(idx),
                    role,
                }),
            })
        };
        let id = text(self.id, "event id")?.unwrap_or_default();
        let key = text(self.key, "message key")?.unwrap_or_default();
        let route_raw = text(self.route_by, "route-by value")?.unwrap_or_default();
        let route_value = std::str::from_utf8(route_raw).map_err(|_| BadEvent::NotUtf8 {
            column: relation
                .columns
                .get(self.route_by)
                .map_or_else(String::new, |c| c.name.clone()),
            role: "route-by value",
        })?;
        // Under [debezium] a NULL payload is an event (Debezium writes a null value for it).
        let payload_role = if self.connect.is_some() { "header" } else { "payload" };
        // Text stays borrowed: only a bytea payload is decoded (into one allocation).
        let payload = text(self.payload, payload_role)?
            .map(|t| self.payload_format.value(t, || column(self.payload)))
            .transpose()?;
        let timestamp_ms = match self.timestamp {
            Some(idx) => text(idx, "header")?.and_then(parse_timestamp_ms),
            None => None,
        };
        let mut headers = Vec::with_capacity(self.headers.len());
        for (idx, name) in &self.headers {
            headers.push((Cow::Borrowed(name.as_str()), text(*idx, "header")?.map(Cow::Borrowed)));
        }
        let mut placed = Vec::with_capacity(self.placed.len());
        for idx in &self.placed {
            placed.push(text(*idx, "header")?.map(Cow::Borrowed));
        }
        let optional = |idx: Option<usize>| match idx {
            Some(idx) => text(idx, "header").map(|v| v.map(Cow::Borrowed)),
            None => Ok(None),
        };
        let traceparent = optional(self.traceparent)?;
        let tracestate = optional(self.tracestate)?;
        let mut extensions = Vec::with_capacity(self.extensions.len());
        for idx in &self.extensions {
            extensions.push(text(*idx, "header")?.map(Cow::Borrowed));
        }
        let mut routing_columns = Vec::with_capacity(self.routing_columns.len());
        for idx in &self.routing_columns {
            routing_columns.push(text(*idx, "header")?.map(Cow::Borrowed));
        }
        Ok(OutboxEvent {
            id: Cow::Borrowed(id),
            key: Cow::Borrowed(key),
            route_value: Cow::Borrowed(route_value),
            payload,
            timestamp_ms,
            headers,
            placed,
            connect: self.connect.clone(),
            table: Some(Cow::Borrowed(&self.table)),
            payload_format: self.payload_format,
            commit_time_us: None,
            traceparent,
            tracestate,
            extensions,
            routing_columns,
        })
    }

    /// The outbox table this layout's rows come from.
    pub(crate) fn table(&self) -> &TableName {
        &self.table
    }

    /// The event id of a row [`extract`](Self::extract) refused, best effort, for the error
    /// message: `?` when the id column holds no text.
    pub(crate) fn id_for_error<'a>(&self, tuple: &'a TupleData) -> &'a [u8] {
        match tuple.columns.get(self.id) {
            Some(ColumnValue::Text(b)) => b,
            _ => b"?",
        }
    }
}
