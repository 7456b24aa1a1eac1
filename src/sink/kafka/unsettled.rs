//! Produce requests an earlier producer of this process wrote into a TCP connection and no
//! broker acknowledged yet: the exactly-once read-back waits for them before it reads.
//!
//! Why: the read-back (`tail.rs`) decides which events the next session publishes again from
//! what the partition holds *now*. A session that ended in a network fault (a link cut silently,
//! a broker stalled) can leave produce requests in the kernel's send buffer of its producer's
//! connections; purging them in librdkafka does not take them back, and closing the socket
//! does not either — the kernel keeps retransmitting an orphaned socket's data. When the link
//! heals, they land, possibly *after* the next session's read-back found nothing: the replay
//! publishes those events again, a duplicate in exactly-once mode (docs/reliability.md §10,
//! defect 4). Kafka fences such late writes only for transactional producers.
//!
//! What: at the start of a session ([`Unsettled::snapshot`]) the TCP connections of this
//! process (a socket inode among `/proc/self/fd`) or orphaned (inode 0: closed by a producer
//! that is gone) with bytes written and not acknowledged (`tx_queue` of `/proc/net/tcp{,6}`).
//! Before a partition is read back, [`Unsettled::settle`] waits until each of them that goes to
//! a broker of the cluster has had its bytes acknowledged or is gone (the kernel gave up on it:
//! its data never reaches the broker), then a short grace for the broker to append and
//! replicate what it just received. Connections opened later (the new producer's) are not
//! waited for.
//!
//! Invariant: after `settle` returned `Ok`, no byte an earlier producer of this process wrote to
//! a broker can still arrive there. Linux only; elsewhere (no `/proc/net/tcp`) nothing is
//! known and nothing is waited for.

use std::collections::HashSet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::{Duration, Instant};

use tracing::{info, warn};

/// How often the connection tables are read again while waiting.
const POLL: Duration = Duration::from_millis(100);
/// After a connection settled by acknowledgement: the broker received the request and appends
/// it, and with `acks=all` the partition's high watermark (what a consumer can read) passes it
/// once the followers fetched it (`replica.fetch.wait.max.ms`, 500 ms by default).
pub(super) const GRACE: Duration = Duration::from_secs(2);

/// One TCP connection: its two ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Conn {
    pub(crate) local: SocketAddr,
    pub(crate) remote: SocketAddr,
}

/// One row of `/proc/net/tcp{,6}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Row {
    conn: Conn,
    /// Bytes written and not acknowledged by the peer.
    unacked: u64,
    inode: u64,
}

/// What [`Unsettled::settle`] found.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Settled {
    /// Nothing of an earlier producer was on the way to these brokers.
    Nothing,
    /// It waited this long for connections that then settled.
    After { connections: usize, waited: Duration },
}

/// Connections to the brokers still holding an earlier producer's bytes at the deadline.
#[derive(Debug, thiserror::Error)]
#[error(
    "{} connection(s) to the brokers still hold produce requests an earlier session wrote and no broker \
     acknowledged ({}); they may still land, so reading back now could publish their events twice. The \
     session starts again and waits anew; this clears once the network delivers them or the kernel gives \
     up on the connections",
    .0.len(), describe(.0)
)]
pub(crate) struct StillUnsettled(pub(crate) Vec<Conn>);

