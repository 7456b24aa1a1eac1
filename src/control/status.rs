//! `status`: what the server says about the relay's slot and publication.
//!
//! Status never fails because something is missing or misconfigured — a missing slot is
//! `"exists": false`, a wrong `wal_level` is just reported — so it is the tool to look with
//! when `setup` or `run` refuses. Only an unreachable server or a failed query is an error.
//!
//! # JSON (`status --json`), schema version 1
//!
//! Stable: fields are only ever added, never renamed, removed or retyped, without bumping
//! `schema_version`. Every field is always present; unknown values are `null`. LSNs are strings
//! in PostgreSQL's `X/Y` hex form; byte counts are integers.
//!
//! ```json
//! {
//!   "schema_version": 1,
//!   "postgres_url": "postgres://relay:********@db:5432/app",   // password always masked
//!   "server": {
//!     "version": "15.20",              // server_version without distribution suffix
//!     "version_num": 150020,           // server_version_num
//!     "database": "app",               // current_database()
//!     "wal_level": "logical",
//!     "in_recovery": false,            // true on a standby
//!     "current_wal_lsn": "0/1A2B3C4"   // insert position (replay position on a standby); null if unknown
//!   },
//!   "outbox_table": { "schema": "public", "table": "events_outbox" },   // the first of outbox.table, unquoted
//!   "outbox_tables": [{                // every table of outbox.table, in its order
//!     "schema": "public", "table": "events_outbox",
//!     "in_publication": true,          // the publication publishes it (directly, by schema or FOR ALL TABLES)
//!                                      // and its figures (control/status_tables.rs):
//!     "estimated_rows": 120000,        // the planner's estimate (reltuples, summed over partitions);
//!                                      // null before the first ANALYZE
//!     "size_bytes": 52428800,          // pg_total_relation_size over every partition
//!     "partitioned": false,
//!     "oldest_row": "2026-11-18T09:12:00.000000Z",   // min(timestamp column); null when empty
//!     "oldest_row_age_seconds": 604800.0,
//!     "retention": "delete, keep 604800 s, every 60 s",   // [retention] as configured; null: off
//!     "last_retention": {              // retention's record table; null: no run recorded
//!       "last_run_at": "2026-11-25T12:00:00.000000Z",
//!       "last_removed_at": "2026-11-25T11:59:00.000000Z",
//!       "last_removed_rows": 5000, "last_removed_partitions": 0,
//!       "last_removed_through": "2026-11-18T09:11:00.000000Z",   // newest timestamp removed
//!       "total_removed_rows": 900000,
//!       "detached_partition": null     // a partition detached and waiting for the slot
//!     },
//!     "error": null                    // what could not be read, and why
//!   }],
//!   "slot": {
//!     "name": "outbox_relay",
//!     "exists": true,
//!     "slot_type": "logical",          // "logical" | "physical" | null (missing)
//!     "plugin": "pgoutput",            // null for physical / missing
//!     "database": "app",               // null for physical / missing
//!     "active": false,
//!     "active_pid": null,              // pid of the process streaming from the slot
//!     "confirmed_flush_lsn": "0/1A2B000",  // everything before it was acknowledged by Kafka
//!     "restart_lsn": "0/1A2A000",      // oldest WAL the slot keeps
//!     "retained_wal_bytes": 16777216,  // current_wal_lsn - restart_lsn: WAL kept on disk for the slot
//!     "lag_bytes": 3012,               // current_wal_lsn - confirmed_flush_lsn: not yet relayed
//!     "wal_status": "reserved",        // PostgreSQL 13+: reserved | extended | unreserved | lost; else null
//!     "safe_wal_size": null,           // PostgreSQL 13+: bytes until max_slot_wal_keep_size invalidates
//!                                      // the slot; null when unlimited or unknown
//!     "failover": true                 // PostgreSQL 17+: a failover slot; null before 17 or when missing
//!   },
//!   "failover": {                      // would the slot survive promoting a standby? (control/failover.rs)
//!     "supported": true,               // the server is 17+
//!     "mode": "auto",                  // postgres.failover_slot
//!     "synchronized_standby_slots": ["standby1"],
//!     "standbys": [{                   // every other host of postgres.url, looked at directly
//!       "host": "db2:5432", "reachable": true, "in_recovery": true,
//!       "slot_synced": true,           // its copy of the slot is synchronized from the primary
//!       "confirmed_flush_lsn": "0/1A2A000",
//!       "behind_bytes": 4096,          // primary's confirmed_flush_lsn minus the copy's (republished on promotion)
//!       "error": null                  // why it could not be looked at
//!     }],
//!     "ready": true,                   // failover slot, a synchronized copy, synchronized_standby_slots set
//!     "reasons": []                    // why not, one sentence each
//!   },
//!   "streaming": {                     // large transactions before their commit (postgres/replication/protocol.rs)
//!     "mode": "auto",                  // postgres.streaming
//!     "protocol": "pgoutput 2, streaming on (large transactions as they are written)",
//!                                      // what a session on this server asks for; null: refused (mode "on" before 14)
//!     "on": true,                      // streaming in-progress transactions
//!     "spill_txns": 0, "spill_bytes": 0,       // pg_stat_replication_slots (14+; null before or without the slot):
//!     "stream_txns": 3, "stream_bytes": 105600000   // what the walsender spilled to the server's disk / streamed
//!   },
//!   "publication": {
//!     "name": "outbox_relay",
//!     "exists": true,
//!     "all_tables": false,             // FOR ALL TABLES
//!     "publish": ["insert"],           // subset of insert, update, delete, truncate
//!     "tables": [{ "schema": "public", "table": "events_outbox" }],   // pg_publication_tables
//!     "includes_outbox_table": true    // every outbox table (outbox_tables says which one is missing)
//!   },
//!   "sink": {                          // the broker events go to ([sink] kind), looked at directly
//!     "kind": "kafka",
//!     "reachable": true,
//!     "detail": "reachable: 3 broker(s), 12 topic(s)"   // or why it could not be reached
//!   },
//!   "filter": {                        // [filter] and the publication's row filter (15+)
//!     "summary": "filter: include [\"order.*\"]; publication row filter: \"public\".\"events_outbox\": WHERE …",
//!     "in_sync": true                  // false: config and publication differ (a health warning)
//!   },
//!   "relay": {                         // the relay on this host, asked at http.listen (GET /readyz);
//!                                      // null when http.listen is not set
//!     "address": "127.0.0.1:9187",
//!     "reachable": true,               // false: nothing answered there (no relay running here)
//!     "ready": false,                  // its /readyz verdict; null when unreachable
//!     "detail": "exactly-once takeover fence: … until 2026-11-25T17:24:07.000000Z (4.2 s left): …"
//!                                      // /readyz's reason, without the verdict "ready" carries
//!   },
//!   "health": {                        // ok / warn / critical and why (control/status_health.rs)
//!     "verdict": "ok",                 // ok | warn | critical
//!     "reasons": [],                   // one sentence per finding, most severe first; [] when ok
//!     "lag_seconds": 0.42,             // pg_stat_replication.flush_lag of the walsender streaming from the
//!                                      // slot: WAL written → confirmed by the relay (after Kafka acked);
//!                                      // null when no relay streams or there was no recent traffic
//!     "last_status_update_seconds": 0.3,   // since the streaming relay's last status update; null if none
//!                                      // or hidden from the role (details_hidden)
//!     "details_hidden": null,          // why lag_seconds and last_status_update_seconds are null although a
//!                                      // relay streams: the role cannot see the walsender's replies, with the
//!                                      // GRANT pg_read_all_stats that lets it; null otherwise
//!     "thresholds": {                  // what the verdict used (see control/status_health.rs)
//!       "lag_warn_seconds": 60,        // http.ready_max_lag_seconds
//!       "lag_critical_seconds": 600,   // 10 × that
//!       "retained_wal_warn_bytes": 1073741824,      // relay.retained_wal_warn_bytes; null when 0 (off)
//!       "retained_wal_critical_bytes": 4294967296,  // 4 × that
//!       "safe_wal_critical_ratio": 0.2 // critical when safe_wal_size < 20 % of the slot's WAL budget
//!     }
//!   }
//! }
//! ```

