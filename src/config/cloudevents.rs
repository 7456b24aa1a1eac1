//! `[cloudevents]`: events written as CloudEvents 1.0 (Kafka protocol binding), binary or
//! structured mode, validated into [`CloudEventsSettings`].
//!
//! Off unless the section is present. Everything per event that can be decided from the
//! configuration is decided here, once: the `source` of each outbox table (and of logical
//! messages), the extension attributes' header names. Invariant: every extension name is a legal
//! CloudEvents attribute name (lower-case `a-z0-9`) and none is a core attribute or a
//! distributed-tracing one (those come from `[outbox] trace_column`), so rendering never has to
//! check a name; the section is refused with `[debezium]` (another record format) and where no
//! binding is implemented: Kafka takes both modes (its protocol binding), NATS the structured mode
//! (its binding has no other), Redis both with the Kafka binding's names as stream fields (Redis
//! has no binding), RabbitMQ both (the AMQP binding; its adapter maps the names).

use std::collections::BTreeMap;

use serde::Deserialize;

use crate::config::ident::{Ident, TableName};
use crate::config::sink::SinkSectionSpec;
use crate::config::{named, ConfigError};

/// The attributes the relay writes itself: an extension of the same name would collide.
const RESERVED: &[&str] = &[
    "specversion",
    "id",
    "source",
    "type",
    "subject",
    "time",
    "datacontenttype",
    "data",
    "traceparent",
    "tracestate",
];

/// The CloudEvents spec: attribute names SHOULD NOT exceed 20 characters.
pub(crate) const RECOMMENDED_NAME_LEN: usize = 20;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct CloudEventsSection {
    #[serde(default)]
    pub(crate) mode: CloudEventsMode,
    pub(crate) source: Option<String>,
    pub(crate) content_type: Option<String>,
    /// Attribute name → column.
    #[serde(default)]
    pub(crate) extensions: BTreeMap<String, String>,
}

/// The Kafka protocol binding's content modes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CloudEventsMode {
    /// The value stays the payload; attributes are `ce_*` headers.
    #[default]
    Binary,
    /// The value is an `application/cloudevents+json` envelope holding attributes and data.
    Structured,
}

/// One extension attribute read from a column.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Extension {
    /// The attribute name (`tenant`).
    pub(crate) name: String,
    /// Its binary-mode header (`ce_tenant`), made once so records borrow it.
    pub(crate) header: String,
    pub(crate) column: Ident,
}

/// `[cloudevents]`, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CloudEventsSettings {
    pub(crate) mode: CloudEventsMode,
    /// The `source` of each outbox table's events, in `outbox.tables` order.
    pub(crate) table_sources: Vec<(TableName, String)>,
    /// The `source` of logical-message events (no table).
    pub(crate) message_source: String,
    /// Configured `datacontenttype`; `None`: derived per event from the payload.
    pub(crate) content_type: Option<String>,
    /// In name order (each once).
    pub(crate) extensions: Vec<Extension>,
}

impl CloudEventsSettings {
    /// The `source` of an event of `table` (`None`: a logical message).
    pub(crate) fn source_of(&self, table: Option<&TableName>) -> &str {
        table
            .and_then(|t| self.table_sources.iter().find(|(name, _)| name == t))
            .map_or(self.message_source.as_str(), |(_, source)| source.as_str())
    }

    /// Extension names longer than the spec recommends, for a start warning.
    pub(crate) fn long_names(&self) -> Vec<&str> {
        self.extensions
            .iter()
            .map(|e| e.name.as_str())
            .filter(|n| n.len() > RECOMMENDED_NAME_LEN)
            .collect()
    }
}

/// What the section needs from the rest of the configuration.
pub(crate) struct Context<'a> {
    pub(crate) sink: &'a dyn SinkSectionSpec,
    pub(crate) debezium: bool,
    /// The database the relay reads (the default `source`'s second segment).
    pub(crate) database: &'a str,
    pub(crate) tables: &'a [TableName],
    pub(crate) message_prefix: Option<&'a str>,
}

