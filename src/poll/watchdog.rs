//! The outbox watchdog of `poll` mode: how many rows wait, and how long the oldest has waited —
//! the SLO the outbox write-ups ask for (`now() - min(created_at)` of what is pending) and the
//! page they ask for (a row waiting more than five minutes).
//!
//! One watchdog per outbox table (`outbox.table` may list several). Every
//! `poll.watchdog_interval_ms`, on a connection of its own (never a worker's: a slow count must
//! not delay a claim), one statement reads both through the partial index claims use, bounded by
//! `statement_timeout`. The figures become the gauges
//! [`PENDING_ROWS`](crate::ops::metrics::PENDING_ROWS) and
//! [`OLDEST_PENDING_AGE_SECONDS`](crate::ops::metrics::OLDEST_PENDING_AGE_SECONDS), labelled
//! `table` with the table's `schema.table` (the same label value for one table whatever its
//! position in the list, so dashboards survive a table added); the log says
//! once when the oldest pending row passes `poll.stuck_after_ms`, and once when none does any
//! more. A failed look is logged once (and once when looks work again) and leaves the gauges as
//! they were: the watchdog never stops the poller.

use tokio::sync::watch;
use tokio_postgres::Client;
use tracing::{info, warn};

use crate::config::ident::{Ident, TableName};
use crate::config::Settings;
use crate::ops::metrics::{OLDEST_PENDING_AGE_SECONDS, PENDING_ROWS};

/// What one look found.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Pending {
    pub(crate) rows: i64,
    /// Age of the oldest pending row by its creation-time column (0 when none is pending).
    pub(crate) oldest_age_seconds: f64,
}

/// The label of the watchdog's gauges: which outbox table they count.
const TABLE_LABEL: &str = "table";

/// The statement: pending rows of `table` and the oldest one's age, in seconds.
pub(crate) fn pending_sql(settings: &Settings, table: &TableName, created_at: &Ident) -> String {
    format!(
        "SELECT count(*)::int8, COALESCE(EXTRACT(EPOCH FROM now() - min({c}))::float8, 0) FROM {t} WHERE {d} IS NULL",
        c = created_at.quoted(),
        t = table.quoted(),
        d = settings.poll.dispatched.quoted(),
    )
}

/// Whether the log said that rows are stuck (or that looks fail), so it says each thing once.
#[derive(Debug, Default)]
struct Said {
    stuck: bool,
    failing: bool,
}

/// Watches `table` until `shutdown` turns true.
pub(crate) async fn run(
    settings: &Settings,
    table: &TableName,
    created_at: &Ident,
    mut shutdown: watch::Receiver<bool>,
) {
    let sql = pending_sql(settings, table, created_at);
    let interval = settings.poll.watchdog_interval;
    let mut client: Option<Client> = None;
    let mut said = Said::default();
    loop {
        let look = async {
            if client.is_none() {
                let c = crate::postgres::client::connect(&settings.postgres, settings.relay.connect_timeout)
                    .await
                    .map_err(|e| e.to_string())?;
                let timeout = settings.relay.connect_timeout.as_millis();
                c.batch_execute(&format!("SET statement_timeout = {timeout}"))
                    .await
                    .map_err(|e| e.to_string())?;
                client = Some(c);
            }
            let c = client.as_ref().ok_or_else(|| "no connection".to_owned())?;
            let row = c.query_one(sql.as_str(), &[]).await.map_err(|e| e.to_string())?;
            Ok::<_, String>(Pending {
                rows: row.get(0),
                oldest_age_seconds: row.get(1),
            })
        };
        match look.await {
            Ok(found) => {
                if std::mem::take(&mut said.failing) {
                    info!(table = %table, "the outbox watchdog reads the pending rows again");
                }
                report(settings, table, &found, &mut said);
            }
            Err(e) => {
                client = None;
                if !std::mem::replace(&mut said.failing, true) {
                    warn!(error = %e, table = %table, "the outbox watchdog cannot count the pending rows; retrying every interval");
                }
            }
        }
        if crate::ops::retry::wait_or_shutdown(interval, &mut shutdown).await {
            return;
        }
    }
}

