//! The files around the code stay true to it: every key of the example config is in
//! docs/configuration.md (with its environment variable), the Kubernetes manifests and the
//! compose file parse and wire up what the relay really serves and exports, and the compose
//! stack's SQL and config work against a real database.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use outbox_relay::config::Settings;
use serde_yaml::Value;

use crate::harness::*;

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

fn read(path: &str) -> String {
    std::fs::read_to_string(repo(path)).unwrap_or_else(|e| panic!("read {path}: {e}"))
}

fn yaml(path: &str) -> Value {
    serde_yaml::from_str(&read(path)).unwrap_or_else(|e| panic!("{path} is not valid YAML: {e}"))
}

/// `section.key` for every key set in the example config, plus keys shown commented out
/// (`# key = …` right under a section, the file's way of documenting optional keys).
fn example_config_keys() -> BTreeSet<(String, String)> {
    let text = read("config/outbox-relay.toml");
    let table: toml::Table = text.parse().expect("config/outbox-relay.toml parses");
    let mut keys = BTreeSet::new();
    for (section, value) in &table {
        for key in value.as_table().expect("sections only").keys() {
            keys.insert((section.clone(), key.clone()));
        }
    }
    let mut section = String::new();
    for line in text.lines() {
        // An optional section is shown commented out (`# [retention]`): its keys count too.
        let header = line.strip_prefix("# ").unwrap_or(line);
        if let Some(name) = header.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            section = name.to_owned();
        } else if let Some(rest) = line.strip_prefix("# ") {
            let Some((key, _)) = rest.split_once(" = ") else {
                continue;
            };
            if !section.is_empty() && !key.is_empty() && key.chars().all(|c| c.is_ascii_lowercase() || c == '_') {
                keys.insert((section.clone(), key.to_owned()));
            }
        }
    }
    keys
}

fn env_var(section: &str, key: &str) -> String {
    format!(
        "OUTBOX_RELAY__{}__{}",
        section.to_uppercase(),
        key.to_uppercase().replace('.', "_")
    )
}

#[test]
fn every_example_config_key_is_documented_with_its_environment_variable() {
    let docs = read("docs/configuration.md");
    let keys = example_config_keys();
    assert!(keys.len() > 20, "parsed too few keys: {keys:?}");
    let mut missing = Vec::new();
    for (section, key) in &keys {
        let written = if section == "kafka" {
            format!("`{key}`")
        } else {
            format!("`{section}.{key}`")
        };
        if !docs.contains(&written) {
            missing.push(written);
        }
        let env = env_var(section, key);
        if !docs.contains(&env) {
            missing.push(env);
        }
    }
    assert!(missing.is_empty(), "docs/configuration.md lacks: {missing:?}");
}

/// Metric names the relay exports (the constants in src/ops/metrics.rs).
fn exported_metrics() -> BTreeSet<String> {
    let source = read("src/ops/metrics.rs");
    let names: BTreeSet<String> = source
        .lines()
        .filter_map(|l| {
            let l = l.trim();
            l.strip_prefix("pub(crate) const ")
                .or_else(|| l.strip_prefix("pub const "))
        })
        .filter_map(|l| l.split('"').nth(1))
        .filter(|n| n.starts_with("outbox_relay_"))
        .map(str::to_owned)
        .collect();
    assert!(names.len() >= 10, "found too few metric constants: {names:?}");
    names
}

/// `outbox_relay_*` identifiers in a PromQL expression.
fn metrics_in(expr: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = expr;
    while let Some(i) = rest.find("outbox_relay_") {
        let tail = &rest[i..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        out.push(tail[..end].to_owned());
        rest = &tail[end..];
    }
    out
}

/// GitHub's anchor for a Markdown heading.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-' || *c == '_')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// Every file under `dir`, recursively (symbolic links included as files).
fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .flatten()
    {
        let path = entry.path();
        if path.is_dir() {
            out.extend(files_under(&path));
        } else {
            out.push(path);
        }
    }
    out
}