use std::fmt;

use serde::{Deserialize, Serialize};

use super::catalog;
use super::status_health::{self, Facts, HealthStatus, Thresholds, WalsenderLag};
pub use super::status_tables::TableFigures;
use super::{connect, human_bytes, ControlError};
use crate::config::Settings;
use crate::postgres::lsn::Lsn;

/// The current version of the JSON schema above.
pub const STATUS_SCHEMA_VERSION: u32 = 1;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StatusReport {
    pub schema_version: u32,
    pub postgres_url: String,
    pub server: ServerStatus,
    /// The first configured outbox table (kept for readers of schema version 1 from before
    /// `outbox.table` took a list); `outbox_tables` has them all.
    pub outbox_table: TableRef,
    #[serde(default)]
    pub outbox_tables: Vec<OutboxTableStatus>,
    pub slot: SlotStatus,
    pub publication: PublicationStatus,
    pub health: HealthStatus,
    pub failover: FailoverStatus,
    /// The relay on this host, as its own `/readyz` says (`None`: `http.listen` not set).
    pub relay: Option<LocalRelay>,
    pub sink: SinkStatus,
    /// `[filter]` and the publication's row filter.
    #[serde(default)]
    pub filter: FilterStatus,
    /// `postgres.streaming` and what the server did with large transactions.
    #[serde(default)]
    pub streaming: StreamingStatus,
}

/// Whether large transactions are streamed before their commit, and the slot's spill and stream
/// counters (`pg_stat_replication_slots`, PostgreSQL 14+).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamingStatus {
    /// `postgres.streaming`.
    pub mode: String,
    /// What a session asks for on this server; `None`: `mode = "on"` on a server before 14.
    pub protocol: Option<String>,
    pub on: bool,
    pub spill_txns: Option<i64>,
    pub spill_bytes: Option<i64>,
    pub stream_txns: Option<i64>,
    pub stream_bytes: Option<i64>,
}

