//! A logical replication connection, spoken directly over the frontend/backend protocol.
//!
//! `tokio-postgres` does not support replication mode, so this module opens the connection itself
//! with the codecs of `postgres-protocol` (the same startup, SCRAM and message code
//! `tokio-postgres` uses): TLS negotiation (`SSLRequest`), a startup packet with
//! `replication=database`, authentication (trust, cleartext, MD5, SCRAM-SHA-256), simple queries,
//! then `START_REPLICATION`, after which the connection is in CopyBoth mode: the server sends
//! `CopyData` frames (XLogData and keepalives) and we send `CopyData` standby status updates.
//!
//! The startup packet pins `DateStyle=ISO`, `TimeZone=UTC`, `extra_float_digits=3`,
//! `bytea_output=hex` and `client_encoding=UTF8`: pgoutput renders column values with the walsender session's output
//! functions, so this makes timestamps parseable and text stable whatever `postgresql.conf` says.
//!
//! After `START_REPLICATION` the connection splits into a [`FrameReader`] and a [`StatusWriter`]
//! so that the relay can stop reading (backpressure) while still sending status updates, which
//! is what keeps the walsender from timing the connection out.
//!
//! Channel binding: we answer SCRAM with `SCRAM-SHA-256` and the "client does not support channel
//! binding" flag, which every server accepts, also over TLS.

use std::time::Duration;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use fallible_iterator::FallibleIterator;
use postgres_protocol::authentication::sasl::{self, ChannelBinding, ScramSha256};
use postgres_protocol::message::backend::{ErrorResponseBody, Message};
use postgres_protocol::message::frontend;
use tokio::io::{AsyncReadExt, AsyncWriteExt, ReadHalf, WriteHalf};
use tokio::net::{TcpSocket, UnixStream};
use tokio_postgres::config::{Host, SslMode};
use tracing::{debug, info, warn};

use super::error::{ReplicationError, ServerError};
use super::transport::Transport;
use crate::config::postgres::{PostgresSettings, TargetSession};
use crate::postgres::lsn::Lsn;
use crate::postgres::tls;

/// Protocol messages larger than this are treated as corruption (the server's own limit is 1 GiB).
const MAX_MESSAGE_BYTES: usize = 1 << 30;
const READ_CHUNK: usize = 256 * 1024;

/// One message from the server, in the shapes this client needs.
enum Backend {
    CopyData(Bytes),
    CopyBothResponse,
    CopyDone,
    Other(Message),
}

/// What `IDENTIFY_SYSTEM` reports.
#[derive(Debug, Clone)]
pub(crate) struct SystemIdentity {
    pub(crate) system_id: String,
    pub(crate) timeline: u32,
    pub(crate) xlogpos: Lsn,
}

/// An authenticated replication connection, before streaming starts.
pub struct ReplicationConnection {
    stream: Transport,
    buf: BytesMut,
    out: BytesMut,
    pub(crate) server_version_num: u32,
    pub(crate) backend_pid: i32,
    /// `host:port` (or the socket directory) this connection went to.
    host: String,
    /// `in_hot_standby` as reported at startup (PostgreSQL 14+).
    in_hot_standby: Option<bool>,
    /// `default_transaction_read_only` as reported at startup (PostgreSQL 14+).
    default_read_only: Option<bool>,
}

/// What a host is, as far as `target_session_attrs` cares.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct SessionRole {
    in_recovery: bool,
    read_only: bool,
}

impl SessionRole {
    /// Why a host with this role does not satisfy `target`, if it does not.
    fn unsuitable_for(self, target: TargetSession) -> Option<String> {
        match target {
            TargetSession::Any => None,
            _ if self.in_recovery => Some(format!(
                "not the primary: it is a standby (in recovery), and target_session_attrs={}",
                target.as_str()
            )),
            TargetSession::ReadWrite if self.read_only => Some(
                "not the primary: it is read-only (default_transaction_read_only = on), and \
                 target_session_attrs=read-write"
                    .into(),
            ),
            TargetSession::ReadWrite | TargetSession::Primary => None,
        }
    }
}

/// The one row a replication command (`IDENTIFY_SYSTEM`, `CREATE_REPLICATION_SLOT`) answers
/// with, its fields read by position.
struct Answer<'r> {
    command: &'static str,
    row: &'r [Option<String>],
}

