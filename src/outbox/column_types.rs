//! Which column types each mapped outbox column may have, and the one check of the column
//! mapping against a table's columns ([`check_mapping`]): every configured column exists with a
//! usable type. `setup`, `setup --check`, `poll`, `replay` (through preflight) and `run` (before
//! each session streams) make it alike, so a mapping the table does not fit stops before the
//! first event rather than at it.
//!
//! Types are recognised by the OID of the column's base type (domains are resolved to the type
//! they are built on), never by name alone: a user-defined type that happens to be called `text`
//! in some schema must not pass as `pg_catalog.text`. `citext` is an extension type without a
//! fixed OID, so it is recognised by name; its text form is plain text.

use tokio_postgres::types::Type;

use crate::config::ident::{quote_ident, Ident, TableName};
use crate::config::outbox::OutboxMapping;
use crate::postgres::client::CatalogColumn;

/// A configured column the outbox table does not have, or has with a type the relay cannot use
/// there. Fatal: the configuration or the table must change. (`setup`'s `ControlError` carries
/// the same fields and says the same words.)
#[derive(Debug, thiserror::Error)]
pub enum MappingError {
    #[error("{}", not_found(key, column, table, columns))]
    ColumnNotFound {
        key: &'static str,
        column: Ident,
        table: TableName,
        columns: Vec<String>,
    },
    #[error("{}", unusable(key, column, table, type_name, accepted))]
    UnusableType {
        key: &'static str,
        column: Ident,
        // Boxed to keep the error small (clippy::result_large_err).
        table: Box<TableName>,
        type_name: String,
        accepted: &'static str,
    },
}

/// [`MappingError::ColumnNotFound`]'s words.
pub(crate) fn not_found(key: &str, column: &Ident, table: &TableName, columns: &[String]) -> String {
    format!(
        "{key} = {column}, but the outbox table {table} has no such column; its columns are: {}. Fix {key} in the \
         config (double-quote mixed-case names, e.g. '\"AggregateId\"') or add the column \
         (`outbox-relay setup --check` makes this check without streaming)",
        columns.join(", ")
    )
}

/// [`MappingError::UnusableType`]'s words.
pub(crate) fn unusable(key: &str, column: &Ident, table: &TableName, type_name: &str, accepted: &str) -> String {
    format!(
        "{key} = {column}: column {column} of the outbox table {table} has type {type_name}, which the relay cannot \
         use there; accepted: {accepted}. Point {key} at another column or change the column's type"
    )
}

/// Every mapped column of `mapping` ([`OutboxMapping::columns`], with its config key) found in
/// `columns`, `table`'s live columns as the catalog lists them, in the mapping's order; the first
/// one missing or of an unusable type is the error.
pub(crate) fn check_mapping<'c>(
    mapping: &OutboxMapping,
    table: &TableName,
    columns: &'c [CatalogColumn],
) -> Result<Vec<(&'static str, Ident, &'c CatalogColumn)>, MappingError> {
    let mut mapped = Vec::new();
    for (config_key, column) in mapping.columns() {
        let Some(found) = columns.iter().find(|c| c.name == column.as_str()) else {
            return Err(MappingError::ColumnNotFound {
                key: config_key,
                column: column.clone(),
                table: table.clone(),
                columns: columns.iter().map(|c| quote_ident(&c.name)).collect(),
            });
        };
        let role = ColumnRole::for_config_key(config_key);
        if !role.accepts(found.base_oid, &found.base_name, &found.base_kind) {
            return Err(MappingError::UnusableType {
                key: config_key,
                column: column.clone(),
                table: Box::new(table.clone()),
                type_name: found.type_name.clone(),
                accepted: role.accepted(),
            });
        }
        mapped.push((config_key, column.clone(), found));
    }
    Ok(mapped)
}

/// The part of the Kafka record a column feeds, which decides the types it may have.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ColumnRole {
    /// Rendered as text into the `id` header: any type works.
    Id,
    /// The record key: must have a stable, meaningful text form.
    Key,
    /// Fed through the topic router: must be text-like.
    RouteBy,
    /// The record value, sent as bytes.
    Payload,
    /// The record timestamp.
    Timestamp,
    /// Rendered as text into a header: any type works.
    Header,
}

impl ColumnRole {
    /// The role of a column named by a config key of [`crate::config::outbox::OutboxMapping::columns`].
    pub(crate) fn for_config_key(key: &str) -> ColumnRole {
        match key {
            "outbox.id_column" => ColumnRole::Id,
            "outbox.key_column" => ColumnRole::Key,
            "outbox.route_by_column" => ColumnRole::RouteBy,
            "outbox.payload_column" => ColumnRole::Payload,
            "outbox.timestamp_column" => ColumnRole::Timestamp,
            _ => ColumnRole::Header,
        }
    }