impl StreamingStatus {
    fn render(&self, f: &mut String) -> fmt::Result {
        use fmt::Write as _;
        match &self.protocol {
            Some(protocol) => write!(f, "streaming: {protocol} (postgres.streaming = {})", self.mode)?,
            None => write!(
                f,
                "streaming: REFUSED: postgres.streaming = {} needs PostgreSQL 14+ (run fails; set it to auto)",
                self.mode
            )?,
        }
        if let (Some(spill_txns), Some(spill), Some(stream_txns), Some(stream)) =
            (self.spill_txns, self.spill_bytes, self.stream_txns, self.stream_bytes)
        {
            write!(
                f,
                "; the server spilled {spill_txns} transaction(s) ({}) to its disk and streamed {stream_txns} ({})",
                human_bytes(spill),
                human_bytes(stream)
            )?;
        }
        writeln!(f)
    }
}

/// `status`'s streaming section: the protocol a session chooses here, and the slot's counters.
async fn streaming_status(
    settings: &Settings,
    client: &tokio_postgres::Client,
    server: &catalog::ServerInfo,
    slot_exists: bool,
) -> Result<StreamingStatus, ControlError> {
    use crate::postgres::replication::protocol::Protocol;
    let protocol = Protocol::choose(
        settings.postgres.streaming,
        u32::try_from(server.version_num).unwrap_or(0),
    )
    .ok();
    let mut status = StreamingStatus {
        mode: settings.postgres.streaming.as_str().to_owned(),
        protocol: protocol.map(|p| p.describe().to_owned()),
        on: protocol.is_some_and(|p| p.streams()),
        ..StreamingStatus::default()
    };
    if server.version_num >= 140_000 && slot_exists {
        let row = client
            .query_opt(
                "SELECT spill_txns, spill_bytes, stream_txns, stream_bytes FROM pg_stat_replication_slots \
                 WHERE slot_name = $1",
                &[&settings.postgres.slot.as_str()],
            )
            .await
            .map_err(ControlError::query("reading pg_stat_replication_slots"))?;
        if let Some(row) = row {
            status.spill_txns = row.get(0);
            status.spill_bytes = row.get(1);
            status.stream_txns = row.get(2);
            status.stream_bytes = row.get(3);
        }
    }
    Ok(status)
}

/// `[filter]` as configured and as the publication applies it (PostgreSQL 15+ row filters).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FilterStatus {
    /// One line: the configured filter and the row filter in force per outbox table.
    pub summary: String,
    /// Whether the publication filters as the configuration says (always on 14: nothing to
    /// differ, the relay applies the filter).
    pub in_sync: bool,
}

/// The broker events go to, looked at directly (`crate::sink::probe`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SinkStatus {
    /// `[sink] kind`.
    pub kind: String,
    pub reachable: bool,
    /// What it looks like, or why it could not be reached.
    pub detail: String,
}

/// What the relay listening at `http.listen` says about itself: streaming, standing by, or
/// held by an exactly-once takeover's fence (which the server cannot show).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LocalRelay {
    pub address: String,
    pub reachable: bool,
    pub ready: Option<bool>,
    /// `/readyz`'s body, or why it could not be asked.
    pub detail: String,
}

/// How long `status` waits for the local relay's `/readyz`.
const READYZ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

/// Asks the relay at `listen` (`0.0.0.0` / `::` mean this host) for `/readyz`.
async fn local_relay(listen: std::net::SocketAddr) -> LocalRelay {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut addr = listen;
    if addr.ip().is_unspecified() {
        addr.set_ip(if addr.is_ipv4() {
            std::net::Ipv4Addr::LOCALHOST.into()
        } else {
            std::net::Ipv6Addr::LOCALHOST.into()
        });
    }
    let ask = async {
        let mut stream = tokio::net::TcpStream::connect(addr).await?;
        stream
            .write_all(format!("GET /readyz HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").as_bytes())
            .await?;
        let mut response = Vec::new();
        stream.take(64 * 1024).read_to_end(&mut response).await?;
        Ok::<_, std::io::Error>(String::from_utf8_lossy(&response).into_owned())
    };
    let address = addr.to_string();
    match tokio::time::timeout(READYZ_TIMEOUT, ask).await {
        Ok(Ok(response)) => {
            let (ready, detail) = readyz_answer(&response);
            LocalRelay {
                address,
                reachable: true,
                ready,
                detail,
            }
        }
        Ok(Err(e)) => LocalRelay {
            address,
            reachable: false,
            ready: None,
            detail: format!("no relay answered: {e}"),
        },
        Err(_) => LocalRelay {
            address,
            reachable: false,
            ready: None,
            detail: format!("no answer within {} s", READYZ_TIMEOUT.as_secs()),
        },
    }
}

