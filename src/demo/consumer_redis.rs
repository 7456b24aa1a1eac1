//! The demo's Redis Streams consumer: reads the run's stream key (the routed topic) from the
//! start with XRANGE, counting by the `id` field; the stream's length (XLEN) is what the broker
//! reports as published. At the end it deletes the key.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;
use redis::Value;

use super::consumer::bounded;
use super::consumer::{parse_id, record_event};
use super::stats::Stats;
use super::DemoError;

const BROKER: &str = "Redis";
const IDLE: Duration = Duration::from_millis(10);
const REFRESH: Duration = Duration::from_secs(1);
const BATCH: usize = 500;

pub(crate) struct RedisConsumer {
    connection: MultiplexedConnection,
    key: String,
    run_id: String,
}

impl RedisConsumer {
    pub(crate) async fn new(url: &str, key: &str, run_id: &str) -> Result<RedisConsumer, DemoError> {
        let client = redis::Client::open(url).map_err(|e| DemoError::Sink(format!("Redis, the URL: {e}")))?;
        let connection = bounded(BROKER, "connecting", client.get_multiplexed_async_connection()).await?;
        Ok(RedisConsumer {
            connection,
            key: key.to_owned(),
            run_id: run_id.to_owned(),
        })
    }

    /// Reads until `stop`, then deletes the stream key; returns what it cleaned up.
    pub(crate) async fn run(self, stats: Arc<Stats>, stop: Arc<AtomicBool>) -> Vec<String> {
        let mut last = "-".to_owned();
        let mut next_refresh = Instant::now();
        loop {
            if Instant::now() >= next_refresh || stop.load(Ordering::Relaxed) {
                next_refresh = Instant::now() + REFRESH;
                let mut c = self.connection.clone();
                if let Ok(n) = bounded(
                    BROKER,
                    "XLEN",
                    redis::cmd("XLEN").arg(&self.key).query_async::<u64>(&mut c),
                )
                .await
                {
                    stats.published.store(n, Ordering::Relaxed);
                }
            }
            if stop.load(Ordering::Relaxed) {
                break;
            }
            match self.batch(&last).await {
                Ok(entries) if entries.is_empty() => tokio::time::sleep(IDLE).await,
                Ok(entries) => {
                    for (entry_id, id, payload) in entries {
                        record_event(&stats, &self.run_id, id, payload.as_deref());
                        last = format!("({entry_id}");
                    }
                }
                Err(e) => {
                    eprintln!("demo: the Redis consumer stopped: {e}");
                    break;
                }
            }
        }
        let mut c = self.connection.clone();
        let deleted = bounded(
            BROKER,
            "DEL",
            redis::cmd("DEL").arg(&self.key).query_async::<u64>(&mut c),
        )
        .await;
        vec![match deleted {
            Ok(_) => format!("Redis stream {} deleted", self.key),
            Err(e) => format!("FAILED: {e}"),
        }]
    }

    /// The next entries after `after` (`-` for the first): entry id, `id` field, `payload` field.
    #[allow(clippy::type_complexity)]
    async fn batch(&self, after: &str) -> Result<Vec<(String, Option<i64>, Option<Vec<u8>>)>, DemoError> {
        let mut c = self.connection.clone();
        let v: Value = bounded(
            BROKER,
            "XRANGE",
            redis::cmd("XRANGE")
                .arg(&self.key)
                .arg(after)
                .arg("+")
                .arg("COUNT")
                .arg(BATCH)
                .query_async(&mut c),
        )
        .await?;
        let Value::Array(entries) = v else {
            return Ok(Vec::new());
        };
        let mut out = Vec::with_capacity(entries.len());
        for entry in entries {
            let Value::Array(parts) = entry else { continue };
            let (Some(entry_id), Some(Value::Array(fields))) = (parts.first(), parts.get(1)) else {
                continue;
            };
            let Ok(entry_id) = redis::from_redis_value_ref::<String>(entry_id) else {
                continue;
            };
            let (mut id, mut payload) = (None, None);
            for pair in fields.chunks(2) {
                let [name, value] = pair else { continue };
                let Ok(name) = redis::from_redis_value_ref::<String>(name) else {
                    continue;
                };
                let value: Option<Vec<u8>> = redis::from_redis_value_ref(value).ok();
                match name.as_str() {
                    "id" => id = value.as_deref().and_then(parse_id),
                    "payload" => payload = value,
                    _ => {}
                }
            }
            out.push((entry_id, id, payload));
        }
        Ok(out)
    }
}