/// Panics naming the metric when `exprs` (PromQL, as `what` uses them) select one the relay does
/// not export; returns the metrics they select.
fn check_metrics_exist(what: &str, exprs: &[(String, String)]) -> BTreeSet<String> {
    let exported = exported_metrics();
    let mut used = BTreeSet::new();
    for (name, expr) in exprs {
        for metric in metrics_in(expr) {
            let base = ["_bucket", "_sum", "_count"].iter().fold(metric.clone(), |m, s| {
                m.strip_suffix(s)
                    .filter(|b| exported.contains(*b))
                    .map_or(m.clone(), str::to_owned)
            });
            assert!(
                exported.contains(&base),
                "{what} {name:?} uses {metric}, which src/ops/metrics.rs does not define"
            );
            used.insert(base);
        }
    }
    assert!(!used.is_empty(), "{what}: no outbox_relay_* metric found in {exprs:?}");
    used
}

/// (alert name, expr) of every rule of a PrometheusRule.
fn alert_exprs(rules: &Value) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for group in rules["spec"]["groups"].as_sequence().expect("rule groups") {
        for rule in group["rules"].as_sequence().expect("rules") {
            let name = rule["alert"].as_str().expect("alert name").to_owned();
            out.push((name, rule["expr"].as_str().expect("expr").to_owned()));
        }
    }
    out
}