/// `/readyz`'s verdict (its status code) and its reason: the body without the verdict it starts
/// with (`ready: ` / `not ready: `), which [`LocalRelay::ready`] already carries.
fn readyz_answer(response: &str) -> (Option<bool>, String) {
    let ready = response.split(' ').nth(1).map(|code| code == "200");
    let body = response.split_once("\r\n\r\n").map_or("", |(_, b)| b).trim();
    let reason = body
        .strip_prefix("ready: ")
        .or_else(|| body.strip_prefix("not ready: "))
        .unwrap_or(body);
    (ready, reason.to_owned())
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServerStatus {
    pub version: String,
    pub version_num: i32,
    pub database: String,
    pub wal_level: String,
    pub in_recovery: bool,
    #[serde(with = "lsn_text")]
    pub current_wal_lsn: Option<Lsn>,
}

/// One configured outbox table, whether the publication publishes it, and its figures.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OutboxTableStatus {
    pub schema: String,
    pub table: String,
    pub in_publication: bool,
    /// Rows (estimate), size, oldest row, what retention last removed (`control/status_tables.rs`).
    #[serde(flatten)]
    pub figures: TableFigures,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TableRef {
    pub schema: String,
    pub table: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SlotStatus {
    pub name: String,
    pub exists: bool,
    pub slot_type: Option<String>,
    pub plugin: Option<String>,
    pub database: Option<String>,
    pub active: bool,
    pub active_pid: Option<i32>,
    #[serde(with = "lsn_text")]
    pub confirmed_flush_lsn: Option<Lsn>,
    #[serde(with = "lsn_text")]
    pub restart_lsn: Option<Lsn>,
    pub retained_wal_bytes: Option<i64>,
    pub lag_bytes: Option<i64>,
    pub wal_status: Option<String>,
    pub safe_wal_size: Option<i64>,
    /// PostgreSQL 17+: a failover slot (`null` before 17 or when missing).
    #[serde(default)]
    pub failover: Option<bool>,
}

/// `status`'s failover section: is the slot ready to survive a promotion?
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FailoverStatus {
    /// The server has failover slots (17+).
    pub supported: bool,
    /// `postgres.failover_slot`.
    pub mode: String,
    /// The primary's `synchronized_standby_slots` (empty when unset).
    pub synchronized_standby_slots: Vec<String>,
    /// The other hosts of `postgres.url`, as seen from here.
    pub standbys: Vec<StandbyStatus>,
    /// A promotion of at least one listed standby would keep the slot: the slot is a failover
    /// slot and a standby has a synchronized copy.
    pub ready: bool,
    /// Why not, one sentence each; `[]` when ready.
    pub reasons: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StandbyStatus {
    /// `host:port` from `postgres.url`.
    pub host: String,
    pub reachable: bool,
    pub in_recovery: Option<bool>,
    /// The slot's copy there exists and is synchronized from the primary (`synced`).
    pub slot_synced: Option<bool>,
    #[serde(with = "lsn_text")]
    pub confirmed_flush_lsn: Option<Lsn>,
    /// The primary's confirmed position minus the copy's: what the relay would republish
    /// after promoting this standby.
    pub behind_bytes: Option<i64>,
    /// Why it could not be looked at.
    pub error: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PublicationStatus {
    pub name: String,
    pub exists: bool,
    pub all_tables: bool,
    pub publish: Vec<String>,
    pub tables: Vec<TableRef>,
    pub includes_outbox_table: bool,
}

/// Reads the state of the slot and publication named in `settings`. Works when neither exists.
pub async fn status(settings: &Settings) -> Result<StatusReport, ControlError> {
    let client = connect(settings).await?;
    let server = catalog::server_info(&client).await?;
    let current_wal_lsn = catalog::current_wal_lsn(&client).await?;

    let slot_name = settings.postgres.slot.as_str();
    let slot = match catalog::slot(&client, slot_name).await? {
        Some(s) => SlotStatus {
            name: slot_name.to_owned(),
            exists: true,
            confirmed_flush_lsn: s.confirmed_flush_lsn,
            restart_lsn: s.restart_lsn,
            slot_type: Some(s.slot_type),
            plugin: s.plugin,
            database: s.database,
            active: s.active,
            active_pid: s.active_pid,
            retained_wal_bytes: s.retained_wal_bytes,
            lag_bytes: s.lag_bytes,
            wal_status: s.wal_status,
            safe_wal_size: s.safe_wal_size,
            failover: s.failover,
        },
        None => SlotStatus {
            name: slot_name.to_owned(),
            exists: false,
            slot_type: None,
            plugin: None,
            database: None,
            active: false,
            active_pid: None,
            confirmed_flush_lsn: None,
            restart_lsn: None,
            retained_wal_bytes: None,
            lag_bytes: None,
            wal_status: None,
            safe_wal_size: None,
            failover: None,
        },
    };

    let configured: Vec<TableRef> = settings
        .outbox
        .tables
        .iter()
        .map(|t| TableRef {
            schema: t.schema.as_str().to_owned(),
            table: t.name.as_str().to_owned(),
        })
        .collect();
    let outbox_table = configured[0].clone();
    let publication_name = settings.postgres.publication.as_str();
    let mut outbox_tables: Vec<OutboxTableStatus> = configured
        .iter()
        .map(|t| OutboxTableStatus {
            schema: t.schema.clone(),
            table: t.table.clone(),
            in_publication: false,
            figures: TableFigures::default(),
        })
        .collect();
    let publication = match catalog::publication(&client, publication_name).await? {
        Some(p) => {
            let tables: Vec<TableRef> = catalog::publication_tables(&client, publication_name)
                .await?
                .into_iter()
                .map(|(schema, table)| TableRef { schema, table })
                .collect();
            for (status, table) in outbox_tables.iter_mut().zip(&configured) {
                status.in_publication = p.puballtables || tables.contains(table);
            }
            PublicationStatus {
                name: publication_name.to_owned(),
                exists: true,
                all_tables: p.puballtables,
                publish: p.actions(),
                includes_outbox_table: outbox_tables.iter().all(|t| t.in_publication),
                tables,
            }
        }
        None => PublicationStatus {
            name: publication_name.to_owned(),
            exists: false,
            all_tables: false,
            publish: Vec::new(),
            includes_outbox_table: false,
            tables: Vec::new(),
        },
    };

    let filter_state = super::row_filter::read(&client, &server, settings).await?;
    let (summary, filter_warning) = super::row_filter::verdict(&filter_state, &server, settings);
    let filter = FilterStatus {
        summary,
        in_sync: filter_warning.is_none(),
    };
    let lag = match slot.active_pid {
        Some(pid) => status_health::walsender_lag(&client, pid).await?,
        None => WalsenderLag::default(),
    };
    let facts = Facts {
        slot_name: slot.name.clone(),
        slot_exists: slot.exists,
        slot_usable_plugin: slot.slot_type.as_deref() == Some("logical") && slot.plugin.as_deref() == Some("pgoutput"),
        slot_active: slot.active,
        wal_status: slot.wal_status.clone(),
        retained_wal_bytes: slot.retained_wal_bytes,
        safe_wal_size: slot.safe_wal_size,
        wal_level_logical: server.wal_level == "logical",
        publication_ok: publication.exists && publication.includes_outbox_table,
        lag,
        filter_warning,
    };
    let health = status_health::assess(
        &facts,
        Thresholds::new(settings.http.ready_max_lag, settings.relay.retained_wal_warn_bytes),
    );
    let failover = failover_status(settings, &client, &server, &slot).await?;
    let relay = match settings.http.listen {
        Some(listen) => Some(local_relay(listen).await),
        None => None,
    };
    let sink = match crate::sink::probe(settings).await {
        Ok(detail) => SinkStatus {
            kind: settings.sink.label().to_owned(),
            reachable: true,
            detail,
        },
        Err(e) => SinkStatus {
            kind: settings.sink.label().to_owned(),
            reachable: false,
            detail: e.to_string(),
        },
    };
    for (status, figures) in outbox_tables
        .iter_mut()
        .zip(super::status_tables::read(&client, settings).await)
    {
        status.figures = figures;
    }
    let streaming = streaming_status(settings, &client, &server, slot.exists).await?;
    Ok(StatusReport {
        streaming,
        failover,
        relay,
        sink,
        health,
        schema_version: STATUS_SCHEMA_VERSION,
        postgres_url: settings.postgres.url.to_string(),
        server: ServerStatus {
            version: server.version,
            version_num: server.version_num,
            database: server.database,
            wal_level: server.wal_level,
            in_recovery: server.in_recovery,
            current_wal_lsn,
        },
        outbox_table,
        outbox_tables,
        slot,
        publication,
        filter,
    })
}

/// Looks at the slot from every other host of `postgres.url` (standbys): does it have a
/// synchronized copy, and how far behind is it?
async fn failover_status(
    settings: &Settings,
    client: &tokio_postgres::Client,
    server: &catalog::ServerInfo,
    slot: &SlotStatus,
) -> Result<FailoverStatus, ControlError> {
    let supported = server.version_num >= super::failover::FAILOVER_VERSION_NUM;
    let synchronized_standby_slots = super::failover::standbys(client, server)
        .await?
        .synchronized_standby_slots;
    let this_port: Option<i32> = client
        .query_one("SELECT inet_server_port()", &[])
        .await
        .map(|r| r.get(0))
        .ok()
        .flatten();
    let mut standbys = Vec::new();
    for (host, port) in settings.postgres.host_ports() {
        let name = match &host {
            tokio_postgres::config::Host::Tcp(h) => format!("{h}:{port}"),
            tokio_postgres::config::Host::Unix(d) => format!("{}:{port}", d.display()),
        };
        let mut standby = StandbyStatus {
            host: name,
            reachable: false,
            in_recovery: None,
            slot_synced: None,
            confirmed_flush_lsn: None,
            behind_bytes: None,
            error: None,
        };
        let other = match crate::postgres::client::connect_host(
            &settings.postgres,
            &host,
            port,
            settings.relay.connect_timeout,
        )
        .await
        {
            Ok(c) => c,
            Err(e) => {
                standby.error = Some(e.to_string());
                standbys.push(standby);
                continue;
            }
        };
        standby.reachable = true;
        let row = other
            .query_one(
                "SELECT pg_is_in_recovery(), inet_server_port(),                         (SELECT (to_jsonb(s) ->> 'synced')::bool FROM pg_replication_slots s WHERE slot_name = $1),                         (SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1)",
                &[&slot.name],
            )
            .await;
        match row {
            Ok(row) => {
                let in_recovery: bool = row.get(0);
                let port: Option<i32> = row.get(1);
                if !in_recovery && port == this_port {
                    // The primary itself (the host this status talks to).
                    continue;
                }
                standby.in_recovery = Some(in_recovery);
                standby.slot_synced = row.get::<_, Option<bool>>(2).or(Some(false).filter(|_| in_recovery));
                standby.confirmed_flush_lsn = row.get::<_, Option<String>>(3).and_then(|s| s.parse().ok());
                if let (Some(primary), Some(copy)) = (slot.confirmed_flush_lsn, standby.confirmed_flush_lsn) {
                    standby.behind_bytes = Some(primary.0 as i64 - copy.0 as i64);
                }
            }
            Err(e) => standby.error = Some(super::describe(&e)),
        }
        standbys.push(standby);
    }
    let mut reasons = Vec::new();
    if !supported {
        reasons.push(format!(
            "PostgreSQL {} has no failover slots (17+): a promoted standby has no slot {}; after a failover, recover \
             with `setup --backfill --since TIMESTAMP` (docs/operations.md)",
            server.version, slot.name
        ));
    } else if slot.exists && slot.failover != Some(true) {
        reasons.push(format!(
            "slot {} is not a failover slot: run `outbox-relay setup` (postgres.failover_slot = \"auto\" or \"on\")",
            slot.name
        ));
    } else if !slot.exists {
        reasons.push(format!("slot {} does not exist", slot.name));
    }
    if supported && standbys.iter().all(|s| s.slot_synced != Some(true)) {
        reasons.push(if standbys.is_empty() {
            "postgres.url names no standby, so none could be checked for a synchronized copy of the slot (list the \
             standbys after the primary, with target_session_attrs=read-write)"
                .to_owned()
        } else {
            "no standby listed in postgres.url has a synchronized copy of the slot (standbys need \
             sync_replication_slots = on, hot_standby_feedback = on, primary_slot_name, a dbname in primary_conninfo)"
                .to_owned()
        });
    }
    if supported && synchronized_standby_slots.is_empty() {
        reasons.push(
            "synchronized_standby_slots is empty: a promoted standby may lack transactions the relay already published"
                .to_owned(),
        );
    }
    Ok(FailoverStatus {
        supported,
        mode: settings.postgres.failover_slot.as_str().to_owned(),
        synchronized_standby_slots,
        ready: reasons.is_empty(),
        standbys,
        reasons,
    })
}

impl fmt::Display for FailoverStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let verdict = if self.ready { "ready" } else { "NOT ready" };
        write!(f, "failover: {verdict} (postgres.failover_slot = {})", self.mode)?;
        for s in &self.standbys {
            write!(f, "\n  standby {}: ", s.host)?;
            match (&s.error, s.slot_synced) {
                (Some(e), _) => write!(f, "unreachable or unreadable ({e})")?,
                (None, Some(true)) => {
                    write!(f, "slot copy synchronized")?;
                    if let Some(b) = s.behind_bytes {
                        write!(f, ", {} behind the primary", human_bytes(b.max(0)))?;
                    }
                }
                (None, _) if s.in_recovery == Some(false) => write!(f, "not in recovery (a second primary?)")?,
                (None, _) => write!(f, "no synchronized copy of the slot")?,
            }
        }
        for r in &self.reasons {
            write!(f, "\n  - {r}")?;
        }
        Ok(())
    }
}

impl fmt::Display for StatusReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        super::display_lines(f, |f| self.render(f))
    }
}