impl<'r> Answer<'r> {
    /// The first of `rows`; none is a protocol error naming `command`.
    fn first(command: &'static str, rows: &'r [Vec<Option<String>>]) -> Result<Self, ReplicationError> {
        let row = rows
            .first()
            .ok_or_else(|| ReplicationError::Protocol(format!("{command} returned no row")))?;
        Ok(Answer { command, row })
    }

    /// Field `i`; `None` when it is NULL or missing.
    fn field(&self, i: usize) -> Option<String> {
        self.row.get(i).cloned().flatten()
    }

    /// Field `i` as an LSN; a NULL, missing or malformed one is a protocol error naming `what`.
    fn lsn(&self, i: usize, what: &str) -> Result<Lsn, ReplicationError> {
        self.field(i)
            .and_then(|s| s.parse::<Lsn>().ok())
            .ok_or_else(|| ReplicationError::Protocol(format!("{} returned no {what}", self.command)))
    }
}

fn host_name(host: &Host, port: u16) -> String {
    match host {
        Host::Tcp(name) if name.contains(':') => format!("[{name}]:{port}"),
        Host::Tcp(name) => format!("{name}:{port}"),
        Host::Unix(dir) => format!("{}/.s.PGSQL.{port}", dir.display()),
    }
}

impl ReplicationConnection {
    /// Connects and authenticates, trying each configured host in turn (libpq semantics).
    pub async fn connect(settings: &PostgresSettings, timeout: Duration) -> Result<Self, ReplicationError> {
        Self::connect_with(settings, timeout, None).await
    }

    /// Like [`connect`](Self::connect); with `dead_peer_timeout`, a TCP connection whose sent
    /// data stays unacknowledged that long fails (`TCP_USER_TIMEOUT`, plus keepalive probes
    /// while idle) instead of hanging on a silently cut network; see [`tune_tcp`].
    ///
    /// Hosts are tried in the URL's order, as libpq does: one that cannot be reached, or (with
    /// `target_session_attrs` = `read-write` / `primary`) that is a standby or read-only, is
    /// skipped with a log line naming it and why. When no host qualifies the error is
    /// [`ReplicationError::NoPrimary`] (transient: a standby may be promoted meanwhile) unless
    /// a host refused us for a reason retrying cannot fix (authentication, TLS), which wins.
    pub(crate) async fn connect_with(
        settings: &PostgresSettings,
        timeout: Duration,
        dead_peer_timeout: Option<Duration>,
    ) -> Result<Self, ReplicationError> {
        let hosts = settings.host_ports();
        let target = settings.target_session;
        let multi = hosts.len() > 1;
        let mut skipped = Vec::new();
        let mut fatal = None;
        for (host, port) in &hosts {
            let name = host_name(host, *port);
            let attempt = tokio::time::timeout(timeout, async {
                let mut conn = Self::connect_host(settings, host, *port, dead_peer_timeout).await?;
                let role = conn.session_role(target).await?;
                Ok::<_, ReplicationError>((conn, role))
            })
            .await;
            let reason = match attempt {
                Ok(Ok((mut conn, role))) => match role.unsuitable_for(target) {
                    None => {
                        if multi {
                            info!(host = %name, target_session_attrs = target.as_str(), "replication connection: using this host");
                        }
                        conn.host = name;
                        return Ok(conn);
                    }
                    Some(why) => {
                        conn.close().await;
                        why
                    }
                },
                Ok(Err(e)) if !multi => return Err(e),
                Ok(Err(e)) => {
                    let why = e.to_string();
                    if !e.is_transient() {
                        fatal.get_or_insert(e);
                    }
                    why
                }
                Err(_) if !multi => {
                    return Err(ReplicationError::Timeout {
                        what: "connecting for replication",
                        after: timeout,
                    })
                }
                Err(_) => format!("no answer within {timeout:?}"),
            };
            warn!(host = %name, target_session_attrs = target.as_str(), reason = %reason, "replication connection: skipping this host");
            skipped.push(format!("{name}: {reason}"));
        }
        if let Some(e) = fatal {
            return Err(e);
        }
        Err(ReplicationError::NoPrimary {
            target: target.as_str(),
            skipped,
        })
    }

    /// Whether the server we are connected to is a standby and whether it is read-only, from
    /// what it reported at startup (`in_hot_standby`, `default_transaction_read_only`: both
    /// reported since PostgreSQL 14), asking only when it did not say.
    async fn session_role(&mut self, target: TargetSession) -> Result<SessionRole, ReplicationError> {
        if target == TargetSession::Any {
            return Ok(SessionRole::default());
        }
        let in_recovery = match self.in_hot_standby {
            Some(on) => on,
            None => {
                let rows = self.simple_query("SELECT pg_is_in_recovery()").await?;
                rows.first().and_then(|r| r.first().cloned().flatten()).as_deref() == Some("t")
            }
        };
        Ok(SessionRole {
            in_recovery,
            read_only: self.default_read_only.unwrap_or(false),
        })
    }

