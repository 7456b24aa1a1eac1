//! A topic's configuration, asked through a client the caller already has.
//!
//! The producer reads `max.message.bytes` (`topic_limit.rs`) without waiting: it starts a
//! [`Describe`] at a topic's first record and polls it, never blocking, on later sends. The
//! read-back reads its timestamp bound (`tail.rs`) on its own thread, waiting
//! ([`describe_topic`]). rdkafka's `AdminClient` would be one more client with its own
//! connections to every broker; librdkafka answers DescribeConfigs on any client handle, so the
//! producer's or the reader's own is asked.
//!
//! Invariant: every librdkafka object made here is destroyed here, once, whatever the answer;
//! an answer after the caller gave up lands in a queue only librdkafka still holds.

use std::collections::HashMap;
use std::ffi::{c_char, CStr, CString};
use std::time::Duration;

use rdkafka::client::{Client, ClientContext};
use rdkafka_sys as rdsys;

/// A topic's effective configuration (its own values and the brokers' defaults), or why the
/// cluster did not give it.
pub(super) type TopicConfig = Result<HashMap<String, String>, String>;

/// One DescribeConfigs request for a topic, in flight: its answer arrives on a queue of its own.
pub(super) struct Describe {
    queue: *mut rdsys::rd_kafka_queue_t,
}

// SAFETY: a librdkafka queue may be polled and destroyed from any thread; nothing else is held.
#[allow(unsafe_code)]
unsafe impl Send for Describe {}

#[allow(unsafe_code)] // rdkafka wraps DescribeConfigs only on its AdminClient.
impl Describe {
    /// Sends the request on `client`'s connections; the broker's answer, or librdkafka's own
    /// after `timeout`, is then [`poll`](Self::poll)ed. The client must outlive the request:
    /// the publisher drops its requests before its own reference to the producer.
    pub(super) fn start<C: ClientContext>(
        client: &Client<C>,
        topic: &str,
        timeout: Duration,
    ) -> Result<Describe, String> {
        let name = CString::new(topic).map_err(|_| format!("topic name {topic:?} holds a NUL byte"))?;
        let rk = client.native_ptr();
        let timeout_ms = timeout.as_millis().min(i32::MAX as u128) as i32;
        // SAFETY: `rk` is the live handle `client` borrows. librdkafka copies the resource and
        // the options into its request and keeps its own reference to the queue: both are
        // destroyed here, the queue when the request is dropped.
        unsafe {
            let queue = rdsys::rd_kafka_queue_new(rk);
            let options =
                rdsys::rd_kafka_AdminOptions_new(rk, rdsys::rd_kafka_admin_op_t::RD_KAFKA_ADMIN_OP_DESCRIBECONFIGS);
            let mut errstr = [0 as c_char; 256];
            rdsys::rd_kafka_AdminOptions_set_request_timeout(options, timeout_ms, errstr.as_mut_ptr(), errstr.len());
            let mut resource = rdsys::rd_kafka_ConfigResource_new(
                rdsys::rd_kafka_ResourceType_t::RD_KAFKA_RESOURCE_TOPIC,
                name.as_ptr(),
            );
            rdsys::rd_kafka_DescribeConfigs(rk, &mut resource, 1, options, queue);
            rdsys::rd_kafka_ConfigResource_destroy(resource);
            rdsys::rd_kafka_AdminOptions_destroy(options);
            Ok(Describe { queue })
        }
    }