impl StatusReport {
    fn render(&self, f: &mut String) -> fmt::Result {
        use fmt::Write as _;
        let s = &self.server;
        let standby = if s.in_recovery { ", standby" } else { "" };
        writeln!(
            f,
            "PostgreSQL {} at {} (database {}, wal_level = {}{standby})",
            s.version, self.postgres_url, s.database, s.wal_level
        )?;
        if let Some(lsn) = s.current_wal_lsn {
            writeln!(f, "current WAL position: {lsn}")?;
        }
        for t in &self.outbox_tables {
            let missing = if self.publication.exists && !t.in_publication {
                " (NOT in the publication)"
            } else {
                ""
            };
            let name = format!(
                "{}.{}",
                crate::config::ident::quote_ident(&t.schema),
                crate::config::ident::quote_ident(&t.table)
            );
            super::status_tables::render(&name, missing, &t.figures, f)?;
        }
        writeln!(f, "{}", self.slot)?;
        writeln!(f, "{}", self.publication)?;
        if !self.filter.summary.is_empty() {
            writeln!(f, "{}", self.filter.summary)?;
        }
        writeln!(f, "{}", self.failover)?;
        self.streaming.render(f)?;
        let reach = if self.sink.reachable { "" } else { "NOT reachable: " };
        writeln!(f, "sink ({}): {reach}{}", self.sink.kind, self.sink.detail)?;
        if let Some(r) = &self.relay {
            let verdict = match r.ready {
                Some(true) => "ready",
                Some(false) => "NOT ready",
                None => "unreachable",
            };
            writeln!(f, "relay at {} (http.listen): {verdict}: {}", r.address, r.detail)?;
        }
        self.health.render(f, self.slot.lag_bytes, self.slot.retained_wal_bytes)
    }
}

