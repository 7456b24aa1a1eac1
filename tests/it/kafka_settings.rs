//! The settings real Kafka clusters have, on a real broker: topics that are not created on
//! first use, SASL/SCRAM-SHA-512 over TLS with the password from the environment, ACLs — and
//! the ways a connection setting can be wrong (password, host, CA). Each wrong setting ends
//! in a clear error and an exit code, with nothing confirmed past what the broker acknowledged.

use std::path::Path;
use std::time::Duration;

use tokio_postgres::Client;

use crate::harness::fault_support::*;
use crate::harness::relay_process::{run_cmd_with, NO_DNS};
use crate::harness::tls::generate_server_tls;
use crate::harness::workload::{self, new_uuid, ExpectedEvent, OutboxSchema};
use crate::harness::*;

const RELAY_USER: &str = "relay";
const RELAY_PASSWORD: &str = "s3cret-Relay-pw";
const PASSWORD_ENV: &str = "OUTBOX_RELAY__KAFKA__SASL_PASSWORD";

/// One event of a new aggregate in its own transaction, and where its commit ends.
async fn commit_one(client: &mut Client) -> (ExpectedEvent, CommitPoint) {
    let tx = client.transaction().await.unwrap();
    let probe = TxnProbe::start(&tx).await;
    let ev = workload::insert_event(&tx, OutboxSchema::A, &new_uuid(), 0).await;
    tx.commit().await.unwrap();
    (ev, probe.finish(client).await)
}

/// A database ready for the relay (`setup` done), routing every event to `<ns>order`.
async fn ready(kafka: &KafkaNs) -> (Client, RelayConfig) {
    let (db, _, config) = prepared_ns(OutboxSchema::A, kafka).await;
    let client = shared_cluster().await.client(&db).await;
    install_walinspect(&client).await;
    (client, config.route(PREFIX_REGEX, "${routedByValue}"))
}