#[test]
fn kubernetes_manifests_wire_probes_config_and_alerts_to_what_the_relay_serves() {
    for f in files_under(&repo("deploy/kubernetes")) {
        let text = std::fs::read_to_string(&f).unwrap();
        serde_yaml::from_str::<Value>(&text).unwrap_or_else(|e| panic!("{} is not valid YAML: {e}", f.display()));
    }

    // `kubectl apply -k deploy/kubernetes` is the base, and the base applies on a cluster
    // without the Prometheus Operator: no custom resources in it.
    let top = yaml("deploy/kubernetes/kustomization.yaml");
    assert_eq!(top["resources"].as_sequence().map(Vec::len), Some(1), "{top:?}");
    assert_eq!(top["resources"][0].as_str(), Some("base"));
    let base = yaml("deploy/kubernetes/base/kustomization.yaml");
    for resource in base["resources"].as_sequence().expect("base resources") {
        let file = format!("deploy/kubernetes/base/{}", resource.as_str().unwrap());
        let api = yaml(&file)["apiVersion"].as_str().unwrap_or_default().to_owned();
        assert!(
            api == "v1" || api.starts_with("apps/") || api.starts_with("batch/"),
            "{file}: {api} is not built into Kubernetes: the base must apply on a vanilla cluster"
        );
    }
    let image = base["images"][0]["name"].as_str().expect("the base names its image");
    assert!(
        image.contains(".invalid/"),
        "the placeholder image must be obviously one: {image}"
    );
    let monitoring = yaml("deploy/kubernetes/overlays/monitoring/kustomization.yaml");
    let resources: Vec<&str> = monitoring["resources"]
        .as_sequence()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(resources, ["../../base", "servicemonitor.yaml", "prometheusrule.yaml"]);

    // The config the pods run with is a valid relay config with the HTTP endpoints on.
    let configmap = yaml("deploy/kubernetes/base/configmap.yaml");
    let toml_text = configmap["data"]["outbox-relay.toml"]
        .as_str()
        .expect("config file in the ConfigMap");
    let settings = Settings::from_toml_str(toml_text, Path::new("configmap"), std::iter::empty())
        .unwrap_or_else(|e| panic!("the ConfigMap's config is invalid: {e}"));
    let listen = settings.http.listen.expect("[http] listen is set");

    let deployment = yaml("deploy/kubernetes/base/deployment.yaml");
    let spec = &deployment["spec"];
    assert_eq!(spec["replicas"].as_i64(), Some(2), "one active, one standby");
    assert_eq!(spec["strategy"]["rollingUpdate"]["maxUnavailable"].as_i64(), Some(0));
    let pod = &spec["template"]["spec"];
    let grace = pod["terminationGracePeriodSeconds"].as_u64().expect("grace period");
    assert!(
        grace > settings.relay.shutdown_timeout.as_secs(),
        "a draining relay must not be killed: grace {grace} s ≤ shutdown_timeout"
    );
    let relay = &pod["containers"][0];
    assert!(relay["image"].as_str().unwrap().starts_with(image), "{relay:?}");
    let port = relay["ports"][0]["containerPort"].as_u64().expect("container port");
    assert_eq!(port, u64::from(listen.port()), "probes must hit [http] listen");
    assert_eq!(relay["livenessProbe"]["httpGet"]["path"].as_str(), Some("/healthz"));
    assert_eq!(relay["readinessProbe"]["httpGet"]["path"].as_str(), Some("/readyz"));
    let from_secret = relay["envFrom"][0]["secretRef"]["name"]
        .as_str()
        .expect("env from the Secret");
    let volume_cm = pod["volumes"][0]["configMap"]["name"].as_str().expect("config volume");
    assert_eq!(volume_cm, configmap["metadata"]["name"].as_str().unwrap());

    let secret = yaml("deploy/kubernetes/base/secret.yaml");
    assert_eq!(secret["metadata"]["name"].as_str(), Some(from_secret));
    let secret_keys: Vec<&str> = secret["stringData"]
        .as_mapping()
        .expect("stringData")
        .keys()
        .filter_map(Value::as_str)
        .collect();
    assert!(secret_keys.contains(&"OUTBOX_RELAY__POSTGRES__URL"), "{secret_keys:?}");
    assert!(
        secret_keys.iter().all(|k| k.starts_with("OUTBOX_RELAY__")),
        "{secret_keys:?}"
    );

    let service = yaml("deploy/kubernetes/base/service.yaml");
    let monitor = yaml("deploy/kubernetes/overlays/monitoring/servicemonitor.yaml");
    assert_eq!(
        monitor["spec"]["endpoints"][0]["port"],
        service["spec"]["ports"][0]["name"]
    );
    assert_eq!(monitor["spec"]["endpoints"][0]["path"].as_str(), Some("/metrics"));

    // Alerts use only metrics the relay exports, link their runbook, and cover the four the
    // issue names.
    let rules = yaml("deploy/kubernetes/overlays/monitoring/prometheusrule.yaml");
    let operations = read("docs/operations.md");
    let anchors: BTreeSet<String> = operations
        .lines()
        .filter_map(|l| {
            l.trim_start_matches('#')
                .strip_prefix(' ')
                .filter(|_| l.starts_with('#'))
        })
        .map(anchor)
        .collect();
    for group in rules["spec"]["groups"].as_sequence().expect("rule groups") {
        for rule in group["rules"].as_sequence().expect("rules") {
            let runbook = rule["annotations"]["runbook"]
                .as_str()
                .expect("every alert links its runbook");
            let section = runbook.split('#').nth(1).expect("runbook anchor");
            assert!(
                anchors.contains(section),
                "docs/operations.md has no section #{section} ({runbook})"
            );
        }
    }
    let exprs: Vec<String> = alert_exprs(&rules).into_iter().map(|(_, e)| e).collect();
    check_metrics_exist("alert", &alert_exprs(&rules));
    let has = |needle: &str| exprs.iter().any(|e| e.contains(needle));
    assert!(has("outbox_relay_seconds_behind_source"), "lag alert");
    assert!(has("outbox_relay_slot_retained_wal_bytes"), "retained WAL alert");
    assert!(has("outbox_relay_events_failed_total"), "failed events alert");
    // "No standby" must fire when no series is 0 at all, hence the `or vector(0)`.
    assert!(has("count(outbox_relay_active == 0) or vector(0)"), "no-standby alert");
}