impl fmt::Display for SlotStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        super::display_lines(f, |f| self.render(f))
    }
}

impl SlotStatus {
    fn render(&self, f: &mut String) -> fmt::Result {
        use fmt::Write as _;
        let name = &self.name;
        if !self.exists {
            return writeln!(f, "slot {name}: does not exist (run `outbox-relay setup`)");
        }
        let kind = self.slot_type.as_deref().unwrap_or("unknown type");
        let mut line = format!("slot {name}: {kind}");
        if let Some(plugin) = &self.plugin {
            line.push_str(&format!(", plugin {plugin}"));
        }
        if let Some(db) = &self.database {
            line.push_str(&format!(", database {db}"));
        }
        writeln!(f, "{line}")?;
        match self.active_pid {
            Some(pid) if self.active => writeln!(f, "  active: yes (pid {pid})")?,
            _ if self.active => writeln!(f, "  active: yes")?,
            _ => writeln!(f, "  active: no")?,
        }
        let opt = |lsn: Option<Lsn>| lsn.map_or_else(|| "-".to_owned(), |l| l.to_string());
        let bytes = |b: Option<i64>| b.map_or_else(|| "unknown".to_owned(), human_bytes);
        writeln!(
            f,
            "  confirmed_flush_lsn: {} (lag {})",
            opt(self.confirmed_flush_lsn),
            bytes(self.lag_bytes)
        )?;
        writeln!(
            f,
            "  restart_lsn: {} (retains {} of WAL)",
            opt(self.restart_lsn),
            bytes(self.retained_wal_bytes)
        )?;
        if let Some(wal_status) = &self.wal_status {
            let safe = self.safe_wal_size.map_or_else(|| "unlimited".to_owned(), human_bytes);
            writeln!(f, "  wal_status: {wal_status}, safe_wal_size: {safe}")?;
            if wal_status == "lost" {
                writeln!(
                    f,
                    "  the slot is invalidated: WAL it needed is gone (see `outbox-relay setup` for what to do)"
                )?;
            }
        }
        Ok(())
    }
}