    /// The host this connection went to (`host:port`), for logs.
    pub(crate) fn host(&self) -> &str {
        &self.host
    }

    async fn connect_host(
        settings: &PostgresSettings,
        host: &Host,
        port: u16,
        dead_peer_timeout: Option<Duration>,
    ) -> Result<Self, ReplicationError> {
        let cfg = &settings.connection;
        let stream = match host {
            Host::Tcp(name) => {
                let tcp = connect_tcp(name, port).await?;
                if let Some(limit) = dead_peer_timeout {
                    tune_tcp(&tcp, limit)?;
                }
                negotiate_tls(tcp, name, cfg.get_ssl_mode(), settings).await?
            }
            Host::Unix(dir) => Transport::Unix(
                UnixStream::connect(dir.join(format!(".s.PGSQL.{port}")))
                    .await
                    .map_err(|source| ReplicationError::Connect {
                        host: dir.display().to_string(),
                        port,
                        source,
                    })?,
            ),
        };
        let mut conn = ReplicationConnection {
            stream,
            buf: BytesMut::with_capacity(READ_CHUNK),
            out: BytesMut::with_capacity(1024),
            server_version_num: 0,
            backend_pid: 0,
            host: host_name(host, port),
            in_hot_standby: None,
            default_read_only: None,
        };
        conn.startup(settings).await?;
        Ok(conn)
    }

    async fn startup(&mut self, settings: &PostgresSettings) -> Result<(), ReplicationError> {
        let cfg = &settings.connection;
        let user = cfg.get_user().unwrap_or("postgres");
        let dbname = cfg.get_dbname().unwrap_or(user);
        let app = cfg.get_application_name().unwrap_or("outbox-relay");
        let mut params = vec![
            ("user", user),
            ("database", dbname),
            ("replication", "database"),
            ("application_name", app),
            ("client_encoding", "UTF8"),
            ("DateStyle", "ISO"),
            ("TimeZone", "UTC"),
            ("extra_float_digits", "3"),
            ("IntervalStyle", "postgres"),
            ("bytea_output", "hex"),
        ];
        if let Some(options) = cfg.get_options() {
            params.push(("options", options));
        }
        frontend::startup_message(params.iter().copied(), &mut self.out)?;
        self.flush_out().await?;
        self.authenticate(cfg.get_password(), user).await?;
        loop {
            match self.read_backend().await? {
                Backend::Other(Message::ReadyForQuery(_)) => return Ok(()),
                Backend::Other(Message::BackendKeyData(k)) => self.backend_pid = k.process_id(),
                Backend::Other(Message::ParameterStatus(p)) => {
                    if p.name()? == "in_hot_standby" {
                        self.in_hot_standby = Some(p.value()? == "on");
                    } else if p.name()? == "default_transaction_read_only" {
                        self.default_read_only = Some(p.value()? == "on");
                    } else if p.name()? == "server_version_num" {
                        self.server_version_num = p.value()?.parse().unwrap_or(0);
                    } else if p.name()? == "server_version" && self.server_version_num == 0 {
                        self.server_version_num = parse_server_version(p.value()?);
                    }
                }
                Backend::Other(Message::ErrorResponse(e)) => return Err(server_error(&e)),
                Backend::Other(Message::NoticeResponse(_)) => {}
                _ => return Err(ReplicationError::Protocol("unexpected message during startup".into())),
            }
        }
    }