#[test]
fn the_helm_chart_renders_the_kustomize_config_and_alerts() {
    // The chart's default config is the kustomize base's, so the two cannot drift apart; the
    // port the chart's probes and Service use is [http] listen's.
    let values = yaml("deploy/helm/outbox-relay/values.yaml");
    let configmap = yaml("deploy/kubernetes/base/configmap.yaml");
    let chart_config = values["config"].as_str().expect("values: config");
    assert_eq!(
        Some(chart_config),
        configmap["data"]["outbox-relay.toml"].as_str(),
        "values.yaml `config` and deploy/kubernetes/base/configmap.yaml differ"
    );
    let settings = Settings::from_toml_str(chart_config, Path::new("values.yaml"), std::iter::empty())
        .unwrap_or_else(|e| panic!("the chart's default config is invalid: {e}"));
    let listen = settings.http.listen.expect("[http] listen is set");
    assert_eq!(values["service"]["port"].as_u64(), Some(u64::from(listen.port())));
    assert_eq!(values["livenessProbe"]["httpGet"]["path"].as_str(), Some("/healthz"));
    assert_eq!(values["readinessProbe"]["httpGet"]["path"].as_str(), Some("/readyz"));
    let grace = values["terminationGracePeriodSeconds"].as_u64().expect("grace period");
    assert!(grace > settings.relay.shutdown_timeout.as_secs());
    assert!(
        values["image"]["repository"].as_str().unwrap().contains(".invalid/"),
        "the placeholder image must be obviously one"
    );
    // Off by default: the chart installs on a vanilla cluster.
    assert_eq!(values["serviceMonitor"]["enabled"].as_bool(), Some(false));
    assert_eq!(values["prometheusRule"]["enabled"].as_bool(), Some(false));

    // One set of alert rules for both: the chart reads the overlay's file through a link.
    let link = repo("deploy/helm/outbox-relay/files/prometheusrule.yaml");
    let target = std::fs::read_link(&link).unwrap_or_else(|e| panic!("{} is no link: {e}", link.display()));
    assert_eq!(
        link.parent().unwrap().join(target).canonicalize().unwrap(),
        repo("deploy/kubernetes/overlays/monitoring/prometheusrule.yaml")
            .canonicalize()
            .unwrap()
    );
    let rules = yaml("deploy/helm/outbox-relay/files/prometheusrule.yaml");
    check_metrics_exist("the chart's alert", &alert_exprs(&rules));
}

/// (panel title, query) of every panel of the Grafana dashboard.
fn dashboard_exprs() -> Vec<(String, String)> {
    let text = read("deploy/grafana/outbox-relay.json");
    let dashboard: serde_json::Value = serde_json::from_str(&text).expect("the dashboard is JSON");
    let mut exprs = Vec::new();
    for panel in dashboard["panels"].as_array().expect("panels") {
        let title = panel["title"].as_str().unwrap_or_default().to_owned();
        if panel["type"] == "row" {
            continue;
        }
        let targets = panel["targets"].as_array().map(Vec::as_slice).unwrap_or_default();
        assert!(!targets.is_empty(), "panel {title:?} queries nothing");
        for target in targets {
            let expr = target["expr"]
                .as_str()
                .unwrap_or_else(|| panic!("panel {title:?}: no expr"));
            exprs.push((title.clone(), expr.to_owned()));
        }
    }
    exprs
}

/// Every metric the Grafana dashboard and the alert rules query, each checked to be one
/// src/ops/metrics.rs defines (histograms by their base name). `ha_and_metrics` also finds them
/// in a running relay's /metrics.
pub(crate) fn queried_metrics() -> BTreeSet<String> {
    let rules = yaml("deploy/kubernetes/overlays/monitoring/prometheusrule.yaml");
    let mut used = check_metrics_exist("dashboard panel", &dashboard_exprs());
    used.extend(check_metrics_exist("alert", &alert_exprs(&rules)));
    used
}

#[test]
fn the_grafana_dashboard_queries_only_exported_metrics_and_shows_the_essentials() {
    let exprs = dashboard_exprs();
    let used = check_metrics_exist("dashboard panel", &exprs);
    for essential in [
        "outbox_relay_seconds_behind_source",
        "outbox_relay_slot_retained_wal_bytes",
        "outbox_relay_in_flight_events",
        "outbox_relay_in_flight_bytes",
        "outbox_relay_reconnects_total",
        "outbox_relay_events_failed_total",
        "outbox_relay_events_published_total",
        "outbox_relay_active",
    ] {
        assert!(used.contains(essential), "the dashboard does not show {essential}");
    }
    // Per topic (the sink's destination).
    assert!(
        exprs
            .iter()
            .any(|(_, e)| e.contains("sum by (topic)") && e.contains("events_published_total")),
        "no per-topic throughput panel"
    );
}