impl fmt::Display for PublicationStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        super::display_lines(f, |f| self.render(f))
    }
}

impl PublicationStatus {
    fn render(&self, f: &mut String) -> fmt::Result {
        use fmt::Write as _;
        let name = &self.name;
        if !self.exists {
            return writeln!(f, "publication {name}: does not exist (run `outbox-relay setup`)");
        }
        let publish = if self.publish.is_empty() {
            "nothing".to_owned()
        } else {
            self.publish.join(", ")
        };
        let scope = if self.all_tables { "FOR ALL TABLES, " } else { "" };
        writeln!(f, "publication {name}: {scope}publish {publish}")?;
        let tables: Vec<String> = self
            .tables
            .iter()
            .map(|t| {
                format!(
                    "{}.{}",
                    crate::config::ident::quote_ident(&t.schema),
                    crate::config::ident::quote_ident(&t.table)
                )
            })
            .collect();
        if !self.all_tables {
            writeln!(
                f,
                "  tables: {}",
                if tables.is_empty() {
                    "none".to_owned()
                } else {
                    tables.join(", ")
                }
            )?;
        }
        if !self.includes_outbox_table {
            writeln!(
                f,
                "  does NOT include every outbox table (`outbox-relay setup` adds them or says why it cannot)"
            )?;
        }
        Ok(())
    }
}

/// `Option<Lsn>` as PostgreSQL's `X/Y` text (or `null`).
mod lsn_text {
    use serde::{Deserialize, Deserializer, Serializer};

    use crate::postgres::lsn::Lsn;

