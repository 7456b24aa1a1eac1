//! `outbox-relay import-debezium FILE`: turns a Debezium PostgreSQL connector config with the
//! Outbox EventRouter — the JSON posted to Kafka Connect's REST API, or a `.properties` file —
//! into the equivalent outbox-relay TOML file, so a migration starts from the settings that
//! already work instead of from the tables in docs/migrating-from-debezium.md.
//!
//! It reads one file and opens no connection: [`parse`] flattens either format into Connect's
//! option → string map, [`mapping`] decides where each option goes, [`render`] writes TOML. The
//! output is a valid config file on its own: what has no counterpart is listed, with the reason,
//! as comments at its end, so nothing of the connector config disappears without a word.
//!
//! Two rules shape the mapping. **Every mapped setting is written out**, defaults included,
//! because Debezium's defaults differ from the relay's (`aggregateid` versus `aggregate_id`,
//! topics `outbox.event.<type>` versus `<type>`) and an omitted key would silently take the
//! relay's. **No secret is ever written**: the database password (or the config-provider
//! reference Connect resolved it from) stays out, and the file says where to put it.

mod mapping;
mod parse;
mod render;
mod server;
#[cfg(test)]
mod tests;

use std::path::{Path, PathBuf};

/// Why a connector config cannot be imported; every message names the file.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ImportError {
    #[error("cannot read {}: {source}", path.display())]
    Read { path: PathBuf, source: std::io::Error },
    #[error("{}{}: {message}", path.display(), line.map(|l| format!(", line {l}")).unwrap_or_default())]
    Malformed {
        path: PathBuf,
        line: Option<usize>,
        message: String,
    },
    /// A well-formed config that is not a Debezium PostgreSQL connector with one EventRouter on
    /// outbox tables named in `table.include.list` (the message names the file and the option).
    #[error("{0}")]
    Unsupported(String),
}

/// The generated config file, and a one-line summary for stderr.
#[derive(Debug)]
pub(crate) struct ImportReport {
    pub(crate) toml: String,
    pub(crate) summary: String,
}

/// Reads the connector config at `path` and returns the outbox-relay config for it.
pub(crate) fn import_debezium(path: &Path) -> Result<ImportReport, ImportError> {
    let bytes = std::fs::read(path).map_err(|source| ImportError::Read {
        path: path.to_owned(),
        source,
    })?;
    convert(path, &bytes)
}

fn convert(path: &Path, bytes: &[u8]) -> Result<ImportReport, ImportError> {
    let config = parse::parse(path, bytes)?;
    let source = path.display().to_string();
    let imported = mapping::map(&config, &source)?;
    let name = config.name.as_deref().map(|n| format!(" {n:?}")).unwrap_or_default();
    let summary = format!(
        "imported connector{name} from {source}: {} option(s) have no counterpart and are listed at the end of the output",
        imported.not_carried_over.len()
    );
    Ok(ImportReport {
        toml: imported.render(&source),
        summary,
    })
}
