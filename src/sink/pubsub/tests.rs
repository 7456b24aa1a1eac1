//! The Pub/Sub adapter's decisions without a server: how each answer of the service is
//! classified, and where the client connects. The end-to-end behaviour (emulator, kills,
//! outages, bad events) is in tests/it/sink_pubsub.rs.

use std::sync::Arc;
use std::time::Duration;

use google_cloud_gax::error::rpc::{Code, Status};
use google_cloud_pubsub::error::PublishError;

use super::config::PubSubSettings;
use super::exchange::PubSubExchange;
use super::*;
use crate::sink::driver::{Exchange, Outcome, Protocol};
use crate::sink::requests::Requests;
use crate::sink::Handover;

fn settings() -> PubSubSettings {
    PubSubSettings {
        project: "test-project".into(),
        topics: vec![],
        requests: Requests {
            max_concurrency: 4,
            max_requests: usize::MAX,
            timeout: Duration::from_millis(500),
        },
    }
}

/// An exchange whose client points at a closed loopback port (gRPC connects lazily; nothing is
/// sent by these tests).
async fn exchange() -> PubSubExchange {
    let endpoint = Endpoint::Emulator("127.0.0.1:9".into());
    let base = connect_to(&settings(), &endpoint, Duration::from_secs(10))
        .await
        .expect("a lazy client");
    PubSubExchange::new(base, &settings(), None)
}

fn rpc(code: Code, message: &str) -> PublishError {
    PublishError::Rpc(Arc::new(google_cloud_pubsub::Error::service(
        Status::default().set_code(code).set_message(message),
    )))
}

#[tokio::test]
async fn invalid_argument_is_refused_and_the_rest_is_transient() {
    let ex = exchange().await;
    let reply = |result| exchange::Reply::for_test("orders", result);
    assert_eq!(ex.classify(reply(Ok("1".into()))), Outcome::Acknowledged);
    match ex.classify(reply(Err(rpc(Code::InvalidArgument, "bad attribute")))) {
        Outcome::Refused(cause) => assert!(
            cause.contains("projects/test-project/topics/orders") && cause.contains("bad attribute"),
            "{cause}"
        ),
        other => panic!("{other:?}"),
    }
    match ex.classify(reply(Err(rpc(Code::NotFound, "Resource not found")))) {
        Outcome::Transient(cause) => assert!(
            cause.contains("projects/test-project/topics/orders does not exist")
                && cause.contains("outbox-relay setup")
                && cause.contains("gcloud pubsub topics create orders --project test-project"),
            "{cause}"
        ),
        other => panic!("{other:?}"),
    }
    match ex.classify(reply(Err(rpc(Code::PermissionDenied, "denied")))) {
        Outcome::Transient(cause) => assert!(cause.contains("roles/pubsub.publisher"), "{cause}"),
        other => panic!("{other:?}"),
    }
    for code in [
        Code::Unavailable,
        Code::DeadlineExceeded,
        Code::ResourceExhausted,
        Code::Internal,
        Code::Aborted,
    ] {
        match ex.classify(reply(Err(rpc(code, "busy")))) {
            Outcome::Transient(cause) => assert!(cause.contains("after the client's retries"), "{cause}"),
            other => panic!("{code:?}: {other:?}"),
        }
    }
    assert!(matches!(
        ex.classify(reply(Err(PublishError::OrderingKeyPaused))),
        Outcome::Transient(_)
    ));
    assert!(matches!(
        ex.classify(reply(Err(PublishError::Shutdown))),
        Outcome::Transient(_)
    ));
}

#[tokio::test]
async fn a_publish_to_an_unreachable_service_fails_transient_within_the_retry_window() {
    // Port 9 on loopback: nothing listens. The client retries the connection failure until the
    // retry window (500 ms here) ends, then the record fails transient.
    let ex = exchange().await;
    let record = crate::sink::memory::record("orders", b"agg", b"{}", b"e1");
    let out = ex.encode(Handover::of(&record)).unwrap();
    let reply = ex.send(out).await.expect("handed over");
    let reply = tokio::time::timeout(Duration::from_secs(20), reply)
        .await
        .expect("the retry window bounds the publish");
    match ex.classify(reply) {
        Outcome::Transient(cause) => assert!(cause.contains("projects/test-project/topics/orders"), "{cause}"),
        other => panic!("{other:?}"),
    }
    // The client paused the key after that failure; the reply future resumed it (the driver's
    // fence holds the key from there): the key's next publish is attempted again, not refused
    // as "paused".
    let again = ex
        .send(ex.encode(Handover::of(&record)).unwrap())
        .await
        .expect("handed over");
    let again = tokio::time::timeout(Duration::from_secs(20), again)
        .await
        .expect("bounded");
    match ex.classify(again) {
        Outcome::Transient(cause) => assert!(
            cause.contains("failed") && !cause.contains("paused"),
            "the key was resumed: {cause}"
        ),
        other => panic!("{other:?}"),
    }
}

#[test]
fn the_emulator_host_is_plain_text_without_credentials() {
    assert_eq!(
        Endpoint::Emulator("127.0.0.1:8085".into()).url().as_deref(),
        Some("http://127.0.0.1:8085")
    );
    assert_eq!(
        Endpoint::Emulator("http://[::1]:8085".into()).url().as_deref(),
        Some("http://[::1]:8085")
    );
    assert_eq!(Endpoint::Google.url(), None);
    assert!(Endpoint::Google.shown().contains("Application Default Credentials"));
}
