//! What the AWS sinks' halves of `outbox-relay demo` share: they publish to a running moto server
//! (`--sink-url`, its `http://host:port`), which serves SQS, SNS and Kinesis on one port, with
//! test credentials set for this process, so the demo never reaches a cloud account; and the
//! SDK configuration of their consumers' clients.

use std::future::Future;

use aws_smithy_types::error::display::DisplayErrorContext;

use crate::sink::demo::{bounded, container, toml_string, DemoConfig, DemoRun, LocalServer, Open, Server, SinkDemo};

/// The region of the demo's clients and relay (moto accepts any).
pub(crate) const REGION: &str = "us-east-1";
/// The credentials of the demo's clients and relay: never real ones (moto accepts any).
const TEST_KEY: &str = "testing";

/// An AWS sink's half of the demo: the moto server `name` says it stands in for ("moto server
/// (Amazon SQS)"), `help` for the sink's line in `--help`, `open` its target; the test
/// credentials are set before the relay's SDK reads its chain.
pub(crate) const fn moto_demo(name: &'static str, help: &'static str, open: Open) -> SinkDemo {
    SinkDemo::new(moto(name), open)
        .help(help)
        .pointing(|_| use_test_credentials())
}

/// The moto server the AWS sinks' demos publish to, `name` saying which service it stands in for.
const fn moto(name: &'static str) -> Server {
    Server::Running {
        default_url: "http://127.0.0.1:5000",
        local: Some(LocalServer {
            name,
            start: "`~/.cache/outbox-relay/venv-moto/bin/moto_server -p 5000` (after scripts/ensure-moto.sh)",
        }),
    }
}

/// The relay runs in the demo's process and its SDK takes credentials from its chain: test ones,
/// and no session or profile that could name a real account. Set before any thread exists.
fn use_test_credentials() {
    std::env::set_var("AWS_ACCESS_KEY_ID", TEST_KEY);
    std::env::set_var("AWS_SECRET_ACCESS_KEY", TEST_KEY);
    std::env::remove_var("AWS_SESSION_TOKEN");
    std::env::remove_var("AWS_PROFILE");
}

/// The AWS SDK configuration of the moto at `endpoint` (the demo consumers' SQS, SNS and Kinesis
/// clients alike): the test credentials, rustls with ring like the relay.
pub(crate) fn moto_config(endpoint: &str) -> aws_config::SdkConfig {
    aws_config::SdkConfig::builder()
        .behavior_version(aws_config::BehaviorVersion::latest())
        .region(aws_config::Region::new(REGION))
        .endpoint_url(endpoint)
        .credentials_provider(aws_credential_types::provider::SharedCredentialsProvider::new(
            aws_credential_types::Credentials::new(TEST_KEY, TEST_KEY, None, None, "demo"),
        ))
        .http_client(
            aws_smithy_http_client::Builder::new()
                .tls_provider(aws_smithy_http_client::tls::Provider::Rustls(
                    aws_smithy_http_client::tls::rustls_provider::CryptoMode::Ring,
                ))
                .build_https(),
        )
        .build()
}

/// One SDK call of a demo consumer's (`send`: the request's `send()`), bounded as every step of
/// the demo is ([`bounded`], `broker` and `what` naming it), its error in the SDK's full words.
pub(crate) async fn sdk_call<T, E: std::error::Error>(
    broker: &str,
    what: &str,
    send: impl Future<Output = Result<T, E>>,
) -> Result<T, String> {
    bounded(broker, what, async {
        send.await.map_err(|e| DisplayErrorContext(e).to_string())
    })
    .await
}

/// What an AWS sink's demo target knows: the moto server (`--sink-url`) and the run's prefix of
/// the queue, topic or stream names its consumer makes.
pub(crate) struct MotoRun {
    pub(crate) endpoint: String,
    pub(crate) prefix: String,
}

impl MotoRun {
    /// The moto at `endpoint` (`--sink-url`; `None`: the default) for `run`.
    pub(crate) fn of(endpoint: Option<String>, run: &DemoRun) -> MotoRun {
        MotoRun {
            endpoint: endpoint.unwrap_or_default(),
            prefix: container(run),
        }
    }

    /// The section of a message service's demo (`[sqs]`, `[sns]`): this moto, FIFO queues or
    /// topics of the run's own (`prefix`), which the consumer makes (`setup` creates none). Their
    /// names allow no `.` but the `.fifo` suffix: `order.placed` becomes `<prefix>-order-placed.fifo`.
    pub(crate) fn fifo_config(&self) -> DemoConfig {
        let prefix = &self.prefix;
        DemoConfig {
            keys: format!(
                "region = \"{REGION}\"\nendpoint_url = {}\nfifo = true\n",
                toml_string(&self.endpoint)
            ),
            route: Some(format!(
                "topic_regex = '(?<head>[^.]*)\\.(?<tail>.*)'\ntopic_replacement = \"{prefix}-${{head}}-${{tail}}.fifo\"\n"
            )),
        }
    }
}