    /// The accepted types, as the error message lists them.
    pub(crate) fn accepted(self) -> &'static str {
        match self {
            ColumnRole::Id | ColumnRole::Header => "any type",
            ColumnRole::Key => {
                "text, varchar, char(n), citext, uuid, smallint, integer, bigint (or a domain over one of them)"
            }
            ColumnRole::RouteBy => "text, varchar, char(n), name, citext, an enum type (or a domain over one of them)",
            ColumnRole::Payload => "jsonb, json, text, varchar, bytea (or a domain over one of them)",
            ColumnRole::Timestamp => {
                "timestamp with time zone, timestamp without time zone (or a domain over one of them)"
            }
        }
    }

    /// Whether a column whose base type has this OID, name and `typtype` fits the role.
    pub(crate) fn accepts(self, base_oid: u32, base_name: &str, typtype: &str) -> bool {
        let is = |candidates: &[Type]| candidates.iter().any(|t| t.oid() == base_oid);
        let citext = base_name == "citext";
        match self {
            ColumnRole::Id | ColumnRole::Header => true,
            ColumnRole::Key => {
                citext
                    || is(&[
                        Type::TEXT,
                        Type::VARCHAR,
                        Type::BPCHAR,
                        Type::UUID,
                        Type::INT2,
                        Type::INT4,
                        Type::INT8,
                    ])
            }
            ColumnRole::RouteBy => {
                citext || typtype == "e" || is(&[Type::TEXT, Type::VARCHAR, Type::BPCHAR, Type::NAME])
            }
            ColumnRole::Payload => is(&[Type::JSONB, Type::JSON, Type::TEXT, Type::VARCHAR, Type::BYTEA]),
            ColumnRole::Timestamp => is(&[Type::TIMESTAMPTZ, Type::TIMESTAMP]),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(role: ColumnRole, t: &Type) -> bool {
        role.accepts(t.oid(), t.name(), "b")
    }

    #[test]
    fn payload_takes_json_text_and_bytes_only_key_text_uuid_and_integers() {
        let roles: [(ColumnRole, &[Type], &[Type]); 2] = [
            (
                ColumnRole::Payload,
                &[Type::JSONB, Type::JSON, Type::TEXT, Type::VARCHAR, Type::BYTEA],
                &[Type::INT4, Type::TIMESTAMPTZ, Type::TEXT_ARRAY, Type::XML],
            ),
            (
                ColumnRole::Key,
                &[Type::TEXT, Type::BPCHAR, Type::UUID, Type::INT2, Type::INT8],
                &[Type::JSONB, Type::FLOAT8, Type::NUMERIC, Type::BYTEA],
            ),
        ];
        for (role, taken, refused) in roles {
            for t in taken {
                assert!(ok(role, t), "{role:?} {t}");
            }
            for t in refused {
                assert!(!ok(role, t), "{role:?} {t}");
            }
        }
    }

    #[test]
    fn key_takes_an_extension_type_by_name() {
        assert!(ColumnRole::Key.accepts(99_999, "citext", "b"));
    }

    #[test]
    fn route_by_takes_text_like_and_enums() {
        assert!(ok(ColumnRole::RouteBy, &Type::NAME));
        assert!(ColumnRole::RouteBy.accepts(99_999, "event_type", "e"));
        assert!(!ok(ColumnRole::RouteBy, &Type::UUID));
        assert!(!ok(ColumnRole::RouteBy, &Type::INT4));
    }

    #[test]
    fn a_user_type_named_text_is_not_text() {
        assert!(!ColumnRole::Payload.accepts(99_999, "text", "b"));
    }

    #[test]
    fn timestamp_takes_both_timestamp_types() {
        assert!(ok(ColumnRole::Timestamp, &Type::TIMESTAMPTZ));
        assert!(ok(ColumnRole::Timestamp, &Type::TIMESTAMP));
        assert!(!ok(ColumnRole::Timestamp, &Type::DATE));
        assert!(!ok(ColumnRole::Timestamp, &Type::INT8));
    }

    #[test]
    fn id_and_headers_take_anything() {
        assert!(ok(ColumnRole::Id, &Type::POINT));
        assert_eq!(ColumnRole::for_config_key("outbox.header_columns"), ColumnRole::Header);
        assert_eq!(ColumnRole::for_config_key("outbox.payload_column"), ColumnRole::Payload);
    }
}
