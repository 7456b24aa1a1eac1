//! The two outbox schemas of the product spec, and traffic generators over them.
//!
//! Every generated event records how Postgres renders it as text (`id::text`,
//! `payload::text` via RETURNING), which is exactly what the relay should publish, so
//! tests can compare bytes without re-implementing jsonb normalisation.
//!
//! Ordering guarantee of [`run_workload`]: each aggregate is written by exactly one task,
//! one transaction at a time, so its events' commit order is the order in
//! [`Committed::by_aggregate`]. Across aggregates there is no order.

use std::collections::BTreeMap;
use std::time::Duration;

use tokio_postgres::{Client, GenericClient};

/// Which outbox table layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OutboxSchema {
    /// `public.events_outbox`: bigserial id, uuid aggregate_id, `type` routes.
    A,
    /// `public.outbox` (Debezium-style): uuid id, varchar aggregate_type/aggregate_id,
    /// `event_type`.
    B,
}

impl OutboxSchema {
    pub fn table(self) -> &'static str {
        match self {
            OutboxSchema::A => "events_outbox",
            OutboxSchema::B => "outbox",
        }
    }

    pub fn qualified_table(self) -> &'static str {
        match self {
            OutboxSchema::A => "public.events_outbox",
            OutboxSchema::B => "public.outbox",
        }
    }
}

const SCHEMA_A: &str = "
CREATE TABLE IF NOT EXISTS orders (
    id uuid PRIMARY KEY,
    customer_id uuid,
    total_cents bigint,
    status text
);
CREATE TABLE IF NOT EXISTS events_outbox (
    id bigserial PRIMARY KEY,
    aggregate_id uuid NOT NULL,
    type text NOT NULL,
    payload jsonb NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    dispatched_at timestamptz
);
CREATE INDEX IF NOT EXISTS events_outbox_undispatched
    ON events_outbox (created_at) WHERE dispatched_at IS NULL;
";

const SCHEMA_B: &str = "
CREATE TABLE IF NOT EXISTS orders (
    id uuid PRIMARY KEY,
    customer_id uuid,
    total_cents bigint,
    status text
);
CREATE TABLE IF NOT EXISTS outbox (
    id uuid PRIMARY KEY,
    aggregate_type varchar(255) NOT NULL,
    aggregate_id varchar(255) NOT NULL,
    event_type varchar(255) NOT NULL,
    payload jsonb NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    processed_at timestamptz
);
CREATE INDEX IF NOT EXISTS outbox_unprocessed
    ON outbox (created_at) WHERE processed_at IS NULL;
";

pub async fn create_schema_a(client: &Client) {
    client.batch_execute(SCHEMA_A).await.expect("schema A");
}

pub async fn create_schema_b(client: &Client) {
    client.batch_execute(SCHEMA_B).await.expect("schema B");
}

pub async fn create_schema(client: &Client, schema: OutboxSchema) {
    match schema {
        OutboxSchema::A => create_schema_a(client).await,
        OutboxSchema::B => create_schema_b(client).await,
    }
}

/// Event types cycle through these by per-aggregate sequence number.
pub const EVENT_TYPES: [&str; 4] = ["order.placed", "order.paid", "order.shipped", "order.delivered"];

/// Aggregate type written to schema B's `aggregate_type` (its routing column).
pub const AGGREGATE_TYPE: &str = "order";

/// One outbox row as Postgres renders it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExpectedEvent {
    /// `id::text` (a decimal bigint for A, a uuid for B).
    pub id: String,
    pub aggregate_id: String,
    pub event_type: String,
    /// `payload::text`: jsonb's canonical rendering (key order/spacing normalised).
    pub payload_text: String,
    /// Per-aggregate sequence number (also inside the payload as `"seq"`).
    pub seq: u64,
}

/// What [`run_workload`] committed.
#[derive(Debug, Clone, Default)]
pub struct Committed {
    /// Aggregate id → its events in commit order.
    pub by_aggregate: BTreeMap<String, Vec<ExpectedEvent>>,
}