    async fn authenticate(&mut self, password: Option<&[u8]>, user: &str) -> Result<(), ReplicationError> {
        let need_password = || {
            ReplicationError::Auth(format!(
                "the server asks for a password for user {user:?}, but postgres.url has none; add it to the URL (postgres://{user}:PASSWORD@host/db)"
            ))
        };
        loop {
            match self.read_backend().await? {
                Backend::Other(Message::AuthenticationOk) => return Ok(()),
                Backend::Other(Message::AuthenticationCleartextPassword) => {
                    let pw = password.ok_or_else(need_password)?;
                    frontend::password_message(pw, &mut self.out)?;
                    self.flush_out().await?;
                }
                Backend::Other(Message::AuthenticationMd5Password(body)) => {
                    let pw = password.ok_or_else(need_password)?;
                    let hash = postgres_protocol::authentication::md5_hash(user.as_bytes(), pw, body.salt());
                    frontend::password_message(hash.as_bytes(), &mut self.out)?;
                    self.flush_out().await?;
                }
                Backend::Other(Message::AuthenticationSasl(body)) => {
                    let pw = password.ok_or_else(need_password)?;
                    let mut mechanisms = body.mechanisms();
                    let mut has_scram = false;
                    while let Some(m) = mechanisms.next()? {
                        has_scram |= m == sasl::SCRAM_SHA_256;
                    }
                    if !has_scram {
                        return Err(ReplicationError::Auth(
                            "the server offers no SASL mechanism this client supports (SCRAM-SHA-256)".into(),
                        ));
                    }
                    self.scram(pw).await?;
                }
                Backend::Other(Message::ErrorResponse(e)) => {
                    let server = fields_of(&mut e.fields());
                    return Err(if server.code.starts_with("28") {
                        ReplicationError::AuthRefused { server }
                    } else {
                        ReplicationError::Server(Box::new(server))
                    });
                }
                Backend::Other(
                    Message::AuthenticationGss | Message::AuthenticationSspi | Message::AuthenticationKerberosV5,
                ) => {
                    return Err(ReplicationError::Auth(
                        "the server requests GSSAPI/SSPI/Kerberos authentication, which outbox-relay does not support; use scram-sha-256 in pg_hba.conf".into(),
                    ));
                }
                _ => {
                    return Err(ReplicationError::Protocol(
                        "unexpected message during authentication".into(),
                    ))
                }
            }
        }
    }

    async fn scram(&mut self, password: &[u8]) -> Result<(), ReplicationError> {
        let mut scram = ScramSha256::new(password, ChannelBinding::unsupported());
        frontend::sasl_initial_response(sasl::SCRAM_SHA_256, scram.message(), &mut self.out)?;
        self.flush_out().await?;
        match self.read_backend().await? {
            Backend::Other(Message::AuthenticationSaslContinue(body)) => scram.update(body.data())?,
            Backend::Other(Message::ErrorResponse(e)) => return Err(auth_error(&e)),
            _ => return Err(ReplicationError::Protocol("expected SASL continue".into())),
        }
        frontend::sasl_response(scram.message(), &mut self.out)?;
        self.flush_out().await?;
        match self.read_backend().await? {
            Backend::Other(Message::AuthenticationSaslFinal(body)) => scram.finish(body.data())?,
            Backend::Other(Message::ErrorResponse(e)) => return Err(auth_error(&e)),
            _ => return Err(ReplicationError::Protocol("expected SASL final".into())),
        }
        Ok(())
    }

    /// Runs one simple-protocol command and returns its rows as text.
    pub(crate) async fn simple_query(&mut self, sql: &str) -> Result<Vec<Vec<Option<String>>>, ReplicationError> {
        frontend::query(sql, &mut self.out)?;
        self.flush_out().await?;
        let mut rows = Vec::new();
        let mut error = None;
        loop {
            match self.read_backend().await? {
                Backend::Other(Message::DataRow(row)) => {
                    let buf = row.buffer();
                    let mut values = Vec::new();
                    let mut ranges = row.ranges();
                    while let Some(range) = ranges.next()? {
                        values.push(
                            range
                                .and_then(|r| buf.get(r))
                                .map(|b| String::from_utf8_lossy(b).into_owned()),
                        );
                    }
                    rows.push(values);
                }
                Backend::Other(Message::ErrorResponse(e)) => error = Some(server_error(&e)),
                Backend::Other(Message::ReadyForQuery(_)) => break,
                Backend::Other(_) => {}
                _ => {
                    return Err(ReplicationError::Protocol(format!(
                        "unexpected CopyBoth traffic answering {sql:?}"
                    )))
                }
            }
        }
        match error {
            Some(e) => Err(e),
            None => Ok(rows),
        }
    }

    pub(crate) async fn identify_system(&mut self) -> Result<SystemIdentity, ReplicationError> {
        let rows = self.simple_query("IDENTIFY_SYSTEM").await?;
        let row = Answer::first("IDENTIFY_SYSTEM", &rows)?;
        let xlogpos = row.lsn(2, "xlogpos")?;
        Ok(SystemIdentity {
            system_id: row.field(0).unwrap_or_default(),
            timeline: row.field(1).and_then(|s| s.parse().ok()).unwrap_or(0),
            xlogpos,
        })
    }