impl CloudEventsSection {
    pub(crate) fn validate(self, cx: &Context<'_>) -> Result<CloudEventsSettings, ConfigError> {
        if cx.debezium {
            return Err(ConfigError::Invalid {
                key: "cloudevents",
                message: "is set together with [debezium]: a record is either Debezium's format or a CloudEvent, \
                          not both. Remove one of the two sections"
                    .into(),
            });
        }
        cx.sink
            .cloudevents_mode(self.mode)
            .map_err(|message| ConfigError::Invalid {
                key: "cloudevents.mode",
                message,
            })?;
        let table_sources = match &self.source {
            Some(s) if s.trim().is_empty() || s.chars().any(char::is_control) => {
                return Err(ConfigError::Invalid {
                    key: "cloudevents.source",
                    message: format!(
                        "{s:?} is not a usable source (a non-empty URI-reference); remove the key for the default \
                         \"/outbox-relay/<database>/<schema>.<table>\", or set e.g. \"/orders-service\""
                    ),
                })
            }
            Some(s) => cx.tables.iter().map(|t| (t.clone(), s.clone())).collect(),
            None => cx
                .tables
                .iter()
                .map(|t| {
                    (
                        t.clone(),
                        format!(
                            "/outbox-relay/{}/{}.{}",
                            cx.database,
                            t.schema.as_str(),
                            t.name.as_str()
                        ),
                    )
                })
                .collect(),
        };
        let message_source = self.source.clone().unwrap_or_else(|| {
            format!(
                "/outbox-relay/{}/{}",
                cx.database,
                cx.message_prefix.unwrap_or("messages")
            )
        });
        if let Some(ct) = &self.content_type {
            if ct.trim().is_empty() || !ct.contains('/') || ct.chars().any(|c| c.is_control() || !c.is_ascii()) {
                return Err(ConfigError::Invalid {
                    key: "cloudevents.content_type",
                    message: format!(
                        "{ct:?} is not a media type (type/subtype, ASCII); remove the key to derive it from the \
                         payload column (application/json, or application/octet-stream for bytea), or set e.g. \
                         \"application/json\""
                    ),
                });
            }
        }
        let mut extensions = Vec::with_capacity(self.extensions.len());
        for (name, column) in &self.extensions {
            check_extension_name(name)?;
            extensions.push(Extension {
                name: name.clone(),
                header: format!("ce_{name}"),
                column: Ident::parse("cloudevents.extensions", column).map_err(named("cloudevents.extensions"))?,
            });
        }
        Ok(CloudEventsSettings {
            mode: self.mode,
            table_sources,
            message_source,
            content_type: self.content_type,
            extensions,
        })
    }
}