impl Committed {
    pub fn len(&self) -> usize {
        self.by_aggregate.values().map(Vec::len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn all(&self) -> impl Iterator<Item = &ExpectedEvent> {
        self.by_aggregate.values().flatten()
    }
}

/// N transactions over M aggregates from K concurrent tasks.
#[derive(Debug, Clone)]
pub struct Workload {
    pub schema: OutboxSchema,
    /// Total transactions (N); each inserts one `orders` row and one outbox row.
    pub transactions: usize,
    /// Distinct aggregates (M); transaction j goes to aggregate j % M.
    pub aggregates: usize,
    /// Concurrent tasks (K), each with its own connection; aggregate i is task i % K's.
    pub concurrency: usize,
    /// Optional pause between a task's transactions, to spread a workload over time.
    pub pause: Duration,
}

impl Workload {
    pub fn new(schema: OutboxSchema, transactions: usize, aggregates: usize, concurrency: usize) -> Self {
        Workload {
            schema,
            transactions,
            aggregates,
            concurrency,
            pause: Duration::ZERO,
        }
    }
}

/// Runs `w` against the database at `db_url` (schema must exist) and returns the
/// committed events per aggregate in commit order.
pub async fn run_workload(db_url: &str, w: &Workload) -> Committed {
    assert!(w.aggregates > 0 && w.concurrency > 0, "empty workload shape");
    let aggregates: Vec<String> = (0..w.aggregates).map(|_| new_uuid()).collect();
    let mut tasks = Vec::new();
    for k in 0..w.concurrency.min(w.aggregates) {
        // This task's transactions, in the global round-robin order.
        let mine: Vec<(String, u64)> = (0..w.transactions)
            .filter(|j| (j % w.aggregates) % w.concurrency == k)
            .map(|j| (aggregates[j % w.aggregates].clone(), (j / w.aggregates) as u64))
            .collect();
        let url = db_url.to_string();
        let w = w.clone();
        tasks.push(tokio::spawn(async move {
            let mut client = connect(&url).await;
            let mut done = Vec::with_capacity(mine.len());
            for (agg, seq) in mine {
                let tx = client.transaction().await.expect("begin");
                insert_order(&tx, &agg, seq).await;
                let ev = insert_event(&tx, w.schema, &agg, seq).await;
                tx.commit().await.expect("commit");
                done.push(ev);
                if !w.pause.is_zero() {
                    tokio::time::sleep(w.pause).await;
                }
            }
            done
        }));
    }
    let mut committed = Committed::default();
    for t in tasks {
        for ev in t.await.expect("workload task panicked") {
            committed
                .by_aggregate
                .entry(ev.aggregate_id.clone())
                .or_default()
                .push(ev);
        }
    }
    committed
}

/// Inserts `count` events for `aggregate_id` in one transaction and rolls it back.
/// Returns the events that must NOT be published (ids were consumed from the sequence/
/// generated, so they can be matched exactly).
pub async fn insert_rolled_back(
    client: &mut Client,
    schema: OutboxSchema,
    aggregate_id: &str,
    count: usize,
) -> Vec<ExpectedEvent> {
    let tx = client.transaction().await.expect("begin");
    let mut evs = Vec::new();
    for seq in 0..count as u64 {
        insert_order(&tx, aggregate_id, seq).await;
        evs.push(insert_event(&tx, schema, aggregate_id, 1_000_000 + seq).await);
    }
    tx.rollback().await.expect("rollback");
    evs
}

/// One `INSERT … VALUES (…),(…),…` statement (autocommit) of `count` events for
/// `aggregate_id`, with seqs `first_seq..first_seq+count`. Returned in VALUES order.
pub async fn insert_multi_row(
    client: &Client,
    schema: OutboxSchema,
    aggregate_id: &str,
    first_seq: u64,
    count: usize,
) -> Vec<ExpectedEvent> {
    let mut sql = match schema {
        OutboxSchema::A => "INSERT INTO events_outbox (aggregate_id, type, payload) VALUES ".to_string(),
        OutboxSchema::B => {
            "INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload) VALUES ".to_string()
        }
    };
    for i in 0..count {
        let seq = first_seq + i as u64;
        let ty = event_type(seq);
        let payload = payload_json(aggregate_id, seq).replace('\'', "''");
        if i > 0 {
            sql.push(',');
        }
        match schema {
            OutboxSchema::A => sql.push_str(&format!("('{aggregate_id}'::uuid, '{ty}', '{payload}'::jsonb)")),
            OutboxSchema::B => sql.push_str(&format!(
                "(gen_random_uuid(), '{AGGREGATE_TYPE}', '{aggregate_id}', '{ty}', '{payload}'::jsonb)"
            )),
        }
    }
    sql.push_str(&format!(" RETURNING {}", returning(schema)));
    let rows = client.query(&sql, &[]).await.expect("multi-row insert");
    rows.iter()
        .zip(first_seq..)
        .map(|(r, seq)| ExpectedEvent {
            id: r.get(0),
            aggregate_id: r.get(1),
            event_type: r.get(2),
            payload_text: r.get(3),
            seq,
        })
        .collect()
}

/// Inserts one outbox event (in whatever transaction `client` is).
pub async fn insert_event(
    client: &impl GenericClient,
    schema: OutboxSchema,
    aggregate_id: &str,
    seq: u64,
) -> ExpectedEvent {
    let ty = event_type(seq);
    let payload = payload_json(aggregate_id, seq);
    let sql = match schema {
        OutboxSchema::A => format!(
            "INSERT INTO events_outbox (aggregate_id, type, payload)
             VALUES ($1::text::uuid, $2, $3::text::jsonb) RETURNING {}",
            returning(schema)
        ),
        OutboxSchema::B => format!(
            "INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload)
             VALUES (gen_random_uuid(), '{AGGREGATE_TYPE}', $1, $2, $3::text::jsonb)
             RETURNING {}",
            returning(schema)
        ),
    };
    let row = client
        .query_one(&sql, &[&aggregate_id, &ty, &payload])
        .await
        .expect("insert outbox event");
    ExpectedEvent {
        id: row.get(0),
        aggregate_id: row.get(1),
        event_type: row.get(2),
        payload_text: row.get(3),
        seq,
    }
}

async fn insert_order(client: &impl GenericClient, aggregate_id: &str, seq: u64) {
    client
        .execute(
            "INSERT INTO orders (id, customer_id, total_cents, status)
             VALUES ($1::text::uuid, $2::text::uuid, $3, $4)",
            &[&new_uuid(), &aggregate_id, &(1000 + seq as i64), &event_type(seq)],
        )
        .await
        .expect("insert order");
}

fn returning(schema: OutboxSchema) -> &'static str {
    match schema {
        OutboxSchema::A => "id::text, aggregate_id::text, type, payload::text",
        OutboxSchema::B => "id::text, aggregate_id::text, event_type::text, payload::text",
    }
}

pub fn event_type(seq: u64) -> &'static str {
    EVENT_TYPES[(seq % EVENT_TYPES.len() as u64) as usize]
}