    /// Creates a logical pgoutput slot (a failover slot when `failover` and the server is 17+)
    /// and exports the snapshot it was created at, for a backfill.
    ///
    /// Returns the slot's consistent point and the snapshot's name. The snapshot sees exactly the
    /// transactions that committed before the consistent point, and stays importable (`SET
    /// TRANSACTION SNAPSHOT`) only until this connection runs another command or closes — so
    /// keep the connection open until the backfill's reading transaction has imported it.
    /// `slot` must be a validated simple name (config's `SimpleName`).
    pub(crate) async fn create_logical_slot_exporting_snapshot(
        &mut self,
        slot: &str,
        failover: bool,
    ) -> Result<(Lsn, String), ReplicationError> {
        // PostgreSQL 15 introduced the parenthesized option list; older servers know only the
        // keyword form (which 15+ still accept, but may drop). FAILOVER came with 17.
        let failover = if failover && self.server_version_num >= 170_000 {
            ", FAILOVER"
        } else {
            ""
        };
        let sql = if self.server_version_num >= 150_000 {
            format!("CREATE_REPLICATION_SLOT {slot} LOGICAL pgoutput (SNAPSHOT 'export'{failover})")
        } else {
            format!("CREATE_REPLICATION_SLOT {slot} LOGICAL pgoutput EXPORT_SNAPSHOT")
        };
        let rows = self.simple_query(&sql).await?;
        // Columns: slot_name, consistent_point, snapshot_name, output_plugin.
        let row = Answer::first("CREATE_REPLICATION_SLOT", &rows)?;
        let consistent_point = row.lsn(1, "consistent_point")?;
        let snapshot = row
            .field(2)
            .ok_or_else(|| ReplicationError::Protocol("CREATE_REPLICATION_SLOT exported no snapshot".into()))?;
        Ok((consistent_point, snapshot))
    }

    /// Says goodbye (`Terminate`) and closes the connection, so the server logs no lost client.
    pub(crate) async fn close(mut self) {
        frontend::terminate(&mut self.out);
        let _ = self.flush_out().await;
        let _ = self.stream.shutdown().await;
    }

    /// Sends `START_REPLICATION` and switches to CopyBoth mode.
    ///
    /// `start` of zero lets the server resume at the slot's `confirmed_flush_lsn`; transactions
    /// that committed before the resume point are never sent again.
    pub(crate) async fn start_replication(
        mut self,
        slot: &str,
        start: Lsn,
        publication: &str,
        messages: bool,
        protocol: super::protocol::Protocol,
    ) -> Result<(FrameReader, StatusWriter), ReplicationError> {
        // Slot and publication names are validated as [a-z0-9_]+ by config (SimpleName).
        let mut options = format!("{}, publication_names '{publication}'", protocol.options());
        if messages && self.server_version_num >= 140_000 {
            options.push_str(", messages 'true'");
        }
        let sql = format!("START_REPLICATION SLOT {slot} LOGICAL {start} ({options})");
        debug!(%sql, "starting replication");
        frontend::query(&sql, &mut self.out)?;
        self.flush_out().await?;
        loop {
            match self.read_backend().await? {
                Backend::CopyBothResponse => break,
                Backend::Other(Message::ErrorResponse(e)) => return Err(server_error(&e)),
                Backend::Other(Message::NoticeResponse(n)) => log_notice(&n),
                Backend::Other(_) => {}
                _ => {
                    return Err(ReplicationError::Protocol(
                        "unexpected reply to START_REPLICATION".into(),
                    ))
                }
            }
        }
        let (reader, writer) = tokio::io::split(self.stream);
        Ok((
            FrameReader {
                reader,
                buf: self.buf,
                copy_done: false,
            },
            StatusWriter { writer, out: self.out },
        ))
    }

    async fn flush_out(&mut self) -> Result<(), ReplicationError> {
        self.stream.write_all(&self.out).await?;
        self.stream.flush().await?;
        self.out.clear();
        Ok(())
    }

    async fn read_backend(&mut self) -> Result<Backend, ReplicationError> {
        loop {
            if let Some(msg) = parse_backend(&mut self.buf)? {
                return Ok(msg);
            }
            self.buf.reserve(READ_CHUNK);
            if self.stream.read_buf(&mut self.buf).await? == 0 {
                return Err(ReplicationError::Closed);
            }
        }
    }
}