async fn assert_not_confirmed(client: &Client, slot: &str, point: &CommitPoint, what: &str) {
    let confirmed = confirmed_flush_lsn(client, slot).await.unwrap_or(0);
    assert!(
        confirmed < point.end_lsn,
        "{what}: confirmed {} passed the commit {} the broker never acknowledged",
        format_lsn(confirmed),
        format_lsn(point.end_lsn)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_routed_topic_that_does_not_exist_is_named_with_the_fix_and_nothing_is_confirmed() {
    // Shipped defaults throughout: the broker answers UNKNOWN_TOPIC_OR_PARTITION, librdkafka
    // retries it until message.timeout.ms (the relay's 30 s) and the session replays.
    let Some(cluster) = KafkaCluster::start(ClusterSpec::single().prop("auto.create.topics.enable", "false")).await
    else {
        return;
    };
    let kafka = cluster.own_ns();
    let (mut client, config) = ready(&kafka).await;
    let mut relay = RelayProcess::run_streaming(&config).await;
    let (event, point) = commit_one(&mut client).await;
    let topic = kafka.topic("order");
    let said = format!("topic \"{topic}\" does not exist");
    assert!(
        relay.wait_for_log(&said, Duration::from_secs(120)).await,
        "{}",
        relay.log_text()
    );
    let log = relay.log_text();
    for needle in [
        "auto.create.topics.enable".to_string(),
        format!("kafka-topics.sh --create --topic {topic}"),
        format!("id={}", event.id),
    ] {
        assert!(log.contains(&needle), "the error must say {needle:?}; log:\n{log}");
    }
    assert_not_confirmed(&client, &config.slot, &point, "missing topic").await;
    // The outage summary (WARN, every 30 s) names the cause, not just "no acknowledgement".
    let summary = relay
        .wait_for_log("still acknowledges nothing", Duration::from_secs(90))
        .await;
    assert!(summary, "{}", relay.log_text());
    let log = relay.log_text();
    let line = log
        .lines()
        .rfind(|l| l.contains("still acknowledges nothing"))
        .unwrap_or_default();
    // (Structured fields quote their value: the topic's quotes appear escaped there.)
    assert!(
        line.contains("WARN") && line.contains(&topic) && line.contains("does not exist"),
        "{line}"
    );
    assert_not_confirmed(&client, &config.slot, &point, "missing topic").await;

    // The fix as the error says it: create the topic; the relay, still running, delivers.
    kafka.create_topic("order", 3).await;
    let records = kafka.collect(&["order"], 1, Duration::from_secs(90)).await;
    check_delivered(&[event], &records, |_| "order".to_owned());
    assert!(
        confirmed_reaches(&client, &config.slot, point.end_lsn, Duration::from_secs(30)).await,
        "{}",
        relay.log_text()
    );
    assert!(
        relay.try_exit_status().is_none(),
        "the relay waited, it did not stop:\n{}",
        relay.log_text()
    );
}

/// A cluster with a SASL_SSL listener (SCRAM-SHA-512, the harness's throwaway CA), the
/// StandardAuthorizer on, user `relay` allowed to write to `ns`'s topics and nothing else.
struct Secured {
    cluster: KafkaCluster,
    ca: tempfile::NamedTempFile,
}

async fn secured() -> Option<Secured> {
    let tls = generate_server_tls();
    let spec = ClusterSpec {
        sasl_ssl: Some(SaslSsl {
            cert_pem: tls.cert_pem.clone(),
            key_pem: tls.key_pem.clone(),
            users: vec![(RELAY_USER.into(), RELAY_PASSWORD.into())],
            authorizer: true,
        }),
        ..ClusterSpec::single()
    };
    let cluster = KafkaCluster::start(spec).await?;
    let ca = tempfile::NamedTempFile::new().expect("CA file");
    std::fs::write(ca.path(), &tls.ca_pem).expect("write CA");
    Some(Secured { cluster, ca })
}

impl Secured {
    /// A relay config reaching the SASL_SSL listener as `relay`, trusting `ca` (the password
    /// comes from [`PASSWORD_ENV`]).
    fn sasl(&self, config: RelayConfig, ca: &Path) -> RelayConfig {
        config
            .kafka(
                "bootstrap.servers",
                &self.cluster.sasl_ssl_bootstrap().expect("SASL_SSL listener"),
            )
            .kafka("security.protocol", "SASL_SSL")
            .kafka("sasl.mechanism", "SCRAM-SHA-512")
            .kafka("sasl.username", RELAY_USER)
            .kafka("ssl.ca.location", &ca.to_string_lossy())
    }

    fn allow_writes(&self, topic: &str) {
        self.cluster.acl(&[
            "--add",
            "--allow-principal",
            &format!("User:{RELAY_USER}"),
            "--operation",
            "Write",
            "--operation",
            "Describe",
            "--topic",
            topic,
        ]);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sasl_scram_over_tls_publishes_and_an_acl_that_denies_the_topic_is_named() {
    let Some(sec) = secured().await else { return };
    // Allowed: a topic the relay's user may write.
    let kafka = sec.cluster.own_ns();
    kafka.create_topic("order", 3).await;
    sec.allow_writes(&kafka.topic("order"));
    let (mut client, config) = ready(&kafka).await;
    let config = sec.sasl(config, sec.ca.path());
    let env = [(PASSWORD_ENV, RELAY_PASSWORD)];
    let relay = RelayProcess::run_with(&config, &[], &env);
    let (event, point) = commit_one(&mut client).await;
    let records = kafka.collect(&["order"], 1, Duration::from_secs(60)).await;
    check_delivered(&[event], &records, |_| "order".to_owned());
    assert!(
        confirmed_reaches(&client, &config.slot, point.end_lsn, Duration::from_secs(30)).await,
        "{}",
        relay.log_text()
    );
    let status = run_cmd_with(&["status"], &config, &env, Duration::from_secs(60)).await;
    let said = format!(
        "{}{}{}",
        relay.log_text(),
        String::from_utf8_lossy(&status.stdout),
        String::from_utf8_lossy(&status.stderr)
    );
    assert!(
        !said.contains(RELAY_PASSWORD),
        "the password reached the output:\n{said}"
    );
    drop(relay);

    // Denied: the topic exists, the ACL does not let `relay` write it. The relay says which
    // topic and which ACL, confirms nothing past it, and goes on once the ACL is granted.
    let denied = sec.cluster.own_ns();
    denied.create_topic("order", 1).await;
    let (mut client, config) = ready(&denied).await;
    let config = sec.sasl(config, sec.ca.path());
    let relay = RelayProcess::run_with(&config, &[], &env);
    let (event, point) = commit_one(&mut client).await;
    let topic = denied.topic("order");
    let named = relay
        .wait_for_log(
            &format!("do not let the relay's principal write to topic \"{topic}\""),
            Duration::from_secs(60),
        )
        .await;
    assert!(named, "{}", relay.log_text());
    assert!(relay.log_text().contains("--operation Write"), "{}", relay.log_text());
    assert_not_confirmed(&client, &config.slot, &point, "ACL denies the topic").await;
    sec.allow_writes(&topic);
    let records = denied.collect(&["order"], 1, Duration::from_secs(90)).await;
    check_delivered(&[event], &records, |_| "order".to_owned());
    assert!(
        confirmed_reaches(&client, &config.slot, point.end_lsn, Duration::from_secs(60)).await,
        "{}",
        relay.log_text()
    );
    assert!(!relay.log_text().contains(RELAY_PASSWORD));
}

/// Runs the relay with `config` and `env` until it exits; asserts exit code 1, the log's
/// `needles`, no password in it, and nothing confirmed.
async fn stops_with(config: &RelayConfig, env: &[(&str, &str)], client: &mut Client, needles: &[&str], what: &str) {
    let mut relay = RelayProcess::run_with(config, &[], env);
    let (_event, point) = commit_one(client).await;
    let status = relay.wait_exit(Duration::from_secs(60)).await;
    let log = relay.log_text();
    assert_eq!(status.and_then(|s| s.code()), Some(1), "{what}: exit code; log:\n{log}");
    for needle in needles {
        assert!(
            log.contains(needle),
            "{what}: the error must say {needle:?}; log:\n{log}"
        );
    }
    assert!(!log.contains(RELAY_PASSWORD), "{what}: the password reached the log");
    assert_not_confirmed(client, &config.slot, &point, what).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn wrong_password_unknown_host_and_untrusted_ca_stop_with_a_clear_error() {
    let Some(sec) = secured().await else { return };
    let kafka = sec.cluster.own_ns();
    kafka.create_topic("order", 1).await;
    sec.allow_writes(&kafka.topic("order"));
    let (mut client, config) = ready(&kafka).await;
    let config = sec.sasl(config, sec.ca.path());

    stops_with(
        &config,
        &[(PASSWORD_ENV, "not-the-password")],
        &mut client,
        &["the cluster refused the relay's credentials", "sasl.username"],
        "wrong password",
    )
    .await;

    let other_ca = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(other_ca.path(), generate_server_tls().ca_pem).unwrap();
    stops_with(
        &sec.sasl(config.clone(), other_ca.path()),
        &[(PASSWORD_ENV, RELAY_PASSWORD)],
        &mut client,
        &["TLS handshake with the cluster failed", "ssl.ca.location"],
        "CA mismatch",
    )
    .await;

    // No DNS server for the relay (see NO_DNS): the lookup fails on the machine itself.
    stops_with(
        &config
            .clone()
            .kafka("bootstrap.servers", "kafka-0.outbox-relay.invalid:9093"),
        &[(PASSWORD_ENV, RELAY_PASSWORD), (NO_DNS, "")],
        &mut client,
        &[
            "a bootstrap host does not resolve",
            "kafka-0.outbox-relay.invalid",
            "bootstrap.servers",
        ],
        "unknown host",
    )
    .await;

    // And with everything right, every event written meanwhile arrives: nothing was lost.
    let relay = RelayProcess::run_with(&config, &[], &[(PASSWORD_ENV, RELAY_PASSWORD)]);
    let records = kafka.collect(&["order"], 3, Duration::from_secs(60)).await;
    assert_eq!(records.len(), 3, "{}", relay.log_text());
}