/// The payload written for (aggregate, seq); a nested object and a non-ASCII string
/// exercise jsonb's re-rendering.
pub fn payload_json(aggregate_id: &str, seq: u64) -> String {
    serde_json::json!({
        "aggregate_id": aggregate_id,
        "seq": seq,
        "total_cents": 1000 + seq,
        "items": [{"sku": format!("sku-{seq}"), "qty": 1 + seq % 3}],
        "note": "café ✓",
    })
    .to_string()
}

/// A fresh uuid, e.g. an aggregate id (valid for both schemas).
pub fn new_uuid() -> String {
    uuid::Uuid::new_v4().to_string()
}

async fn connect(url: &str) -> Client {
    let (client, conn) = tokio::time::timeout(
        Duration::from_secs(15),
        tokio_postgres::connect(url, tokio_postgres::NoTls),
    )
    .await
    .unwrap_or_else(|_| panic!("connect {url} timed out"))
    .unwrap_or_else(|e| panic!("connect {url}: {e}"));
    tokio::spawn(async move {
        let _ = conn.await;
    });
    client
}

/// Binary payloads that are no UTF-8 (NUL, 0xFF, a lone continuation byte, a `\x` pair, a
/// broken two-byte sequence) and every byte value once, for `bytea` payload columns.
pub fn binary_payloads() -> Vec<Vec<u8>> {
    vec![
        vec![0x00, 0xFF, 0x80, 0x5C, 0x78, 0x0A, 0xC3, 0x28],
        (0..=255u8).rev().collect(),
    ]
}

/// Turns schema A's `payload` column into `bytea`, or into the domain `event_bytes` over a
/// domain over `bytea` when `domain`.
pub async fn make_payload_bytea(client: &Client, domain: bool) {
    let ty = if domain {
        "CREATE DOMAIN raw_bytes AS bytea; CREATE DOMAIN event_bytes AS raw_bytes NOT NULL; "
    } else {
        ""
    };
    let name = if domain { "event_bytes" } else { "bytea" };
    client
        .batch_execute(&format!(
            "{ty}ALTER TABLE events_outbox ALTER COLUMN payload TYPE {name} USING convert_to(payload::text, 'UTF8')"
        ))
        .await
        .expect("payload column as bytea");
}

/// Inserts one schema-A event of type `binary` with `payload` as the bytea value (bound in
/// binary, so no text form is involved); returns its id.
pub async fn insert_binary(client: &Client, payload: &[u8]) -> String {
    client
        .query_one(
            "INSERT INTO events_outbox (aggregate_id, type, payload) VALUES ($1::text::uuid, 'binary', $2::bytea) \
             RETURNING id::text",
            &[&new_uuid(), &payload],
        )
        .await
        .expect("insert a binary event")
        .get(0)
}

/// Inserts one binary event per [`binary_payloads`] payload; (event id, payload) each.
pub async fn insert_binary_payloads(client: &Client) -> Vec<(String, Vec<u8>)> {
    let mut inserted = Vec::new();
    for payload in binary_payloads() {
        inserted.push((insert_binary(client, &payload).await, payload));
    }
    inserted
}

/// Collects topic `binary` (waiting up to `timeout`) and asserts it holds exactly `expected`
/// (event id → payload bytes); `log` is printed on failure.
pub async fn expect_binary(
    bootstrap: &str,
    expected: &[(String, Vec<u8>)],
    timeout: Duration,
    log: impl FnOnce() -> String,
) {
    let records = crate::harness::collect(bootstrap, &["binary"], expected.len(), timeout).await;
    let got: BTreeMap<String, Vec<u8>> = records
        .iter()
        .map(|r| {
            (
                crate::harness::fault_support::id_of(r),
                r.payload.clone().unwrap_or_default(),
            )
        })
        .collect();
    let want: BTreeMap<String, Vec<u8>> = expected.iter().cloned().collect();
    let log = log();
    assert_eq!(records.len(), expected.len(), "log:\n{log}");
    assert_eq!(got, want, "log:\n{log}");
}