#[test]
fn docker_compose_runs_the_pipeline_with_logical_postgres_and_kraft_kafka() {
    let compose = yaml("docker-compose.yml");
    let services = &compose["services"];
    let command: Vec<&str> = services["postgres"]["command"]
        .as_sequence()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(
        command.windows(2).any(|w| w == ["-c", "wal_level=logical"]),
        "{command:?}"
    );
    let kafka = &services["kafka"];
    assert!(kafka["image"].as_str().unwrap().starts_with("apache/kafka:"));
    assert_eq!(
        kafka["environment"]["KAFKA_PROCESS_ROLES"].as_str(),
        Some("broker,controller"),
        "KRaft mode"
    );
    assert_eq!(services["relay"]["build"].as_str(), Some("."));
    // Every bind-mounted file exists.
    for (_, service) in services.as_mapping().unwrap() {
        for volume in service["volumes"].as_sequence().into_iter().flatten() {
            let source = volume.as_str().unwrap().split(':').next().unwrap();
            assert!(repo(source).exists(), "compose mounts missing {source}");
        }
    }
    // The example services run binaries the Dockerfile builds from examples/.
    let dockerfile = read("Dockerfile");
    assert!(dockerfile.contains("FROM debian:bookworm-slim") && dockerfile.contains("ca-certificates"));
    for service in ["producer", "consumer"] {
        let program = services[service]["entrypoint"][0].as_str().unwrap();
        assert!(
            repo(&format!("examples/{program}.rs")).is_file(),
            "no example {program}"
        );
        assert!(
            dockerfile.contains(&format!("--example {program}")),
            "the image lacks {program}"
        );
    }
    // The relay's config plus the compose environment is a valid config.
    let env: Vec<(String, String)> = services["relay"]["environment"]
        .as_mapping()
        .unwrap()
        .iter()
        .map(|(k, v)| (k.as_str().unwrap().to_owned(), v.as_str().unwrap().to_owned()))
        .collect();
    let settings = Settings::load_with_env(&repo("deploy/docker/outbox-relay.toml"), env)
        .unwrap_or_else(|e| panic!("the compose relay config is invalid: {e}"));
    assert_eq!(settings.sink.get("bootstrap.servers").as_deref(), Some("kafka:9092"));

    // Where a compose implementation is installed, let it validate the file too.
    let implementations: [&[&str]; 2] = [&["docker", "compose"], &["docker-compose"]];
    let run = |argv: &[&str], extra: &[&str]| {
        std::process::Command::new(argv[0])
            .args(&argv[1..])
            .args(extra)
            .current_dir(repo("."))
            .output()
    };
    let installed = implementations
        .into_iter()
        .find(|argv| run(argv, &["version"]).is_ok_and(|o| o.status.success()));
    match installed {
        Some(argv) => {
            let out = run(argv, &["config", "--quiet"]).expect("run compose config");
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(
                out.status.success(),
                "`{} config` rejects docker-compose.yml: {stderr}",
                argv.join(" ")
            );
        }
        None => crate::harness::needs::missing(
            crate::harness::needs::DOCKER_COMPOSE,
            "the compose implementation's check of docker-compose.yml",
            "docker-compose.yml was checked structurally only",
        ),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_compose_schema_and_config_pass_setup_on_a_real_database() {
    let pg = shared_cluster().await;
    let db = unique_name("compose");
    pg.create_database(&db).await;
    let client = pg.client(&db).await;
    client
        .batch_execute(&read("deploy/docker/initdb/01-shop.sql"))
        .await
        .expect("compose init SQL");
    let slot = unique_name("slot");
    let env = vec![
        ("OUTBOX_RELAY__POSTGRES__URL".to_owned(), pg.url(&db)),
        ("OUTBOX_RELAY__POSTGRES__SLOT".to_owned(), slot.clone()),
        ("OUTBOX_RELAY__POSTGRES__PUBLICATION".to_owned(), unique_name("pub")),
    ];
    let settings = Settings::load_with_env(&repo("deploy/docker/outbox-relay.toml"), env).expect("config");
    let report = outbox_relay::control::setup(&settings)
        .await
        .unwrap_or_else(|e| panic!("setup: {e}"));
    assert!(report.to_string().contains("created"), "{report}");
    outbox_relay::control::teardown(&settings).await.expect("teardown");
    assert!(slot_row(&client, &slot).await.is_none());
}

/// The keys a section of the config accepts, as the loader itself lists them: a key no section
/// has (`__probe__`) is refused with "unknown field …, expected one of `a`, `b`, …".
fn accepted_keys(file: &str) -> Vec<String> {
    let err = Settings::from_toml_str(file, Path::new("probe.toml"), Vec::new())
        .expect_err("a key no section has is refused")
        .to_string();
    let (_, expected) = err
        .split_once("unknown field `__probe__`, expected ")
        .unwrap_or_else(|| panic!("not an unknown-field refusal: {err}"));
    let expected = expected.lines().next().unwrap_or_default();
    expected.split('`').skip(1).step_by(2).map(str::to_owned).collect()
}

/// Every key the configuration accepts — each generic section's, and each sink section's — is
/// shown in the example config (the generic sections; it claims to show every key) and named in
/// docs/configuration.md (a sink's keys: there or in its own docs/sink-<kind>.md). The README's
/// table is a summary that links there.
#[test]
fn every_key_the_config_accepts_is_in_the_example_config_and_the_docs() {
    const URL: &str = "[postgres]\nurl = \"postgres://relay@127.0.0.1:5432/app\"\n";
    let docs = read("docs/configuration.md");
    let example = example_config_keys();
    let mut missing = Vec::new();
    let mut checked = 0;
    // The sections, as the loader names them refusing one it does not have: the generic ones,
    // then the sinks' own. [debezium] is free-form (Kafka Connect's property names, checked by
    // their own test) and [kafka] passes librdkafka's through: both are left out.
    let err = Settings::from_toml_str(&format!("{URL}[__probe__]\n"), Path::new("probe.toml"), Vec::new())
        .expect_err("an unknown section is refused")
        .to_string();
    let (generic, sinks) = err
        .split_once("the sections are ")
        .and_then(|(_, rest)| rest.split_once(", and the chosen sink's own: one of "))
        .unwrap_or_else(|| panic!("the refusal lists no sections: {err}"));
    let names = |list: &str| -> Vec<String> {
        list.split(", ")
            .map(|s| s.trim().trim_start_matches('[').trim_end_matches(']').to_owned())
            .filter(|s| s != "debezium" && s != "kafka")
            .collect()
    };
    let (generic, sinks) = (names(generic), names(sinks));
    assert!(generic.len() >= 10 && sinks.len() >= 8, "{generic:?} {sinks:?}");
    for section in &generic {
        let file = if section == "postgres" {
            "[postgres]\n__probe__ = 1\nurl = \"postgres://relay@127.0.0.1:5432/app\"\n".to_owned()
        } else {
            format!("{URL}[{section}]\n__probe__ = 1\n")
        };
        for key in accepted_keys(&file) {
            // A key accepted only to be refused with its new place (`relay.exactly_once` moved
            // to `[kafka]`) is documented there.
            let alone = format!("{URL}[{section}]\n{key} = 1\n");
            if Settings::from_toml_str(&alone, Path::new("probe.toml"), Vec::new())
                .is_err_and(|e| e.to_string().contains("moved to"))
            {
                continue;
            }
            checked += 1;
            if !docs.contains(&format!("`{section}.{key}`")) {
                missing.push(format!("docs/configuration.md: `{section}.{key}`"));
            }
            if !example.contains(&(section.clone(), key.clone())) {
                missing.push(format!("config/outbox-relay.toml: [{section}] {key}"));
            }
        }
    }
    for kind in [
        "nats", "rabbitmq", "redis", "webhook", "pubsub", "sqs", "sns", "kinesis",
    ] {
        let own = std::fs::read_to_string(repo(&format!("docs/sink-{kind}.md"))).unwrap_or_default();
        let file = format!("{URL}[sink]\nkind = \"{kind}\"\n[{kind}]\n__probe__ = 1\n");
        for key in accepted_keys(&file) {
            checked += 1;
            let named = [format!("`{kind}.{key}`"), format!("`{key}`")];
            if !named
                .iter()
                .any(|n| docs.contains(n.as_str()) || own.contains(n.as_str()))
            {
                missing.push(format!("docs: [{kind}] {key}"));
            }
        }
    }
    assert!(checked > 80, "found too few keys ({checked})");
    assert!(
        missing.is_empty(),
        "keys the config accepts but the docs do not show:\n{}",
        missing.join("\n")
    );
}