    /// The answer, if it arrives within `wait` (`Duration::ZERO`: only if it is there).
    pub(super) fn poll(&self, wait: Duration) -> Option<TopicConfig> {
        let string = |p: *const c_char| {
            // SAFETY: librdkafka's strings are NUL-terminated and live as long as their event.
            (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
        };
        // SAFETY: the queue is live until `drop`. Entries are copied out before their event is
        // destroyed, once, below.
        unsafe {
            let event = rdsys::rd_kafka_queue_poll(self.queue, wait.as_millis().min(i32::MAX as u128) as i32);
            if event.is_null() {
                return None;
            }
            let answer = if rdsys::rd_kafka_event_error(event) != rdsys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR
            {
                Err(string(rdsys::rd_kafka_event_error_string(event)).unwrap_or_else(|| "request failed".to_owned()))
            } else {
                let result = rdsys::rd_kafka_event_DescribeConfigs_result(event);
                let mut n = 0;
                let resources = if result.is_null() {
                    std::ptr::null_mut()
                } else {
                    rdsys::rd_kafka_DescribeConfigs_result_resources(result, &mut n)
                };
                match (0..n).map(|i| *resources.add(i)).next() {
                    None => Err("no answer for the topic".to_owned()),
                    Some(r)
                        if rdsys::rd_kafka_ConfigResource_error(r)
                            != rdsys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR =>
                    {
                        Err(string(rdsys::rd_kafka_ConfigResource_error_string(r))
                            .unwrap_or_else(|| "refused".to_owned()))
                    }
                    Some(r) => {
                        let mut m = 0;
                        let entries = rdsys::rd_kafka_ConfigResource_configs(r, &mut m);
                        Ok((0..m)
                            .map(|i| *entries.add(i))
                            .filter_map(|e| {
                                Some((
                                    string(rdsys::rd_kafka_ConfigEntry_name(e))?,
                                    string(rdsys::rd_kafka_ConfigEntry_value(e))?,
                                ))
                            })
                            .collect())
                    }
                }
            };
            rdsys::rd_kafka_event_destroy(event);
            Some(answer)
        }
    }
}

impl Drop for Describe {
    #[allow(unsafe_code)]
    fn drop(&mut self) {
        // SAFETY: made in `start`, destroyed only here; an answer still to come is dropped by
        // librdkafka with its own reference.
        unsafe { rdsys::rd_kafka_queue_destroy(self.queue) }
    }
}

/// The controller the client's metadata names, which librdkafka sends DescribeConfigs to
/// (`None`: none yet). Not looked up: what the client knows now.
#[allow(unsafe_code)]
pub(super) fn controller_id<C: ClientContext>(client: &Client<C>) -> Option<i32> {
    // SAFETY: `client` borrows a live handle; a timeout of 0 reads librdkafka's cached value.
    let id = unsafe { rdsys::rd_kafka_controllerid(client.native_ptr(), 0) };
    (id >= 0).then_some(id)
}

/// The topic's configuration, waiting for it on the caller's thread, at most `timeout` (and
/// half a second for librdkafka's own timeout answer).
pub(super) fn describe_topic<C: ClientContext>(client: &Client<C>, topic: &str, timeout: Duration) -> TopicConfig {
    Describe::start(client, topic, timeout)?
        .poll(timeout + Duration::from_millis(500))
        .unwrap_or_else(|| Err(format!("no answer within {} ms", timeout.as_millis())))
}

#[cfg(test)]
mod tests {
    //! The answer itself is read from real brokers: `tests/it/failures.rs`
    //! (`the_relays_size_check_draws_the_line_where_the_broker_does`) and the read-back's timestamp
    //! bound (`tests/it/nemesis.rs`); librdkafka's mock cluster has no controller to ask.

    use rdkafka::producer::{BaseProducer, Producer};
    use rdkafka::ClientConfig;

    use super::*;

    #[test]
    fn an_unreachable_cluster_is_an_error_within_the_timeout() {
        let p: BaseProducer = ClientConfig::new()
            .set("bootstrap.servers", "127.0.0.1:1")
            .create()
            .expect("producer");
        let started = std::time::Instant::now();
        let answer = describe_topic(p.client(), "nowhere", Duration::from_millis(300));
        assert!(answer.is_err(), "{answer:?}");
        assert!(started.elapsed() < Duration::from_secs(3), "{:?}", started.elapsed());
    }
}