/// A CloudEvents attribute name: lower-case ASCII letters and digits, not one the relay writes.
fn check_extension_name(name: &str) -> Result<(), ConfigError> {
    if name.is_empty() || !name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit()) {
        let suggestion: String = name
            .chars()
            .filter(char::is_ascii_alphanumeric)
            .map(|c| c.to_ascii_lowercase())
            .collect();
        return Err(ConfigError::Invalid {
            key: "cloudevents.extensions",
            message: format!(
                "{name:?} is not a CloudEvents attribute name: only lower-case letters a-z and digits 0-9 are \
                 allowed (no '_', '-' or upper case){}",
                if suggestion.is_empty() {
                    String::new()
                } else {
                    format!("; rename it, e.g. {suggestion:?}")
                }
            ),
        });
    }
    if RESERVED.contains(&name) {
        let fix = if name.starts_with("trace") {
            "the distributed-tracing attributes come from [outbox] trace_column and tracestate_column"
        } else {
            "the relay writes that attribute itself; choose another name"
        };
        return Err(ConfigError::Invalid {
            key: "cloudevents.extensions",
            message: format!("{name:?} is a CloudEvents attribute the relay sets: {fix}"),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::config::test_support::{load, refusal, settings};

    use super::*;

    #[test]
    fn off_by_default_and_defaults_when_present() {
        assert_eq!(settings("").cloudevents, None);
        let s = settings(
            "[outbox]\ntable = [\"sales.outbox\", \"billing.outbox\"]\nmessage_prefix = \"orders\"\n[cloudevents]\n",
        );
        let ce = s.cloudevents.unwrap();
        assert_eq!(ce.mode, CloudEventsMode::Binary);
        assert_eq!(
            ce.source_of(Some(&s.outbox.tables[0])),
            "/outbox-relay/app/sales.outbox"
        );
        assert_eq!(
            ce.source_of(Some(&s.outbox.tables[1])),
            "/outbox-relay/app/billing.outbox"
        );
        assert_eq!(ce.source_of(None), "/outbox-relay/app/orders");
        assert_eq!(ce.content_type, None);
        let plain = settings("[cloudevents]\nmode = \"structured\"\n").cloudevents.unwrap();
        assert_eq!(plain.source_of(None), "/outbox-relay/app/messages");
        assert_eq!(plain.mode, CloudEventsMode::Structured);
    }

    #[test]
    fn configured_source_content_type_and_extensions() {
        let s = settings(
            "[cloudevents]\nsource = \"/orders\"\ncontent_type = \"application/avro\"\n\
             extensions = { tenant = \"tenant_id\", region2 = \"Region\" }\n",
        );
        let ce = s.cloudevents.unwrap();
        assert_eq!(ce.source_of(Some(&s.outbox.tables[0])), "/orders");
        assert_eq!(ce.source_of(None), "/orders");
        assert_eq!(ce.content_type.as_deref(), Some("application/avro"));
        let names: Vec<_> = ce
            .extensions
            .iter()
            .map(|e| (e.name.as_str(), e.header.as_str()))
            .collect();
        assert_eq!(names, [("region2", "ce_region2"), ("tenant", "ce_tenant")]);
        // The extension columns are read like every mapped column.
        let keys: Vec<_> = s
            .outbox
            .columns()
            .iter()
            .map(|(k, c)| (*k, c.as_str().to_owned()))
            .collect();
        assert!(
            keys.contains(&("cloudevents.extensions", "tenant_id".to_owned())),
            "{keys:?}"
        );
    }

    #[test]
    fn invalid_names_are_refused_naming_the_key_and_the_fix() {
        let err = |extra: &str| refusal(extra, &[]);
        let e = err("[cloudevents]\nextensions = { Tenant_Id = \"t\" }\n");
        assert!(
            e.contains("cloudevents.extensions") && e.contains("\"Tenant_Id\"") && e.contains("\"tenantid\""),
            "{e}"
        );
        let e = err("[cloudevents]\nextensions = { subject = \"s\" }\n");
        assert!(e.contains("the relay writes that attribute itself"), "{e}");
        let e = err("[cloudevents]\nextensions = { traceparent = \"s\" }\n");
        assert!(e.contains("trace_column"), "{e}");
        let e = err("[cloudevents]\nmode = \"json\"\n");
        assert!(e.contains("binary") && e.contains("structured"), "{e}");
        let e = err("[cloudevents]\nsource = \"\"\n");
        assert!(e.contains("cloudevents.source"), "{e}");
        let e = err("[cloudevents]\ncontent_type = \"json\"\n");
        assert!(e.contains("cloudevents.content_type"), "{e}");
        let e = err("[cloudevents]\nformat = \"binary\"\n");
        assert!(e.contains("unknown field `format`"), "{e}");
    }

    #[test]
    fn refused_with_debezium_and_where_the_sink_has_no_such_mode() {
        let e = refusal("[cloudevents]\n[debezium]\n", &[]);
        assert!(e.contains("[debezium]") && e.contains("Remove one"), "{e}");
        let with_sink = |sink: &str, mode: &str| {
            let text = format!(
                "[postgres]\nurl = \"postgres://u@h/app\"\n[sink]\nkind = \"{sink}\"\n{}\n[cloudevents]\nmode = \"{mode}\"\n",
                match sink {
                    "redis" => "[redis]\nurl = \"redis://127.0.0.1\"",
                    "nats" => "[nats]\nurl = \"nats://127.0.0.1:4222\"\nstream = \"OUTBOX\"",
                    _ => "[rabbitmq]\nurl = \"amqp://g:g@127.0.0.1:5672/%2f\"\nexchange = \"outbox\"",
                }
            );
            crate::config::Settings::from_toml_str(&text, std::path::Path::new("t.toml"), Vec::new())
        };
        for mode in ["binary", "structured"] {
            assert!(with_sink("rabbitmq", mode).unwrap().cloudevents.is_some());
            assert!(with_sink("redis", mode).unwrap().cloudevents.is_some());
        }
        assert!(with_sink("nats", "structured").unwrap().cloudevents.is_some());
        let e = with_sink("nats", "binary").unwrap_err().to_string();
        assert!(
            e.contains("cloudevents.mode") && e.contains("mode = \"structured\""),
            "{e}"
        );
    }

    #[test]
    fn header_columns_may_not_take_the_names_the_relay_writes() {
        let e = refusal(
            "[outbox]\nheader_columns = { kind = \"ce_type\" }\n[cloudevents]\n",
            &[],
        );
        assert!(e.contains("outbox.header_columns") && e.contains("extensions"), "{e}");
        let e = refusal(
            "[outbox]\nheader_columns = { ct = \"Content-Type\" }\n[cloudevents]\n",
            &[],
        );
        assert!(e.contains("\"Content-Type\""), "{e}");
        assert!(load("[outbox]\nheader_columns = { kind = \"ce_type\" }\n", &[]).is_ok());
        let e = refusal(
            "[outbox]\ntrace_column = \"tp\"\nheader_columns = { tp2 = \"traceparent\" }\n",
            &[],
        );
        assert!(e.contains("outbox.trace_column writes"), "{e}");
    }

    #[test]
    fn a_tracestate_column_needs_a_trace_column() {
        let e = refusal("[outbox]\ntracestate_column = \"ts\"\n", &[]);
        assert!(
            e.contains("outbox.tracestate_column") && e.contains("trace_column too"),
            "{e}"
        );
        let s = settings("[outbox]\ntrace_column = \"tp\"\ntracestate_column = \"ts\"\n");
        let keys: Vec<_> = s.outbox.columns().iter().map(|(k, c)| (*k, c.as_str())).collect();
        assert_eq!(
            &keys[4..],
            [("outbox.trace_column", "tp"), ("outbox.tracestate_column", "ts")]
        );
    }

    #[test]
    fn the_environment_can_turn_it_on_and_set_extensions() {
        let s = load(
            "",
            &[
                ("OUTBOX_RELAY__CLOUDEVENTS__MODE", "structured"),
                ("OUTBOX_RELAY__CLOUDEVENTS__EXTENSIONS", "{ tenant = \"tenant_id\" }"),
            ],
        )
        .unwrap();
        let ce = s.cloudevents.unwrap();
        assert_eq!(ce.mode, CloudEventsMode::Structured);
        assert_eq!(ce.extensions[0].column.as_str(), "tenant_id");
    }

    #[test]
    fn long_names_are_warned_about_not_refused() {
        let s = settings("[cloudevents]\nextensions = { averyveryverylongname1 = \"c\" }\n");
        let warnings = s.start_warnings();
        assert!(
            warnings
                .iter()
                .any(|w| w.contains("averyveryverylongname1") && w.contains("20")),
            "{warnings:?}"
        );
    }
}