/// The receiving half during streaming: yields the payload of each `CopyData` frame.
pub(crate) struct FrameReader {
    reader: ReadHalf<Transport>,
    buf: BytesMut,
    copy_done: bool,
}

impl FrameReader {
    /// The next CopyData payload, or `None` once the server ended the copy.
    ///
    /// Cancel-safe: all state lives in `self.buf`, and `read_buf` is cancel-safe, so this can
    /// sit in a `tokio::select!` arm.
    pub(crate) async fn next_frame(&mut self) -> Result<Option<Bytes>, ReplicationError> {
        loop {
            if let Some(frame) = self.try_next_frame()? {
                return Ok(Some(frame));
            }
            if self.copy_done {
                return Ok(None);
            }
            self.buf.reserve(READ_CHUNK);
            if self.reader.read_buf(&mut self.buf).await? == 0 {
                return Err(ReplicationError::Closed);
            }
        }
    }

    /// A frame already buffered, without waiting for the socket.
    pub(crate) fn try_next_frame(&mut self) -> Result<Option<Bytes>, ReplicationError> {
        while !self.copy_done {
            match parse_backend(&mut self.buf)? {
                Some(Backend::CopyData(data)) => return Ok(Some(data)),
                Some(Backend::CopyDone) => self.copy_done = true,
                Some(Backend::Other(Message::ErrorResponse(e))) => return Err(server_error(&e)),
                Some(Backend::Other(Message::NoticeResponse(n))) => log_notice(&n),
                Some(_) => {}
                None => return Ok(None),
            }
        }
        Ok(None)
    }

    /// After our CopyDone: drains the server's CopyDone / CommandComplete / ReadyForQuery.
    pub(crate) async fn finish(&mut self, timeout: Duration) {
        let drain = async {
            loop {
                match parse_backend(&mut self.buf) {
                    Ok(Some(Backend::Other(Message::ReadyForQuery(_)))) => return,
                    Ok(Some(_)) => continue,
                    Ok(None) => {}
                    Err(_) => return,
                }
                self.buf.reserve(READ_CHUNK);
                match self.reader.read_buf(&mut self.buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(_) => {}
                }
            }
        };
        let _ = tokio::time::timeout(timeout, drain).await;
    }
}

/// The sending half during streaming: standby status updates and the final CopyDone.
pub(crate) struct StatusWriter {
    writer: WriteHalf<Transport>,
    out: BytesMut,
}

impl StatusWriter {
    /// Sends one `CopyData` frame whose payload `encode` writes.
    pub(crate) async fn send_copy_data(&mut self, encode: impl FnOnce(&mut BytesMut)) -> Result<(), ReplicationError> {
        self.out.clear();
        self.out.put_u8(b'd');
        self.out.put_i32(0);
        encode(&mut self.out);
        let len = i32::try_from(self.out.len() - 1)
            .map_err(|_| ReplicationError::Protocol("status message too large".into()))?;
        self.out[1..5].copy_from_slice(&len.to_be_bytes());
        self.writer.write_all(&self.out).await?;
        self.writer.flush().await?;
        Ok(())
    }

    /// Ends the stream from our side (`CopyDone`), then says goodbye (`Terminate`) when asked.
    pub(crate) async fn send_copy_done(&mut self) -> Result<(), ReplicationError> {
        self.out.clear();
        frontend::copy_done(&mut self.out);
        self.writer.write_all(&self.out).await?;
        self.writer.flush().await?;
        Ok(())
    }

    pub(crate) async fn terminate(&mut self) {
        self.out.clear();
        frontend::terminate(&mut self.out);
        let _ = self.writer.write_all(&self.out).await;
        let _ = self.writer.flush().await;
        let _ = self.writer.shutdown().await;
    }
}

/// Frames one backend message from the buffer, or `None` if it is not complete yet.
fn parse_backend(buf: &mut BytesMut) -> Result<Option<Backend>, ReplicationError> {
    let Some(header) = buf.get(..5) else { return Ok(None) };
    let tag = header[0];
    let len = u32::from_be_bytes([header[1], header[2], header[3], header[4]]) as usize;
    if !(4..=MAX_MESSAGE_BYTES).contains(&len) {
        return Err(ReplicationError::Protocol(format!(
            "invalid message length {len} for tag {:?}",
            tag as char
        )));
    }
    if buf.len() < len + 1 {
        return Ok(None);
    }
    match tag {
        b'd' => {
            let mut frame = buf.split_to(len + 1);
            frame.advance(5);
            Ok(Some(Backend::CopyData(frame.freeze())))
        }
        b'W' => {
            buf.advance(len + 1);
            Ok(Some(Backend::CopyBothResponse))
        }
        b'c' => {
            buf.advance(len + 1);
            Ok(Some(Backend::CopyDone))
        }
        _ => match Message::parse(buf)? {
            Some(m) => Ok(Some(Backend::Other(m))),
            None => Ok(None),
        },
    }
}