fn report(settings: &Settings, table: &TableName, found: &Pending, said: &mut Said) {
    let label = label_value(table);
    ::metrics::gauge!(PENDING_ROWS, TABLE_LABEL => label.clone()).set(found.rows as f64);
    ::metrics::gauge!(OLDEST_PENDING_AGE_SECONDS, TABLE_LABEL => label).set(found.oldest_age_seconds);
    let stuck = found.oldest_age_seconds >= settings.poll.stuck_after.as_secs_f64();
    match (stuck, said.stuck) {
        (true, false) => warn!(
            table = %table,
            pending_rows = found.rows,
            oldest_pending_age_seconds = found.oldest_age_seconds.round() as u64,
            "outbox rows are stuck: the oldest pending row has waited {} s (poll.stuck_after_ms = {}); {} rows \
             are pending. Check the broker and this poller's log",
            found.oldest_age_seconds.round() as u64,
            settings.poll.stuck_after.as_millis(),
            found.rows
        ),
        (false, true) => info!(
            table = %table,
            pending_rows = found.rows,
            "no outbox row is stuck any more"
        ),
        _ => {}
    }
    said.stuck = stuck;
}

/// `schema.table` as the catalog stores the names (unquoted: a label value, not SQL).
fn label_value(table: &TableName) -> String {
    format!("{}.{}", table.schema.as_str(), table.name.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::test_support::settings;

    fn pending(rows: i64, oldest_age_seconds: f64) -> Pending {
        Pending {
            rows,
            oldest_age_seconds,
        }
    }

    #[test]
    fn the_statement_reads_the_pending_rows_through_the_claims_predicate() {
        let s = settings("[poll]\ndispatched_column = \"processed_at\"\n");
        let created = Ident::parse("t", "created_at").unwrap();
        assert_eq!(
            pending_sql(&s, &s.outbox.tables[0], &created),
            "SELECT count(*)::int8, COALESCE(EXTRACT(EPOCH FROM now() - min(\"created_at\"))::float8, 0) \
             FROM \"public\".\"events_outbox\" WHERE \"processed_at\" IS NULL"
        );
    }

    #[test]
    fn stuck_is_said_once_and_its_end_once() {
        let s = settings("[poll]\nstuck_after_ms = 60000\n");
        let mut said = Said::default();
        for (rows, oldest_age_seconds, stuck) in [(3, 10.0, false), (3, 61.0, true), (0, 0.0, false)] {
            report(&s, &s.outbox.tables[0], &pending(rows, oldest_age_seconds), &mut said);
            assert_eq!(said.stuck, stuck, "{rows} rows, the oldest {oldest_age_seconds} s old");
        }
    }

    #[test]
    fn each_table_has_its_own_gauges() {
        let s = settings("[outbox]\ntable = [\"sales.outbox\", '\"Billing\".\"OutBox\"']\n");
        let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
        let handle = recorder.handle();
        ::metrics::with_local_recorder(&recorder, || {
            let (mut sales, mut billing) = (Said::default(), Said::default());
            report(&s, &s.outbox.tables[0], &pending(3, 12.5), &mut sales);
            report(&s, &s.outbox.tables[1], &pending(0, 0.0), &mut billing);
        });
        let text = handle.render();
        for line in [
            "outbox_relay_pending_rows{table=\"sales.outbox\"} 3",
            "outbox_relay_pending_rows{table=\"Billing.OutBox\"} 0",
            "outbox_relay_oldest_pending_age_seconds{table=\"sales.outbox\"} 12.5",
            "outbox_relay_oldest_pending_age_seconds{table=\"Billing.OutBox\"} 0",
        ] {
            assert!(text.lines().any(|l| l == line), "{line:?} missing from:\n{text}");
        }
    }
}
