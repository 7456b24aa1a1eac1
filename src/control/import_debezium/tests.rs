//! Unit tests of `import-debezium`: Debezium's documented example connector configs (REST JSON
//! and `.properties`), legacy EventRouter names, and every unsupported option listed with why.

use std::path::{Path, PathBuf};

use super::{convert, ImportError};
use crate::config::Settings;

/// The imported TOML for a connector config given as text.
fn import(name: &str, text: &str) -> String {
    match convert(Path::new(name), text.as_bytes()) {
        Ok(report) => report.toml,
        Err(e) => panic!("import of {name} failed: {e}"),
    }
}

fn import_err(name: &str, text: &str) -> String {
    match convert(Path::new(name), text.as_bytes()) {
        Ok(report) => panic!("import of {name} should fail, produced:\n{}", report.toml),
        Err(e) => e.to_string(),
    }
}

/// The import of `text` as `name` fails, its message naming each of `needles`.
fn assert_refused(name: &str, text: &str, needles: &[&str]) {
    let e = import_err(name, text);
    for needle in needles {
        assert!(e.contains(needle), "{needle:?} missing from: {e}");
    }
}

/// The imported file as TOML data (it must parse).
fn data(toml_text: &str) -> toml::Table {
    toml_text
        .parse()
        .unwrap_or_else(|e| panic!("not valid TOML: {e}\n{toml_text}"))
}

/// Loads the imported file as the relay would; it must be accepted.
fn load(text: &str) -> Settings {
    let from = |t: &str| Settings::from_toml_str(t, Path::new("imported.toml"), std::iter::empty());
    from(text).unwrap_or_else(|e| panic!("not accepted: {e}\n{text}"))
}

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/debezium")
        .join(name)
}

fn debezium(toml_text: &str) -> toml::Table {
    data(toml_text)["debezium"].as_table().cloned().unwrap_or_default()
}

/// The "Not carried over" comment lines, as "option: reason".
fn not_carried_over(toml_text: &str) -> Vec<String> {
    toml_text
        .split("# Not carried over")
        .nth(1)
        .unwrap_or("")
        .lines()
        .skip(1)
        .map(|l| l.trim_start_matches('#').trim().to_owned())
        .collect()
}

/// No note starts with `prefix`.
fn assert_unlisted(notes: &[String], prefix: &str) {
    assert!(!notes.iter().any(|n| n.starts_with(prefix)), "{notes:#?}");
}

fn listed<'a>(notes: &'a [String], option: &str) -> &'a str {
    notes
        .iter()
        .find(|n| n.starts_with(&format!("{option}:")))
        .unwrap_or_else(|| panic!("{option} is not listed among {notes:#?}"))
}

const BASE: &str = "connector.class=io.debezium.connector.postgresql.PostgresConnector\n\
database.hostname=db.example\n\
database.user=relay\n\
database.dbname=app\n\
plugin.name=pgoutput\n\
table.include.list=public.outbox\n\
transforms=outbox\n\
transforms.outbox.type=io.debezium.transforms.outbox.EventRouter\n";

fn with_base(extra: &str) -> String {
    format!("{BASE}{extra}")
}

/// The imported file as TOML data, its `[sink] kind` checked to be `kind`.
fn sink_data(imported: &str, kind: &str) -> toml::Table {
    let t = data(imported);
    assert_eq!(t["sink"]["kind"].as_str(), Some(kind), "{imported}");
    t
}

/// The import of a Debezium Server `application.properties`: [`SERVER_BASE`] and `extra`.
fn import_server(extra: &str) -> String {
    import("application.properties", &format!("{SERVER_BASE}{extra}"))
}

/// The import of [`BASE`] and `extra` (it must succeed).
fn import_with(extra: &str) -> String {
    import("c.properties", &with_base(extra))
}

// ------------------------------------------------------------------ properties syntax

#[test]
fn properties_syntax_follows_java_properties_load() {
    let text = "# a comment\n\
                ! another comment\n\
                \n\
                name : my-connector\n\
                spaced   value with spaces  \n\
                key\\ with\\ spaces=v\n\
                escaped\\=key=a\\=b\\:c\n\
                tabs=\\tx\\u0041\\u00e9\n\
                long=first,\\\n    second,\\\n\tthird\n\
                even=ends with two\\\\\n\
                next=line\r\n\
                dup=1\n\
                dup=2\n\
                empty=\n\
                bare\n";
    let config = super::parse::parse(Path::new("c.properties"), text.as_bytes()).unwrap();
    let o = &config.options;
    assert_eq!(config.name.as_deref(), Some("my-connector"));
    assert_eq!(o["spaced"], "value with spaces  ");
    assert_eq!(o["key with spaces"], "v");
    assert_eq!(o["escaped=key"], "a=b:c");
    assert_eq!(o["tabs"], "\txAé");
    assert_eq!(o["long"], "first,second,third");
    assert_eq!(o["even"], "ends with two\\");
    assert_eq!(o["next"], "line");
    assert_eq!(o["dup"], "2");
    assert_eq!(o["empty"], "");
    assert_eq!(o["bare"], "");
    assert!(!o.keys().any(|k| k.contains("comment")), "{o:?}");
    assert_eq!(o.len(), 11, "{o:?}");
}