/// Makes a silently dead peer (network cut, host gone) an error within about `limit`.
///
/// A walsender never answers data we do not send, and while the relay pauses reading
/// (backpressure) it cannot notice silence either; but it sends a status update every
/// `status_interval`. `TCP_USER_TIMEOUT` fails the socket once sent data stays unacknowledged for
/// `limit`, which catches a cut link whatever the read side is doing. Keepalive probes (first after
/// a third of `limit`) cover a connection with nothing in flight. Linux only; elsewhere the
/// session's receive-silence check (`relay/silence.rs`) is the only guard.
fn tune_tcp(tcp: &tokio::net::TcpStream, limit: Duration) -> Result<(), ReplicationError> {
    let sock = socket2::SockRef::from(tcp);
    let idle = (limit / 3).max(Duration::from_secs(1));
    let keepalive = socket2::TcpKeepalive::new()
        .with_time(idle)
        .with_interval((limit / 6).max(Duration::from_secs(1)));
    sock.set_tcp_keepalive(&keepalive)?;
    #[cfg(any(target_os = "linux", target_os = "android"))]
    sock.set_tcp_user_timeout(Some(limit))?;
    Ok(())
}

async fn connect_tcp(host: &str, port: u16) -> Result<tokio::net::TcpStream, ReplicationError> {
    let failed = |source: std::io::Error| ReplicationError::Connect {
        host: host.to_owned(),
        port,
        source,
    };
    let mut last = None;
    for addr in tokio::net::lookup_host((host, port)).await.map_err(failed)? {
        let socket = if addr.is_ipv4() {
            TcpSocket::new_v4()?
        } else {
            TcpSocket::new_v6()?
        };
        // Keepalives notice a dead peer (network cut) even while we are not sending.
        socket.set_keepalive(true)?;
        match socket.connect(addr).await {
            Ok(s) => {
                s.set_nodelay(true)?;
                return Ok(s);
            }
            Err(e) => last = Some(e),
        }
    }
    Err(failed(last.unwrap_or_else(|| {
        std::io::Error::new(std::io::ErrorKind::NotFound, format!("host {host:?} did not resolve"))
    })))
}

async fn negotiate_tls(
    mut tcp: tokio::net::TcpStream,
    host: &str,
    mode: SslMode,
    settings: &PostgresSettings,
) -> Result<Transport, ReplicationError> {
    if mode == SslMode::Disable {
        return Ok(Transport::Tcp(tcp));
    }
    let mut req = BytesMut::new();
    frontend::ssl_request(&mut req);
    tcp.write_all(&req).await?;
    let answer = tcp.read_u8().await?;
    match answer {
        b'S' => {
            let config = tls::client_config(settings.sslrootcert.as_deref())?;
            let connector = tokio_rustls::TlsConnector::from(config);
            let tls = connector
                .connect(tls::server_name(host)?, tcp)
                .await
                .map_err(tls_handshake_error)?;
            Ok(Transport::Tls(Box::new(tls)))
        }
        b'N' if mode == SslMode::Require => Err(ReplicationError::Auth(
            "sslmode=require but the server does not support TLS; enable ssl on the server or change sslmode".into(),
        )),
        b'N' => Ok(Transport::Tcp(tcp)),
        other => Err(ReplicationError::Protocol(format!(
            "unexpected answer {other:#x} to SSLRequest"
        ))),
    }
}

/// A failed TLS handshake: a certificate that does not verify (or another TLS refusal) is a
/// configuration problem, not worth a reconnect; anything else is I/O.
fn tls_handshake_error(e: std::io::Error) -> ReplicationError {
    if !e.get_ref().is_some_and(|inner| inner.is::<rustls::Error>()) {
        return ReplicationError::Io(e);
    }
    let kind = e.kind();
    match e.into_inner().map(|inner| inner.downcast::<rustls::Error>()) {
        Some(Ok(tls)) => ReplicationError::Tls(tls::TlsError::Rustls(*tls)),
        Some(Err(inner)) => ReplicationError::Io(std::io::Error::new(kind, inner)),
        None => ReplicationError::Io(kind.into()),
    }
}