    pub(crate) fn serialize<S: Serializer>(lsn: &Option<Lsn>, s: S) -> Result<S::Ok, S::Error> {
        match lsn {
            Some(l) => s.collect_str(l),
            None => s.serialize_none(),
        }
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Lsn>, D::Error> {
        Option::<String>::deserialize(d)?
            .map(|s| s.parse().map_err(serde::de::Error::custom))
            .transpose()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> StatusReport {
        StatusReport {
            schema_version: STATUS_SCHEMA_VERSION,
            postgres_url: "postgres://relay:********@db/app".into(),
            server: ServerStatus {
                version: "15.20".into(),
                version_num: 150_020,
                database: "app".into(),
                wal_level: "logical".into(),
                in_recovery: false,
                current_wal_lsn: Some(Lsn(0x1_0000_2000)),
            },
            outbox_table: TableRef {
                schema: "Sales".into(),
                table: "OutBox".into(),
            },
            outbox_tables: vec![OutboxTableStatus {
                schema: "Sales".into(),
                table: "OutBox".into(),
                in_publication: true,
                figures: TableFigures::default(),
            }],
            slot: SlotStatus {
                name: "outbox_relay".into(),
                exists: true,
                slot_type: Some("logical".into()),
                plugin: Some("pgoutput".into()),
                database: Some("app".into()),
                active: true,
                active_pid: Some(42),
                confirmed_flush_lsn: Some(Lsn(0x1_0000_1000)),
                restart_lsn: Some(Lsn(0x1_0000_0000)),
                retained_wal_bytes: Some(0x2000),
                lag_bytes: Some(0x1000),
                wal_status: Some("reserved".into()),
                safe_wal_size: None,
                failover: None,
            },
            failover: FailoverStatus {
                supported: false,
                mode: "auto".into(),
                synchronized_standby_slots: Vec::new(),
                standbys: Vec::new(),
                ready: false,
                reasons: vec!["PostgreSQL 15.20 has no failover slots (17+)".into()],
            },
            sink: SinkStatus {
                kind: "kafka".into(),
                reachable: true,
                detail: "reachable: 1 broker(s), 2 topic(s)".into(),
            },
            filter: FilterStatus::default(),
            streaming: StreamingStatus {
                mode: "auto".into(),
                protocol: Some("pgoutput 2, streaming on (large transactions as they are written)".into()),
                on: true,
                spill_txns: Some(0),
                spill_bytes: Some(0),
                stream_txns: Some(3),
                stream_bytes: Some(105_600_000),
            },
            relay: Some(LocalRelay {
                address: "127.0.0.1:9187".into(),
                reachable: true,
                ready: Some(false),
                detail: "exactly-once takeover fence: nothing is read back or published from the replay \
                         window until 2026-11-25T17:19:18.000000Z (9.5 s left): took the slot over"
                    .into(),
            }),
            publication: PublicationStatus {
                name: "outbox_relay".into(),
                exists: true,
                all_tables: false,
                publish: vec!["insert".into()],
                tables: vec![TableRef {
                    schema: "Sales".into(),
                    table: "OutBox".into(),
                }],
                includes_outbox_table: true,
            },
            health: status_health::assess(
                &Facts {
                    slot_name: "outbox_relay".into(),
                    slot_exists: true,
                    slot_usable_plugin: true,
                    slot_active: true,
                    wal_status: Some("reserved".into()),
                    retained_wal_bytes: Some(0x2000),
                    wal_level_logical: true,
                    publication_ok: true,
                    lag: WalsenderLag {
                        flush_lag_seconds: Some(0.25),
                        last_reply: crate::postgres::slot::Silence::For(std::time::Duration::from_millis(500)),
                    },
                    ..Facts::default()
                },
                Thresholds::new(std::time::Duration::from_secs(60), Some(1 << 30)),
            ),
        }
    }

    #[test]
    fn json_uses_the_documented_schema_and_round_trips() {
        let report = sample();
        let json = serde_json::to_value(&report).unwrap();
        assert_eq!(json["schema_version"], 1);
        assert_eq!(json["slot"]["confirmed_flush_lsn"], "1/1000");
        assert_eq!(json["slot"]["safe_wal_size"], serde_json::Value::Null);
        assert_eq!(json["server"]["current_wal_lsn"], "1/2000");
        assert_eq!(json["publication"]["tables"][0]["table"], "OutBox");
        assert_eq!(json["health"]["verdict"], "ok");
        assert_eq!(json["health"]["lag_seconds"], 0.25);
        assert_eq!(json["relay"]["ready"], false);
        assert_eq!(json["sink"]["kind"], "kafka");
        assert_eq!(json["relay"]["address"], "127.0.0.1:9187");
        assert_eq!(json["streaming"]["on"], true);
        assert_eq!(json["streaming"]["stream_bytes"], 105_600_000);
        let back: StatusReport = serde_json::from_value(json).unwrap();
        assert_eq!(back, report);
    }

    #[test]
    fn the_relays_verdict_is_said_once() {
        let ok = "HTTP/1.1 200 OK\r\ncontent-length: 18\r\n\r\nready: streaming\n";
        assert_eq!(readyz_answer(ok), (Some(true), "streaming".to_owned()));
        let busy = "HTTP/1.1 503 Service Unavailable\r\n\r\nnot ready: 12 s behind the source\n";
        assert_eq!(readyz_answer(busy), (Some(false), "12 s behind the source".to_owned()));
        let mut report = sample();
        report.relay = Some(LocalRelay {
            address: "127.0.0.1:9187".into(),
            reachable: true,
            ready: Some(true),
            detail: readyz_answer(ok).1,
        });
        let text = report.to_string();
        assert!(
            text.contains("relay at 127.0.0.1:9187 (http.listen): ready: streaming\n"),
            "{text}"
        );
        assert!(!text.contains("ready: ready"), "{text}");
    }

    #[test]
    fn human_output_renders_bytes_and_pid() {
        let text = sample().to_string();
        assert!(text.contains("active: yes (pid 42)"), "{text}");
        assert!(text.contains("lag 4.0 KiB"), "{text}");
        assert!(text.contains("retains 8.0 KiB of WAL"), "{text}");
        assert!(text.contains("safe_wal_size: unlimited"), "{text}");
        assert!(text.contains(r#""Sales"."OutBox""#), "{text}");
        assert!(text.contains("health: OK"), "{text}");
        assert!(text.contains("sink (kafka): reachable: 1 broker(s)"), "{text}");
        assert!(
            text.contains(
                "streaming: pgoutput 2, streaming on (large transactions as they are written) (postgres.streaming = \
                 auto); the server spilled 0 transaction(s) (0 B) to its disk and streamed 3 (100.7 MiB)"
            ),
            "{text}"
        );
        assert!(text.contains("lag: 4.0 KiB of WAL, 250 ms"), "{text}");
        assert!(
            text.contains("relay at 127.0.0.1:9187 (http.listen): NOT ready: exactly-once takeover fence"),
            "{text}"
        );
        assert!(
            text.contains("retained WAL: 8.0 KiB (warn at 1.0 GiB, critical at 4.0 GiB)"),
            "{text}"
        );
    }
}