#[test]
fn a_malformed_unicode_escape_names_the_file_and_line() {
    assert_refused(
        "conn.properties",
        "connector.class=x\n# fine\nbad=\\u12g4\n",
        &["conn.properties, line 3", "\\uXXXX"],
    );
}

#[test]
fn a_continued_line_reports_its_first_line() {
    assert_refused("conn.properties", "a=1\nb=one\\\n  two \\u00\n", &["line 2"]);
}

// ------------------------------------------------------------------ JSON

#[test]
fn json_rest_body_and_bare_config_give_the_same_file() {
    let options = r#""connector.class": "io.debezium.connector.postgresql.PostgresConnector",
        "database.hostname": "db", "database.port": 5433, "database.user": "u", "database.dbname": "d",
        "plugin.name": "pgoutput", "table.include.list": "public.outbox",
        "transforms": "outbox", "transforms.outbox.type": "io.debezium.transforms.outbox.EventRouter",
        "transforms.outbox.table.expand.json.payload": true"#;
    let wrapped = import("c.json", &format!(r#"{{"name": "orders", "config": {{{options}}}}}"#));
    let bare = import("c.json", &format!("{{{options}}}"));
    assert!(wrapped.contains("connector \"orders\""), "{wrapped}");
    // Apart from the header comment naming the connector, the two are the same.
    let body = |t: &str| t.lines().skip(3).collect::<Vec<_>>().join("\n");
    assert_eq!(body(&wrapped), body(&bare));
    let d = data(&bare);
    assert_eq!(d["postgres"]["url"].as_str(), Some("postgres://u@db:5433/d"));
    // A JSON boolean is the boolean it says.
    assert_eq!(debezium(&bare)["table.expand.json.payload"].as_bool(), Some(true));
}

#[test]
fn malformed_json_names_the_file_and_line() {
    assert_refused(
        "conn.json",
        "{\n  \"name\": \"x\",\n  \"config\": {\"a\": }\n}\n",
        &["conn.json, line 3", "not valid JSON"],
    );
    assert_refused(
        "conn.json",
        r#"{"config": {"transforms": ["outbox"]}}"#,
        &["\"transforms\" is a JSON array"],
    );
}

// ------------------------------------------------------------------ what is not importable

#[test]
fn another_connector_class_is_refused_by_name() {
    assert_refused(
        "mysql.properties",
        &BASE.replace(
            "io.debezium.connector.postgresql.PostgresConnector",
            "io.debezium.connector.mysql.MySqlConnector",
        ),
        &["mysql.properties", "\"io.debezium.connector.mysql.MySqlConnector\""],
    );
}

#[test]
fn a_config_without_event_router_is_refused_naming_its_transforms() {
    let text = BASE.replace("transforms=outbox", "transforms=unwrap, route").replace(
        "transforms.outbox.type=io.debezium.transforms.outbox.EventRouter",
        "transforms.unwrap.type=io.debezium.transforms.ExtractNewRecordState",
    );
    assert_refused(
        "c.properties",
        &text,
        &[
            "no Outbox EventRouter",
            "unwrap (io.debezium.transforms.ExtractNewRecordState)",
            "route (no type)",
        ],
    );
}

#[test]
fn the_postgresql_connector_docs_example_has_no_event_router() {
    let e = super::import_debezium(&fixture("postgresql-connector-docs.json")).unwrap_err();
    assert!(matches!(e, ImportError::Unsupported(_)));
    let e = e.to_string();
    assert!(e.contains("postgresql-connector-docs.json"), "{e}");
    assert!(e.contains("`transforms` is not set"), "{e}");
}

#[test]
fn several_tables_map_to_a_list_and_a_pattern_is_refused() {
    let out = import(
        "c.properties",
        &BASE.replace(
            "public.outbox",
            "sales.outbox, Billing.OutBox,public.outbox,sales.outbox",
        ),
    );
    let d = data(&out);
    let tables: Vec<&str> = d["outbox"]["table"]
        .as_array()
        .expect("several tables are written as a list")
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    // In Debezium's order, exact names quoted, a repeated entry once.
    assert_eq!(tables, ["sales.outbox", "\"Billing\".\"OutBox\"", "public.outbox"]);
    let settings = load(&out);
    let quoted: Vec<String> = settings.outbox.tables.iter().map(|t| t.quoted()).collect();
    assert_eq!(
        quoted,
        [r#""sales"."outbox""#, r#""Billing"."OutBox""#, r#""public"."outbox""#]
    );

    // One table stays a plain string, as before lists existed.
    let one = data(&import("c.properties", BASE));
    assert_eq!(one["outbox"]["table"].as_str(), Some("public.outbox"));

    for pattern in [
        "public.outbox_.*",
        "(sales|billing)\\.outbox",
        "sales.outbox,billing\\.outbox[0-9]",
    ] {
        let e = import_err("c.properties", &BASE.replace("public.outbox", pattern));
        assert!(
            e.contains("is a pattern") && e.contains("replace it with the tables it matches"),
            "{pattern}: {e}"
        );
    }
    assert_refused(
        "c.properties",
        &BASE.replace("public.outbox", "a.b.c"),
        &["is not schema.table"],
    );
    assert_refused("c.properties", &BASE.replace("public.outbox", " , "), &["is empty"]);
}

// ------------------------------------------------------------------ mapping

#[test]
fn debezium_defaults_are_written_out_not_left_to_the_relay() {
    let out = import("c.properties", BASE);
    let d = data(&out);
    let outbox = d["outbox"].as_table().unwrap();
    assert_eq!(outbox["table"].as_str(), Some("public.outbox"));
    assert_eq!(outbox["id_column"].as_str(), Some("id"));
    assert_eq!(outbox["key_column"].as_str(), Some("aggregateid"));
    assert_eq!(outbox["route_by_column"].as_str(), Some("aggregatetype"));
    assert_eq!(outbox["payload_column"].as_str(), Some("payload"));
    assert!(!outbox.contains_key("timestamp_column"));
    assert_eq!(d["route"]["topic_regex"].as_str(), Some("(?<routedByValue>.*)"));
    assert_eq!(
        d["route"]["topic_replacement"].as_str(),
        Some("outbox.event.${routedByValue}")
    );
    let dbz = debezium(&out);
    // Kafka Connect's worker defaults, written out because they decide the record bytes.
    assert_eq!(
        dbz["key.converter"].as_str(),
        Some("org.apache.kafka.connect.json.JsonConverter")
    );
    assert_eq!(dbz["value.converter.schemas.enable"].as_bool(), Some(true));
    assert_eq!(dbz["table.expand.json.payload"].as_bool(), Some(false));
    assert_eq!(dbz["route.tombstone.on.empty.payload"].as_bool(), Some(false));
    assert_eq!(dbz["table.json.payload.null.behavior"].as_str(), Some("ignore"));
    assert!(
        out.contains("key.converter is not set in the connector config: Kafka Connect's worker default"),
        "{out}"
    );

    let settings = load(&out);
    assert_eq!(settings.outbox.key.as_str(), "aggregateid");
    assert_eq!(settings.outbox.route_by.as_str(), "aggregatetype");
    assert_eq!(settings.router.route("order"), "outbox.event.order");
    assert_eq!(settings.postgres.slot.as_str(), "debezium");
    assert_eq!(settings.postgres.publication.as_str(), "dbz_publication");
}

#[test]
fn explicit_event_router_options_are_mapped() {
    let out = import_with(
        "transforms.outbox.table.field.event.id=event_id\n\
             transforms.outbox.table.field.event.key=aggregate_id\n\
             transforms.outbox.table.field.event.payload=body\n\
             transforms.outbox.table.field.event.timestamp=created_at\n\
             transforms.outbox.route.by.field=destination\n\
             transforms.outbox.route.topic.regex=(?<routedByValue>[^.]+)\\\\..*\n\
             transforms.outbox.route.topic.replacement=events.$1\n\
             key.converter=org.apache.kafka.connect.storage.StringConverter\n\
             value.converter=io.debezium.converters.BinaryDataConverter\n",
    );
    let settings = load(&out);
    let m = &settings.outbox;
    let cols: Vec<&str> = [&m.id, &m.key, &m.payload, &m.route_by]
        .iter()
        .map(|i| i.as_str())
        .collect();
    assert_eq!(cols, ["event_id", "aggregate_id", "body", "destination"]);
    assert_eq!(m.timestamp.as_ref().map(|t| t.as_str()), Some("created_at"));
    // Java's `$1` becomes `${1}`; the regex is the same.
    assert_eq!(data(&out)["route"]["topic_replacement"].as_str(), Some("events.${1}"));
    assert_eq!(settings.router.route("order.placed"), "events.order");
    let dbz = debezium(&out);
    assert_eq!(
        dbz["key.converter"].as_str(),
        Some("org.apache.kafka.connect.storage.StringConverter")
    );
    // schemas.enable only accompanies the JsonConverter (or an explicit setting).
    assert!(!dbz.contains_key("key.converter.schemas.enable"), "{dbz:?}");
    assert_eq!(
        dbz["value.converter"].as_str(),
        Some("io.debezium.converters.BinaryDataConverter")
    );
}

#[test]
fn legacy_event_router_names_are_understood() {
    let out = import(
        "c.properties",
        &with_base(
            "table.whitelist=inventory.outboxevent\n\
             transforms.outbox.table.field.payload=body\n\
             transforms.outbox.table.field.payload.id=aggregate_key\n\
             transforms.outbox.table.field.event.type=event_type\n\
             transforms.outbox.table.field.schema.version=schema_version\n\
             transforms.outbox.debezium.op.invalid.behavior=fatal\n\
             transforms.outbox.tracing.span.context.field=tracingspancontext\n",
        )
        .replace("table.include.list=public.outbox\n", ""),
    );
    let settings = load(&out);
    assert_eq!(settings.outbox.tables[0].quoted(), r#""inventory"."outboxevent""#);
    assert_eq!(settings.outbox.payload.as_str(), "body");
    // Debezium 1.x keyed records by the payload id when table.field.event.key was unset.
    assert_eq!(settings.outbox.key.as_str(), "aggregate_key");
    let headers: Vec<(&str, &str)> = settings
        .outbox
        .headers
        .iter()
        .map(|(c, h)| (c.as_str(), h.as_str()))
        .collect();
    assert_eq!(headers, [("event_type", "eventType")]);
    let notes = not_carried_over(&out);
    assert!(listed(&notes, "transforms.outbox.table.field.schema.version").contains("Connect schema versions"));
    assert!(listed(&notes, "transforms.outbox.debezium.op.invalid.behavior").contains("not even decoded"));
    assert!(listed(&notes, "transforms.outbox.tracing.span.context.field").contains("outbox.trace_column"));
    assert_unlisted(&notes, "transforms.outbox.table.field.payload");
}

#[test]
fn the_payload_id_is_no_key_when_the_event_key_is_set() {
    let out = import_with(
        "transforms.outbox.table.field.event.key=k\ntransforms.outbox.table.field.event.payload.id=aggregateid\n",
    );
    assert_eq!(load(&out).outbox.key.as_str(), "k");
    let notes = not_carried_over(&out);
    assert!(listed(&notes, "transforms.outbox.table.field.event.payload.id").contains("envelope"));
}

#[test]
fn additional_placements_are_kept_verbatim_in_the_debezium_section() {
    let placement = "eventType:header:type, tenant:header,version:envelope:v,shard:partition";
    let out = import_with(&format!(
        "topic.prefix=shop\ntransforms.outbox.table.fields.additional.placement={placement}\n"
    ));
    let settings = load(&out);
    // [debezium] writes the placed headers (converted as Connect converts them), not header_columns.
    assert!(settings.outbox.headers.is_empty(), "{:?}", settings.outbox.headers);
    let format = settings.debezium.as_ref().expect("[debezium]");
    let placed: Vec<(&str, &str)> = format
        .additional
        .iter()
        .map(|f| (f.column.as_str(), f.alias.as_str()))
        .collect();
    assert_eq!(
        placed,
        [
            ("eventType", "type"),
            ("tenant", "tenant"),
            ("version", "v"),
            ("shard", "shard")
        ]
    );
    assert_eq!(format.topic_prefix.as_deref(), Some("shop"));
    let dbz = debezium(&out);
    assert_eq!(dbz["table.fields.additional.placement"].as_str(), Some(placement));
    let notes = not_carried_over(&out);
    assert_unlisted(&notes, "transforms.outbox.table.fields.additional.placement:");
}

#[test]
fn the_password_is_never_written() {
    for password in ["s3cr3t-Pw!", "${file:/opt/connect/secrets.properties:db-password}"] {
        let out = import_with(&format!(
            "database.password={password}\ndatabase.port=6432\ndatabase.sslmode=require\n"
        ));
        assert!(!out.contains(password), "{out}");
        assert!(!out.contains("s3cr3t") && !out.contains("secrets.properties"), "{out}");
        assert!(out.contains("OUTBOX_RELAY__POSTGRES__URL"), "{out}");
        assert_eq!(
            data(&out)["postgres"]["url"].as_str(),
            Some("postgres://relay@db.example:6432/app?sslmode=require")
        );
        load(&out);
    }
    let out = import("c.properties", &with_base("database.password=${file:/x:pw}\n"));
    assert!(out.contains("config provider"), "{out}");
}

#[test]
fn an_unsupported_converter_is_listed_not_written() {
    let out = import_with(
        "value.converter=io.confluent.connect.avro.AvroConverter\n\
             value.converter.schema.registry.url=http://registry:8081\n",
    );
    let dbz = debezium(&out);
    // The column's own text instead (StringConverter), and the note says so.
    assert_eq!(
        dbz["value.converter"].as_str(),
        Some("org.apache.kafka.connect.storage.StringConverter"),
        "{dbz:?}"
    );
    assert!(!dbz.contains_key("value.converter.schemas.enable"), "{dbz:?}");
    assert!(dbz.contains_key("key.converter"), "{dbz:?}");
    let notes = not_carried_over(&out);
    let why = listed(&notes, "value.converter");
    assert!(
        why.contains("AvroConverter is not supported") && why.contains("the column's own text"),
        "{why}"
    );
    assert!(listed(&notes, "value.converter.schema.registry.url").contains("value converter"));
    load(&out);
}

#[test]
fn options_without_counterpart_are_listed_with_their_reason() {
    let out = import_with(
        "tasks.max=1\n\
             snapshot.mode=initial\n\
             snapshot.fetch.size=1000\n\
             decimal.handling.mode=string\n\
             heartbeat.interval.ms=10000\n\
             errors.tolerance=all\n\
             offset.flush.interval.ms=60000\n\
             slot.drop.on.stop=true\n\
             publication.autocreate.mode=filtered\n\
             transforms.outbox.predicate=isOutbox\n\
             producer.override.bootstrap.servers=kafka:9092\n\
             producer.override.compression.type=zstd\n\
             producer.override.sasl.jaas.config=secret-jaas\n\
             some.future.option=x\n",
    );
    let notes = not_carried_over(&out);
    assert!(listed(&notes, "tasks.max").contains("one process"));
    assert!(listed(&notes, "snapshot.mode").contains("setup --backfill"));
    assert!(listed(&notes, "snapshot.fetch.size").contains("no table snapshot"));
    assert!(listed(&notes, "decimal.handling.mode").contains("PostgreSQL's own text rendering"));
    assert!(listed(&notes, "errors.tolerance").contains("relay.on_bad_event"));
    assert!(listed(&notes, "offset.flush.interval.ms").contains("confirmed_flush_lsn"));
    assert!(listed(&notes, "slot.drop.on.stop").contains("teardown --yes"));
    assert!(listed(&notes, "publication.autocreate.mode").contains("publish = 'insert'"));
    assert!(listed(&notes, "transforms.outbox.predicate").contains("outbox table only"));
    assert!(listed(&notes, "producer.override.sasl.jaas.config").contains("librdkafka"));
    assert!(listed(&notes, "some.future.option").contains("no counterpart"));
    assert!(!out.contains("secret-jaas"), "{out}");
    let settings = load(&out);
    assert_eq!(
        settings.relay.heartbeat_interval,
        Some(std::time::Duration::from_secs(10))
    );
    assert_eq!(settings.kafka().0["bootstrap.servers"], "kafka:9092");
    assert_eq!(settings.kafka().0["compression.type"], "zstd");
}

#[test]
fn a_java_only_regex_is_written_commented_out_with_the_reason() {
    let out = import_with(
        "transforms.outbox.route.topic.regex=(?<routedByValue>(?!internal).*)\n\
             transforms.outbox.route.topic.replacement=${routedByValue}\n",
    );
    assert!(
        out.contains("# topic_regex = \"(?<routedByValue>(?!internal).*)\""),
        "{out}"
    );
    assert!(out.contains("look-around"), "{out}");
    assert!(!data(&out)["route"].as_table().unwrap().contains_key("topic_regex"));
    assert_eq!(load(&out).router.route("orders"), "orders");
}

#[test]
fn another_plugin_needs_a_slot_of_its_own() {
    let out = import(
        "c.properties",
        &BASE.replace("plugin.name=pgoutput\n", "slot.name=dbz\n"),
    );
    assert!(
        out.contains("decoderbufs plugin (plugin.name unset: Debezium's default)"),
        "{out}"
    );
    assert_eq!(load(&out).postgres.slot.as_str(), "outbox_relay");
}

#[test]
fn names_the_relay_would_fold_are_quoted() {
    let out = import(
        "c.properties",
        &with_base("transforms.outbox.table.field.event.key=aggregateId\n").replace("public.outbox", "Sales.OutBox"),
    );
    let settings = load(&out);
    assert_eq!(settings.outbox.tables[0].quoted(), r#""Sales"."OutBox""#);
    assert_eq!(settings.outbox.key.as_str(), "aggregateId");
}

#[test]
fn tls_settings_map_to_the_url_and_sslrootcert() {
    let ca = tempfile::NamedTempFile::new().unwrap();
    let out = import_with(&format!(
        "database.sslmode=verify-full\ndatabase.sslrootcert={}\n",
        ca.path().display()
    ));
    let settings = load(&out);
    assert_eq!(settings.postgres.sslrootcert.as_deref(), Some(ca.path()));
    assert!(settings.postgres.url.expose().ends_with("?sslmode=require"), "{out}");
}

// ------------------------------------------------------------------ the documentation's examples

#[test]
fn the_outbox_event_router_docs_example_imports_to_an_accepted_config() {
    let out = super::import_debezium(&fixture("outbox-event-router-docs.properties"))
        .unwrap()
        .toml;
    let settings = load(&out);
    assert_eq!(settings.outbox.tables[0].quoted(), r#""inventory"."outboxevent""#);
    assert_eq!(settings.router.route("order"), "outbox.event.order");
    let placed: Vec<(&str, &str)> = settings
        .debezium
        .as_ref()
        .expect("[debezium]")
        .additional
        .iter()
        .map(|f| (f.column.as_str(), f.alias.as_str()))
        .collect();
    assert_eq!(placed, [("eventType", "type")]);
    assert_eq!(
        settings.postgres.url.expose(),
        "postgres://postgres@192.168.99.100:5432/postgres"
    );
    let dbz = debezium(&out);
    assert_eq!(dbz["table.expand.json.payload"].as_bool(), Some(true));
    assert_eq!(
        dbz["value.converter"].as_str(),
        Some("org.apache.kafka.connect.json.JsonConverter")
    );
    assert_eq!(
        dbz["table.fields.additional.placement"].as_str(),
        Some("eventType:header:type")
    );
    // topic.prefix names envelope schemas, so it is kept (in [debezium]), not listed.
    assert_eq!(dbz["topic.prefix"].as_str(), Some("fulfillment"));
}

#[test]
fn the_outbox_example_imports_to_an_accepted_config() {
    let out = super::import_debezium(&fixture("outbox-example.json")).unwrap().toml;
    let settings = load(&out);
    assert_eq!(settings.outbox.tables[0].quoted(), r#""inventory"."outboxevent""#);
    assert_eq!(
        settings.outbox.timestamp.as_ref().map(|t| t.as_str()),
        Some("timestamp")
    );
    assert_eq!(settings.router.route("Order"), "Order.events");
    let notes = not_carried_over(&out);
    // database.server.name (topic.prefix's old name) names envelope schemas: kept in [debezium].
    assert_eq!(debezium(&out)["topic.prefix"].as_str(), Some("dbserver1"));
    for option in ["tasks.max", "schema.whitelist", "tombstones.on.delete"] {
        listed(&notes, option);
    }
    assert!(!out.contains("postgrespw"), "{out}");
}

// ------------------------------------------------------------------ Debezium Server

const SERVER_BASE: &str = "debezium.source.connector.class=io.debezium.connector.postgresql.PostgresConnector\n\
debezium.source.database.hostname=db.example\n\
debezium.source.database.user=relay\n\
debezium.source.database.password=secret-pw\n\
debezium.source.database.dbname=app\n\
debezium.source.plugin.name=pgoutput\n\
debezium.source.table.include.list=public.outbox\n\
debezium.source.topic.prefix=app\n\
debezium.transforms=outbox\n\
debezium.transforms.outbox.type=io.debezium.transforms.outbox.EventRouter\n\
debezium.format.value=json\n";

#[test]
fn a_debezium_server_file_with_the_kafka_sink_maps_its_producer_properties() {
    let text = import_server(
        "debezium.sink.type=kafka\ndebezium.sink.kafka.producer.bootstrap.servers=k1:9092,k2:9092\n\
             debezium.sink.kafka.producer.key.serializer=org.apache.kafka.common.serialization.StringSerializer\n\
             debezium.sink.kafka.producer.linger.ms=2\n",
    );
    let t = sink_data(&text, "kafka");
    assert_eq!(
        t["kafka"]["bootstrap.servers"].as_str(),
        Some("k1:9092,k2:9092"),
        "{text}"
    );
    assert_eq!(t["kafka"]["linger.ms"].as_str(), Some("2"), "{text}");
    assert!(!text.contains("secret-pw"), "no secret is written:\n{text}");
    let notes = not_carried_over(&text);
    assert!(listed(&notes, "debezium.format.value").contains("payload column's bytes"));
    assert!(listed(&notes, "debezium.sink.kafka.producer.key.serializer").contains("set by the relay"));
    load(&text);
}

#[test]
fn a_debezium_server_file_with_a_broker_sink_gets_that_sinks_section_and_no_kafka() {
    let nats = import_server(
        "debezium.sink.type=nats-jetstream\ndebezium.sink.nats-jetstream.url=nats://n1:4222\n\
             debezium.sink.nats-jetstream.stream-name=OUTBOX\ndebezium.sink.nats-jetstream.create-stream=true\n",
    );
    let t = sink_data(&nats, "nats");
    assert_eq!(t["nats"]["url"].as_str(), Some("nats://n1:4222"));
    assert_eq!(t["nats"]["stream"].as_str(), Some("OUTBOX"));
    assert!(t.get("kafka").is_none(), "{nats}");
    assert!(listed(&not_carried_over(&nats), "debezium.sink.nats-jetstream.create-stream").contains("setup"));
    assert_eq!(load(&nats).sink.label(), "nats");

    let rabbit = import_server(
        "debezium.sink.type=rabbitmq\ndebezium.sink.rabbitmq.connection.host=mq\n\
             debezium.sink.rabbitmq.connection.username=app\ndebezium.sink.rabbitmq.connection.password=mq-secret\n\
             debezium.sink.rabbitmq.exchange=events\ndebezium.sink.rabbitmq.routingKey=fixed\n",
    );
    let t = sink_data(&rabbit, "rabbitmq");
    assert_eq!(t["rabbitmq"]["url"].as_str(), Some("amqp://app@mq:5672/%2f"));
    assert_eq!(t["rabbitmq"]["exchange"].as_str(), Some("events"));
    assert!(
        !rabbit.contains("mq-secret") && rabbit.contains("OUTBOX_RELAY__RABBITMQ__URL"),
        "{rabbit}"
    );
    assert!(listed(&not_carried_over(&rabbit), "debezium.sink.rabbitmq.routingKey").contains("routing key"));
    assert_eq!(load(&rabbit).sink.label(), "rabbitmq");

    let redis = import_server(
        "debezium.sink.type=redis\ndebezium.sink.redis.address=cache:6380\n\
             debezium.sink.redis.password=r-secret\ndebezium.sink.redis.wait.enabled=true\n",
    );
    let t = sink_data(&redis, "redis");
    assert_eq!(t["redis"]["url"].as_str(), Some("redis://cache:6380"));
    assert!(!redis.contains("r-secret"), "{redis}");
    assert!(listed(&not_carried_over(&redis), "debezium.sink.redis.wait.enabled").contains("replicas"));
    assert_eq!(load(&redis).sink.label(), "redis");

    let pubsub = import_server(
        "debezium.sink.type=pubsub\ndebezium.sink.pubsub.project.id=acme-prod\n\
             debezium.sink.pubsub.address=localhost:8085\ndebezium.sink.pubsub.ordering.enabled=true\n\
             debezium.sink.pubsub.retry.total.timeout.ms=120000\ndebezium.sink.pubsub.batch.delay.threshold.ms=100\n",
    );
    let t = sink_data(&pubsub, "pubsub");
    assert_eq!(t["pubsub"]["project"].as_str(), Some("acme-prod"));
    assert_eq!(t["pubsub"]["retry_timeout_ms"].as_integer(), Some(120_000));
    assert!(pubsub.contains("PUBSUB_EMULATOR_HOST=localhost:8085"), "{pubsub}");
    let notes = not_carried_over(&pubsub);
    assert!(listed(&notes, "debezium.sink.pubsub.ordering.enabled").contains("aggregate key"));
    assert!(listed(&notes, "debezium.sink.pubsub.batch.delay.threshold.ms").contains("batches"));
    assert_eq!(load(&pubsub).sink.label(), "pubsub");
    let err = import_err(
        "application.properties",
        &format!("{SERVER_BASE}debezium.sink.type=pubsub\n"),
    );
    assert!(err.contains("project.id"), "{err}");

    let sqs = import_server(
        "debezium.sink.type=sqs\ndebezium.sink.sqs.region=eu-west-1\n\
             debezium.sink.sqs.endpoint=http://localhost:4566\ndebezium.sink.sqs.credentials.profile=cdc\n\
             debezium.sink.sqs.queue.url=https://sqs.eu-west-1.amazonaws.com/123456789012/outbox.fifo\n\
             debezium.sink.sqs.fifo.message.group.id=cdc-group\n",
    );
    let t = sink_data(&sqs, "sqs");
    assert_eq!(t["sqs"]["region"].as_str(), Some("eu-west-1"));
    assert_eq!(t["sqs"]["endpoint_url"].as_str(), Some("http://localhost:4566"));
    assert_eq!(t["sqs"]["fifo"].as_bool(), Some(true), "{sqs}");
    assert!(
        sqs.contains("AWS_PROFILE=cdc") && sqs.contains("\"outbox.fifo\""),
        "{sqs}"
    );
    assert!(listed(&not_carried_over(&sqs), "debezium.sink.sqs.fifo.message.group.id").contains("aggregate key"));
    assert_eq!(load(&sqs).sink.label(), "sqs");

    let sns = import_server(
        "debezium.sink.type=sns\n\
             debezium.sink.sns.topic.arn=arn:aws:sns:us-east-2:123456789012:outbox.fifo\n\
             debezium.sink.sns.fifo.message.group.id.header=aggregateId\ndebezium.sink.sns.default.retries=3\n\
             debezium.sink.sns.fifo.message.dedup.id.header=id\n",
    );
    let t = sink_data(&sns, "sns");
    assert_eq!(
        t["sns"]["region"].as_str(),
        Some("us-east-2"),
        "the region of the topic ARN: {sns}"
    );
    assert_eq!(t["sns"]["fifo"].as_bool(), Some(true), "{sns}");
    assert!(sns.contains("\"outbox.fifo\""), "{sns}");
    let notes = not_carried_over(&sns);
    assert!(listed(&notes, "debezium.sink.sns.fifo.message.group.id.header").contains("aggregate key"));
    assert!(listed(&notes, "debezium.sink.sns.fifo.message.dedup.id.header").contains("source position"));
    assert!(listed(&notes, "debezium.sink.sns.default.retries").contains("retried"));
    assert_eq!(load(&sns).sink.label(), "sns");
    let standard = import_server(
        "debezium.sink.type=sns\ndebezium.sink.sns.region=eu-west-1\n\
             debezium.sink.sns.topic.arn.prefix=arn:aws:sns:eu-west-1:123456789012:\n",
    );
    let t = data(&standard);
    assert_eq!(t["sns"]["region"].as_str(), Some("eu-west-1"));
    assert!(t["sns"].get("fifo").is_none(), "{standard}");
    assert!(standard.contains("fifo = true if the topics are FIFO"), "{standard}");

    let err = import_err(
        "application.properties",
        &format!("{SERVER_BASE}debezium.sink.type=eventhubs\n"),
    );
    assert!(err.contains("\"eventhubs\"") && err.contains("kinesis"), "{err}");
}

#[test]
fn debezium_server_kinesis_maps_to_the_kinesis_sink_sending_the_payload_alone() {
    let kinesis = import_server(
        "debezium.sink.type=kinesis\ndebezium.sink.kinesis.region=eu-west-1\n\
             debezium.sink.kinesis.endpoint=http://localhost:4566\ndebezium.sink.kinesis.credentials.profile=cdc\n\
             debezium.sink.kinesis.batch.size=100\ndebezium.sink.kinesis.default.retries=10\n\
             debezium.sink.kinesis.null.key=none\ndebezium.sink.kinesis.something.new=1\n",
    );
    let t = sink_data(&kinesis, "kinesis");
    assert_eq!(t["kinesis"]["region"].as_str(), Some("eu-west-1"));
    assert_eq!(t["kinesis"]["endpoint_url"].as_str(), Some("http://localhost:4566"));
    assert_eq!(
        t["kinesis"]["format"].as_str(),
        Some("payload"),
        "what Debezium Server's consumers read"
    );
    assert!(kinesis.contains("AWS_PROFILE=cdc"), "{kinesis}");
    let notes = not_carried_over(&kinesis);
    assert!(listed(&notes, "debezium.sink.kinesis.batch.size").contains("500 records"));
    assert!(listed(&notes, "debezium.sink.kinesis.default.retries").contains("until Kinesis stores them"));
    assert!(listed(&notes, "debezium.sink.kinesis.null.key").contains("always has a key"));
    assert!(listed(&notes, "debezium.sink.kinesis.something.new").contains("no counterpart"));
    assert!(
        !notes
            .iter()
            .any(|n| n.contains("kinesis.region") || n.contains("credentials.profile")),
        "{notes:?}"
    );
    let settings = load(&kinesis);
    assert_eq!(settings.sink.label(), "kinesis");
    let no_region = import(
        "application.properties",
        &format!("{SERVER_BASE}debezium.sink.type=kinesis\n"),
    );
    assert!(no_region.contains("AWS_REGION"), "{no_region}");
    assert_eq!(load(&no_region).sink.label(), "kinesis");
}
