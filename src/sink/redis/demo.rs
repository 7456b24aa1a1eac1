//! Redis Streams' half of `outbox-relay demo`: the relay publishes to a running server
//! (`--sink-url`), into a stream key of the run's own (the routed topic). The consumer reads it
//! from the start with XRANGE, counting by the `id` field; the stream's length (XLEN) is what the broker
//! reports as published. At the end it deletes the key.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;
use redis::Value;

use super::config::RedisSettings;
use crate::config::sink::SinkSettings;
use crate::sink::demo::{
    bounded, cleaned_up, parse_id, start, toml_string, DemoConfig, DemoConsumer, DemoRun, DemoTarget, Server, SinkDemo,
    Starting, Tally,
};

const BROKER: &str = "Redis";
const IDLE: Duration = Duration::from_millis(10);
const REFRESH: Duration = Duration::from_secs(1);
const BATCH: usize = 500;

pub(crate) struct RedisConsumer {
    connection: MultiplexedConnection,
    key: String,
}

impl RedisConsumer {
    pub(crate) async fn new(url: &str, key: &str) -> Result<RedisConsumer, String> {
        let client = redis::Client::open(url).map_err(|e| format!("Redis, the URL: {e}"))?;
        let connection = bounded(BROKER, "connecting", client.get_multiplexed_async_connection()).await?;
        Ok(RedisConsumer {
            connection,
            key: key.to_owned(),
        })
    }

    /// The next entries after `after` (`-` for the first): entry id, `id` field, `payload` field.
    #[allow(clippy::type_complexity)]
    async fn batch(&self, after: &str) -> Result<Vec<(String, Option<i64>, Option<Vec<u8>>)>, String> {
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

impl DemoConsumer for RedisConsumer {
    /// Reads until `stop`, then deletes the stream key; returns what it cleaned up.
    async fn run(self, tally: Arc<dyn Tally>, stop: Arc<AtomicBool>) -> Vec<String> {
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
                    tally.published(n);
                }
            }
            if stop.load(Ordering::Relaxed) {
                break;
            }
            match self.batch(&last).await {
                Ok(entries) if entries.is_empty() => tokio::time::sleep(IDLE).await,
                Ok(entries) => {
                    for (entry_id, id, payload) in entries {
                        tally.record(id, payload.as_deref());
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
        vec![cleaned_up(deleted, format!("Redis stream {} deleted", self.key))]
    }
}

/// Redis's answers to the demo.
pub(crate) const DEMO: SinkDemo = SinkDemo::new(Server::running("redis://127.0.0.1:6379"), open);

fn open(url: Option<String>, run: &DemoRun) -> Result<Box<dyn DemoTarget>, String> {
    Ok(Box::new(RedisTarget {
        url: url.unwrap_or_default(),
        run_id: run.id.clone(),
    }))
}

/// The server and the run.
struct RedisTarget {
    url: String,
    run_id: String,
}

impl DemoTarget for RedisTarget {
    /// The stream key is the routed topic, one per run so nothing older is read.
    fn config(&self) -> DemoConfig {
        let keys = format!("url = {}\n", toml_string(&self.url));
        DemoConfig::routed(keys, &format!("outbox-relay-demo:{}:${{routedByValue}}", self.run_id))
    }

    /// The URL as the settings print it: any password masked.
    fn describe(&self, sink: &SinkSettings) -> String {
        match sink.section::<RedisSettings>() {
            Some(r) => format!("Redis {}", r.url),
            None => "Redis".to_owned(),
        }
    }

    fn consume<'a>(&'a self, topic: &'a str, tally: Arc<dyn Tally>, stop: Arc<AtomicBool>) -> Starting<'a> {
        start(RedisConsumer::new(&self.url, topic), tally, stop)
    }
}