fn fields_of(fields: &mut postgres_protocol::message::backend::ErrorFields<'_>) -> ServerError {
    let mut e = ServerError::default();
    while let Ok(Some(f)) = fields.next() {
        let v = String::from_utf8_lossy(f.value_bytes()).into_owned();
        match f.type_() {
            b'V' => e.severity = v,
            b'S' if e.severity.is_empty() => e.severity = v,
            b'C' => e.code = v,
            b'M' => e.message = v,
            b'D' => e.detail = Some(v),
            b'H' => e.hint = Some(v),
            _ => {}
        }
    }
    e
}

fn server_error(body: &ErrorResponseBody) -> ReplicationError {
    ReplicationError::Server(Box::new(fields_of(&mut body.fields())))
}

fn auth_error(body: &ErrorResponseBody) -> ReplicationError {
    ReplicationError::AuthRefused {
        server: fields_of(&mut body.fields()),
    }
}

fn log_notice(body: &postgres_protocol::message::backend::NoticeResponseBody) {
    let e = fields_of(&mut body.fields());
    if e.severity == "WARNING" {
        warn!(code = %e.code, "server: {}", e.message);
    } else {
        info!(code = %e.code, "server: {}", e.message);
    }
}

/// `server_version` such as "15.4 (Debian …)" → 150004, for servers that do not report
/// `server_version_num` at startup (it became a reported parameter only in PostgreSQL 16).
/// Pre-releases ("17beta1", "18rc1", "16devel") are the major with minor 0: the digits after
/// "beta"/"rc" number the pre-release, not a minor version.
fn parse_server_version(v: &str) -> u32 {
    let version = v.split_whitespace().next().unwrap_or_default();
    let numeric_end = version
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(version.len());
    let mut parts = version[..numeric_end].split('.').filter(|s| !s.is_empty());
    let major: u32 = parts.next().and_then(|s| s.parse().ok()).unwrap_or(0);
    let minor: u32 = parts.next().and_then(|s| s.parse().ok()).unwrap_or(0);
    if major >= 10 {
        major * 10_000 + minor
    } else {
        major * 10_000 + minor * 100
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_version_strings_parse() {
        assert_eq!(parse_server_version("15.4"), 150004);
        assert_eq!(parse_server_version("15.4 (Debian 15.4-1)"), 150004);
        assert_eq!(parse_server_version("14.10 (Debian 14.10-1)"), 140010);
        assert_eq!(parse_server_version("9.6.2"), 90600);
        // Pre-releases: the major, minor 0 (the number after beta/rc is not a minor version).
        assert_eq!(parse_server_version("17beta1"), 170000);
        assert_eq!(parse_server_version("18rc1"), 180000);
        assert_eq!(parse_server_version("16devel"), 160000);
        assert_eq!(parse_server_version("9.6beta2"), 90600);
    }

    #[test]
    fn tls_refusals_are_fatal_and_other_handshake_errors_are_io() {
        let refused = std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer),
        );
        let err = tls_handshake_error(refused);
        assert!(
            matches!(err, ReplicationError::Tls(_)) && !err.is_transient(),
            "{err:?}"
        );
        let reset = tls_handshake_error(std::io::Error::from(std::io::ErrorKind::ConnectionReset));
        assert!(
            matches!(reset, ReplicationError::Io(_)) && reset.is_transient(),
            "{reset:?}"
        );
    }

    #[test]
    fn framing_handles_partial_and_copy_messages() {
        let mut buf = BytesMut::new();
        buf.extend_from_slice(&[b'd', 0, 0, 0, 7, 1, 2]);
        assert!(parse_backend(&mut buf).unwrap().is_none());
        buf.extend_from_slice(&[3, b'W', 0, 0, 0, 7, 0, 0, 0]);
        match parse_backend(&mut buf).unwrap() {
            Some(Backend::CopyData(b)) => assert_eq!(&b[..], &[1, 2, 3]),
            _ => panic!("expected CopyData"),
        }
        assert!(matches!(
            parse_backend(&mut buf).unwrap(),
            Some(Backend::CopyBothResponse)
        ));
        assert!(buf.is_empty());
        let mut bad = BytesMut::from(&[b'd', 0, 0, 0, 2][..]);
        assert!(parse_backend(&mut bad).is_err());
    }
}