fn describe(conns: &[Conn]) -> String {
    conns
        .iter()
        .map(|c| format!("{} -> {}", c.local, c.remote))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The connections an earlier producer may still deliver through.
#[derive(Debug, Default)]
pub(crate) struct Unsettled {
    conns: Vec<Conn>,
}

impl Unsettled {
    /// This process's and orphaned TCP connections with unacknowledged bytes, now.
    pub(crate) fn snapshot() -> Unsettled {
        let ours = own_socket_inodes();
        let conns = tcp_rows()
            .into_iter()
            .filter(|r| r.unacked > 0 && (r.inode == 0 || ours.contains(&r.inode)))
            .map(|r| r.conn)
            .collect();
        Unsettled { conns }
    }

    #[cfg(test)]
    pub(crate) fn of(conns: Vec<Conn>) -> Unsettled {
        Unsettled { conns }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.conns.is_empty()
    }

    /// Waits until every remembered connection to one of `brokers` has no unacknowledged byte
    /// or is gone, at most `max`; connections to other peers are forgotten. Blocking: called
    /// on the read-back's own thread.
    pub(crate) fn settle(&mut self, brokers: &[SocketAddr], max: Duration) -> Result<Settled, StillUnsettled> {
        self.settle_with(brokers, max, tcp_rows, std::thread::sleep)
    }

    fn settle_with(
        &mut self,
        brokers: &[SocketAddr],
        max: Duration,
        mut rows: impl FnMut() -> Vec<Row>,
        mut sleep: impl FnMut(Duration),
    ) -> Result<Settled, StillUnsettled> {
        self.conns.retain(|c| brokers.contains(&c.remote));
        if self.conns.is_empty() {
            return Ok(Settled::Nothing);
        }
        let connections = self.conns.len();
        let started = Instant::now();
        let mut waited = Duration::ZERO;
        let mut announced = false;
        loop {
            let now = rows();
            self.conns.retain(|c| now.iter().any(|r| r.conn == *c && r.unacked > 0));
            if self.conns.is_empty() {
                sleep(GRACE);
                return Ok(Settled::After {
                    connections,
                    waited: started.elapsed().max(waited) + GRACE,
                });
            }
            if waited >= max {
                let still = std::mem::take(&mut self.conns);
                warn!(connections = still.len(), "{}", StillUnsettled(still.clone()));
                return Err(StillUnsettled(still));
            }
            if !announced {
                info!(
                    connections = self.conns.len(),
                    "exactly-once: produce requests of an earlier session are still on their way to the brokers \
                     ({}); reading back once they arrived or the kernel gave up on them",
                    describe(&self.conns)
                );
                announced = true;
            }
            sleep(POLL);
            waited += POLL;
        }
    }
}

/// The inodes of this process's sockets.
fn own_socket_inodes() -> HashSet<u64> {
    let Ok(dir) = std::fs::read_dir("/proc/self/fd") else {
        return HashSet::new();
    };
    dir.filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter_map(|target| socket_inode(target.to_str()?))
        .collect()
}

/// `socket:[12345]` → 12345.
fn socket_inode(link: &str) -> Option<u64> {
    link.strip_prefix("socket:[")?.strip_suffix(']')?.parse().ok()
}

/// Every row of `/proc/net/tcp` and `/proc/net/tcp6` (this network namespace's connections).
fn tcp_rows() -> Vec<Row> {
    ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .filter_map(|path| std::fs::read_to_string(path).ok())
        .flat_map(|text| text.lines().skip(1).filter_map(parse_row).collect::<Vec<_>>())
        .collect()
}

/// One line: `sl local rem st tx_queue:rx_queue tr:when retrnsmt uid timeout inode …`, the
/// addresses as the kernel prints them (`0100007F:1F90`: the address's 32-bit words in host
/// order, the port in hexadecimal).
fn parse_row(line: &str) -> Option<Row> {
    let mut fields = line.split_whitespace();
    let _sl = fields.next()?;
    let local = parse_addr(fields.next()?)?;
    let remote = parse_addr(fields.next()?)?;
    let _state = fields.next()?;
    let (tx, _rx) = fields.next()?.split_once(':')?;
    let unacked = u64::from_str_radix(tx, 16).ok()?;
    let inode = fields.nth(4)?.parse().ok()?;
    Some(Row {
        conn: Conn { local, remote },
        unacked,
        inode,
    })
}

fn parse_addr(text: &str) -> Option<SocketAddr> {
    let (addr, port) = text.split_once(':')?;
    let port = u16::from_str_radix(port, 16).ok()?;
    let word = |i: usize| -> Option<[u8; 4]> {
        let w = u32::from_str_radix(addr.get(i * 8..i * 8 + 8)?, 16).ok()?;
        // The kernel prints each 32-bit word of the network-order address as a host-order
        // integer: on this (little-endian) host its bytes come out reversed.
        Some(w.to_ne_bytes())
    };
    let ip = match addr.len() {
        8 => IpAddr::V4(Ipv4Addr::from(word(0)?)),
        32 => {
            let mut bytes = [0u8; 16];
            for i in 0..4 {
                bytes[i * 4..i * 4 + 4].copy_from_slice(&word(i)?);
            }
            let v6 = Ipv6Addr::from(bytes);
            // An IPv4 peer of an IPv6 socket: compare it as the IPv4 address it is.
            v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4)
        }
        _ => return None,
    };
    Some(SocketAddr::new(ip, port))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    #[cfg(target_endian = "little")]
    fn rows_of_the_kernels_tables_are_read() {
        let v4 = "   3: 0100007F:D3C2 0200000A:2384 01 000001A4:00000000 01:00000014 00000003     0        0 812345 2 \
                  0000000000000000 20 4 30 10 -1";
        assert_eq!(
            parse_row(v4),
            Some(Row {
                conn: Conn {
                    local: addr("127.0.0.1:54210"),
                    remote: addr("10.0.0.2:9092"),
                },
                unacked: 0x1A4,
                inode: 812_345,
            })
        );
        // An orphaned IPv6 socket (inode 0) whose peer is an IPv4-mapped address.
        let v6 = "   0: 0000000000000000FFFF00000100007F:C350 0000000000000000FFFF00000200000A:2384 04 \
                  00000001:00000000 01:00000020 00000005     0        0 0 1 0000000000000000 20 4 0 10 -1";
        let row = parse_row(v6).unwrap();
        assert_eq!(row.conn.remote, addr("10.0.0.2:9092"));
        assert_eq!((row.unacked, row.inode), (1, 0));
        let v6_plain = "   1: 00000000000000000000000001000000:1F90 00000000000000000000000001000000:A000 0A \
                        00000000:00000000 00:00000000 00000000     0        0 4242 1";
        assert_eq!(parse_row(v6_plain).unwrap().conn.local, addr("[::1]:8080"));
        // The header line and garbage are skipped.
        assert_eq!(
            parse_row("  sl  local_address rem_address   st tx_queue rx_queue tr tm->when"),
            None
        );
        assert_eq!(parse_row("0: zz:1 yy:2"), None);
        assert_eq!(socket_inode("socket:[77]"), Some(77));
        assert_eq!(socket_inode("pipe:[77]"), None);
    }

    #[test]
    fn settling_waits_for_the_brokers_connections_only_and_gives_up_at_the_bound() {
        let broker = addr("10.0.0.2:9092");
        let old = Conn {
            local: addr("10.0.0.1:40000"),
            remote: broker,
        };
        let postgres = Conn {
            local: addr("10.0.0.1:40001"),
            remote: addr("10.0.0.3:5432"),
        };
        let row = |conn, unacked| Row {
            conn,
            unacked,
            inode: 0,
        };
        // Acknowledged on the third look: waited, then the grace.
        let mut looks = 0;
        let mut slept = Vec::new();
        let outcome = Unsettled::of(vec![old, postgres]).settle_with(
            &[broker],
            Duration::from_secs(10),
            || {
                looks += 1;
                vec![row(old, if looks < 3 { 120 } else { 0 }), row(postgres, 50)]
            },
            |d| slept.push(d),
        );
        assert!(
            matches!(outcome, Ok(Settled::After { connections: 1, .. })),
            "{outcome:?}"
        );
        assert_eq!(slept, [POLL, POLL, GRACE], "PostgreSQL's connection is not waited for");
        // Gone from the table: the kernel gave up, its bytes never arrive.
        let outcome = Unsettled::of(vec![old]).settle_with(&[broker], Duration::from_secs(10), Vec::new, |_| {});
        assert!(matches!(outcome, Ok(Settled::After { .. })));
        // Nothing to the brokers: no wait at all.
        let mut slept = Vec::new();
        let outcome =
            Unsettled::of(vec![postgres]).settle_with(&[broker], Duration::from_secs(10), Vec::new, |d| slept.push(d));
        assert_eq!(outcome.unwrap(), Settled::Nothing);
        assert!(slept.is_empty());
        // Still unacknowledged at the bound: an error naming the connection.
        let err = Unsettled::of(vec![old])
            .settle_with(&[broker], Duration::from_millis(300), || vec![row(old, 7)], |_| {})
            .unwrap_err();
        assert_eq!(err.0, [old]);
        let text = err.to_string();
        assert!(
            text.contains("10.0.0.1:40000 -> 10.0.0.2:9092") && text.contains("twice"),
            "{text}"
        );
    }

    #[test]
    fn this_process_sees_its_own_connection_and_its_unacknowledged_bytes_settle() {
        // A real loopback connection: written, then read by the peer; it is ours (its inode is
        // among our fds) and settles once the peer's kernel acknowledged it.
        use std::io::Write;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let server = listener.local_addr().unwrap();
        let mut client = std::net::TcpStream::connect(server).unwrap();
        let (_accepted, _) = listener.accept().unwrap();
        client.write_all(&[0u8; 1000]).unwrap();
        let local = client.local_addr().unwrap();
        let ours = own_socket_inodes();
        let row = tcp_rows()
            .into_iter()
            .find(|r| r.conn.local == local && r.conn.remote == server);
        let Some(row) = row else {
            eprintln!("SKIPPING: no /proc/net/tcp here");
            return;
        };
        assert!(ours.contains(&row.inode), "the connection is this process's");
        let mut unsettled = Unsettled::of(vec![row.conn]);
        let outcome = unsettled.settle_with(&[server], Duration::from_secs(5), tcp_rows, |_| {});
        assert!(outcome.is_ok(), "loopback acknowledges at once: {outcome:?}");
    }
}
