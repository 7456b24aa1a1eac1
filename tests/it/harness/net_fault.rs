//! Network faults for the nemesis (`nemesis.rs`): relays in network namespaces of their own,
//! PostgreSQL and each broker at addresses of their own, links that can be cut silently, and a
//! userspace proxy per service that can stall, delay and reset.
//!
//! Layout of one [`FaultNet`] (`N` unique per live net, 200..=254):
//! * each service `s` (1..) has the address `10.N.0.s` on the host's `lo`, where its
//!   [`Proxy`] listens (in the test process) and forwards to the real server on 127.0.0.1;
//! * each relay namespace `r` (1..) is `nm<N>r<r>`, with one veth pair per service:
//!   `10.N.r.(4s+1)` on the host side, `10.N.r.(4s+2)` inside, and a route to `10.N.0.s` over it.
//!   So relay `r`'s path to service `s` is a link of its own, cut without touching the others.
//!
//! A cut is a `blackhole` qdisc on a veth's egress (this kernel has neither netem nor a packet
//! filter): packets are dropped with no RST and no ICMP, in one direction (the relay's side:
//! relay → service; the host's side: service → relay) or both. Latency, stalls and resets are
//! the proxy's, as userspace is where they can be injected here.
//!
//! Invariant: everything is bounded and undone. Every `ip`/`tc` command is checked; dropping a
//! [`FaultNet`] (also while a test panics) deletes its veths and namespaces,
//! removes its addresses and stops its proxies; a net left behind by a killed test binary is
//! swept by the next [`FaultNet::new`] that picks its `N` (the owner's pid is in a lock file).

use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::fault_support::random_below;

const LOCK_DIR: &str = "/run/outbox-relay-nemesis";

/// Runs `prog args…`; panics with its stderr when it fails.
fn sh(prog: &str, args: &[&str]) {
    let out = Command::new(prog)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{prog}: {e}"));
    assert!(
        out.status.success(),
        "`{prog} {}` failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Runs it and ignores the outcome (cleanup of what may already be gone).
fn sh_quiet(prog: &str, args: &[&str]) {
    let _ = Command::new(prog).args(args).output();
}

/// Whether the fault harness can run here: root, `ip netns` and the `blackhole` qdisc.
/// When it cannot: [`super::needs::missing`] (a loud SKIPPING line; a failure under CI). (A veth
/// pair probes it: this kernel has no dummy links.)
pub fn available() -> bool {
    static AVAILABLE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let ok = *AVAILABLE.get_or_init(|| {
        let probe = format!("nmp{}", std::process::id() % 100_000);
        let ok = Command::new("ip")
            .args([
                "link",
                "add",
                &probe,
                "type",
                "veth",
                "peer",
                "name",
                &format!("{probe}p"),
            ])
            .output()
            .is_ok_and(|o| o.status.success())
            && Command::new("tc")
                .args(["qdisc", "add", "dev", &probe, "root", "blackhole"])
                .output()
                .is_ok_and(|o| o.status.success());
        sh_quiet("ip", &["link", "del", &probe]);
        ok
    });
    if !ok {
        super::needs::missing(super::needs::NETWORK_NAMESPACES, "", "");
    }
    ok
}

/// Which way a cut drops packets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dir {
    /// Relay → service dropped (the service hears nothing; its answers would still arrive).
    ToService,
    /// Service → relay dropped (the relay hears nothing; what it sends still arrives).
    FromService,
    Both,
}

/// What a [`Proxy`] does with its connections.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Forward bytes as they come.
    Pass,
    /// Accept, forward nothing either way (bytes already read are held), answer nothing.
    Stall,
    /// Forward each chunk `base ± jitter` after it was read, never reordering a direction.
    Delay { base: Duration, jitter: Duration },
    /// Reset (RST) every open connection and every new one.
    Reset,
    /// [`Mode::Stall`] for the connections accepted before the `n`th ([`Proxy::mark`]), and
    /// [`Mode::Pass`] for the others: a peer that holds old connections' bytes and serves new
    /// ones (a stalled broker recovering one socket at a time, a middlebox).
    HoldBefore(u64),
}

impl Mode {
    /// Whether connection `conn` (its accept number) forwards nothing now.
    fn stalls(&self, conn: u64) -> bool {
        match self {
            Mode::Stall => true,
            Mode::HoldBefore(n) => conn < *n,
            _ => false,
        }
    }
}

struct ProxyState {
    mode: watch::Sender<Mode>,
    target: Mutex<Option<SocketAddr>>,
    /// Connections accepted so far (the next one's number).
    accepted: std::sync::atomic::AtomicU64,
}

/// A TCP proxy in the test process: listens on `addr`, forwards to its target.
pub struct Proxy {
    addr: SocketAddr,
    state: Arc<ProxyState>,
    accept: JoinHandle<()>,
}

impl Proxy {
    /// Listens on `bind` (port 0: any); forwards to `target` once set.
    pub async fn start(bind: SocketAddr, target: Option<SocketAddr>) -> Proxy {
        let listener = TcpListener::bind(bind)
            .await
            .unwrap_or_else(|e| panic!("proxy bind {bind}: {e}"));
        let addr = listener.local_addr().expect("proxy addr");
        let (mode, _) = watch::channel(Mode::Pass);
        let state = Arc::new(ProxyState {
            mode,
            target: Mutex::new(target),
            accepted: Default::default(),
        });
        let s = state.clone();
        let accept = tokio::spawn(async move {
            while let Ok((inbound, _)) = listener.accept().await {
                let conn = s.accepted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                tokio::spawn(handle(inbound, s.clone(), conn));
            }
        });
        Proxy { addr, state, accept }
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn set_target(&self, target: SocketAddr) {
        *self.state.target.lock().unwrap() = Some(target);
    }

    pub fn set_mode(&self, mode: Mode) {
        self.state.mode.send_replace(mode);
    }

    pub fn mode(&self) -> Mode {
        *self.state.mode.borrow()
    }

    /// The number the next accepted connection gets: [`Mode::HoldBefore`] it holds every
    /// connection accepted until now.
    pub fn mark(&self) -> u64 {
        self.state.accepted.load(std::sync::atomic::Ordering::SeqCst)
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accept.abort();
        // Every connection task watches the mode: they all end (with a reset).
        self.state.mode.send_replace(Mode::Reset);
    }
}

/// Closes with RST: linger 0, then drop.
#[allow(deprecated)] // `set_linger` blocks on close only with a non-zero linger.
fn reset(stream: TcpStream) {
    let _ = stream.set_linger(Some(Duration::ZERO));
    drop(stream);
}

async fn wait_reset(mut mode: watch::Receiver<Mode>) {
    let _ = mode.wait_for(|m| *m == Mode::Reset).await;
}

async fn handle(inbound: TcpStream, state: Arc<ProxyState>, conn: u64) {
    let mut mode = state.mode.subscribe();
    // A stalled service accepts and answers nothing, not even the connection upstream.
    let gate = mode.wait_for(|m| !m.stalls(conn)).await.map(|m| *m);
    if !matches!(gate, Ok(m) if m != Mode::Reset) {
        return reset(inbound);
    }
    let target = *state.target.lock().unwrap();
    let Some(target) = target else { return reset(inbound) };
    let outbound = match tokio::time::timeout(Duration::from_secs(10), TcpStream::connect(target)).await {
        Ok(Ok(s)) => s,
        _ => return reset(inbound),
    };
    let _ = inbound.set_nodelay(true);
    let _ = outbound.set_nodelay(true);
    let (mut inbound, mut outbound) = (inbound, outbound);
    {
        let (ri, wi) = inbound.split();
        let (ro, wo) = outbound.split();
        let both = async {
            tokio::join!(
                pump(ri, wo, state.mode.subscribe(), conn),
                pump(ro, wi, state.mode.subscribe(), conn)
            )
        };
        tokio::select! {
            biased;
            _ = wait_reset(state.mode.subscribe()) => {}
            _ = both => return,
        }
    }
    reset(inbound);
    reset(outbound);
}

/// One direction: read chunks, hand them to the writer with their delivery time, write them
/// in order at that time; both halves hold while the mode stalls connection `conn`.
async fn pump(
    mut r: impl AsyncReadExt + Unpin,
    mut w: impl AsyncWriteExt + Unpin,
    mode: watch::Receiver<Mode>,
    conn: u64,
) {
    let (tx, mut rx) = mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    let mut read_mode = mode.clone();
    let reader = async move {
        let mut buf = vec![0u8; 16 * 1024];
        let mut last = Instant::now();
        loop {
            if read_mode.wait_for(|m| !m.stalls(conn)).await.is_err() {
                break;
            }
            let n = match r.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            let delay = match *read_mode.borrow() {
                Mode::Delay { base, jitter } => {
                    let j = jitter.as_millis() as u64;
                    let ms = base.as_millis() as u64 + random_below(2 * j + 1);
                    Duration::from_millis(ms.saturating_sub(j))
                }
                _ => Duration::ZERO,
            };
            let at = (Instant::now() + delay).max(last);
            last = at;
            if tx.send((at, buf[..n].to_vec())).is_err() {
                break;
            }
        }
    };
    let mut write_mode = mode;
    let writer = async move {
        while let Some((at, bytes)) = rx.recv().await {
            tokio::time::sleep_until(at).await;
            if write_mode.wait_for(|m| !m.stalls(conn)).await.is_err() {
                return;
            }
            if w.write_all(&bytes).await.is_err() {
                return;
            }
        }
        let _ = w.shutdown().await;
    };
    tokio::join!(reader, writer);
}

struct Service {
    name: String,
    ip: Ipv4Addr,
    proxy: Proxy,
}

/// Namespaces, links and proxies of one test; see the module docs.
pub struct FaultNet {
    n: u8,
    lock: PathBuf,
    services: Vec<Service>,
    relays: Vec<String>,
}

fn pid_alive(pid: u32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
}

fn sweep(n: u8) {
    let list = Command::new("ip")
        .args(["netns", "list"])
        .output()
        .expect("ip netns list");
    let prefix = format!("nm{n}r");
    for line in String::from_utf8_lossy(&list.stdout).lines() {
        let name = line.split_whitespace().next().unwrap_or("");
        if name.starts_with(&prefix) {
            sh_quiet("ip", &["netns", "del", name]);
        }
    }
    delete_links(&prefix);
    for s in 1..=32 {
        sh_quiet("ip", &["addr", "del", &format!("10.{n}.0.{s}/32"), "dev", "lo"]);
    }
}

/// Deletes the host's links named `prefix…` (a namespace is destroyed asynchronously, and with
/// it the host side of its veths: delete them now, so the next net of this `N` finds none).
fn delete_links(prefix: &str) {
    let list = Command::new("ip")
        .args(["-o", "link", "show"])
        .output()
        .expect("ip link show");
    for line in String::from_utf8_lossy(&list.stdout).lines() {
        // `7: nm200r1s1h@if6: <…>`
        let Some(name) = line.split(": ").nth(1) else { continue };
        let name = name.split('@').next().unwrap_or(name);
        if name.starts_with(prefix) {
            sh_quiet("ip", &["link", "del", name]);
        }
    }
}

impl FaultNet {
    /// Takes a free `N` (sweeping one a dead test binary left behind).
    pub fn new() -> FaultNet {
        // Tests of this binary allocate one at a time; other binaries are kept apart by the lock
        // files, each created with its owner's pid already in it (a hard link is atomic), so a
        // half-written lock is never mistaken for an abandoned one.
        static ALLOCATE: Mutex<()> = Mutex::new(());
        let _one_at_a_time = ALLOCATE.lock().unwrap_or_else(|e| e.into_inner());
        std::fs::create_dir_all(LOCK_DIR).expect("lock dir");
        let me = std::process::id();
        let draft = PathBuf::from(format!("{LOCK_DIR}/draft-{me}"));
        std::fs::write(&draft, me.to_string()).expect("write lock draft");
        for n in 200u8..=254 {
            let lock = PathBuf::from(format!("{LOCK_DIR}/{n}"));
            if let Ok(owner) = std::fs::read_to_string(&lock) {
                match owner.trim().parse::<u32>() {
                    Ok(pid) if pid_alive(pid) => continue,
                    _ => {
                        sweep(n);
                        let _ = std::fs::remove_file(&lock);
                    }
                }
            }
            if std::fs::hard_link(&draft, &lock).is_ok() {
                let _ = std::fs::remove_file(&draft);
                // A previous owner of this `N` may have died mid-test: start clean.
                sweep(n);
                return FaultNet {
                    n,
                    lock,
                    services: Vec::new(),
                    relays: Vec::new(),
                };
            }
        }
        let _ = std::fs::remove_file(&draft);
        panic!("no free fault net in 10.200-254 (see {LOCK_DIR})");
    }

    /// Adds service `name` at `10.N.0.s`, its proxy listening there (on `port`, 0 = any) and
    /// forwarding to `target` (settable later: [`Proxy::set_target`]). Before any relay.
    pub async fn service(&mut self, name: &str, port: u16, target: Option<SocketAddr>) -> usize {
        assert!(self.relays.is_empty(), "add services before relay namespaces");
        let s = self.services.len() + 1;
        let ip = Ipv4Addr::new(10, self.n, 0, s as u8);
        sh("ip", &["addr", "add", &format!("{ip}/32"), "dev", "lo"]);
        let proxy = Proxy::start(SocketAddr::from((ip, port)), target).await;
        self.services.push(Service {
            name: name.into(),
            ip,
            proxy,
        });
        s
    }

    /// `host:port` where relays (and the test) reach service `s`.
    pub fn endpoint(&self, s: usize) -> String {
        self.services[s - 1].proxy.addr().to_string()
    }

    pub fn proxy(&self, s: usize) -> &Proxy {
        &self.services[s - 1].proxy
    }

    /// Every service's proxy to `mode`.
    pub fn all_proxies(&self, mode: Mode) {
        for svc in &self.services {
            svc.proxy.set_mode(mode);
        }
    }

    /// A new relay namespace with a link to every service; its number `r`.
    pub fn relay_ns(&mut self) -> usize {
        let r = self.relays.len() + 1;
        let ns = format!("nm{}r{r}", self.n);
        sh("ip", &["netns", "add", &ns]);
        self.relays.push(ns.clone());
        sh("ip", &["-n", &ns, "link", "set", "lo", "up"]);
        for (i, svc) in self.services.iter().enumerate() {
            let s = i + 1;
            let (host, inner) = (self.host_if(r, s), self.inner_if(r, s));
            sh(
                "ip",
                &[
                    "link", "add", &host, "type", "veth", "peer", "name", &inner, "netns", &ns,
                ],
            );
            let base = 4 * s as u8;
            let host_ip = format!("10.{}.{r}.{}", self.n, base + 1);
            sh("ip", &["addr", "add", &format!("{host_ip}/30"), "dev", &host]);
            sh("ip", &["link", "set", &host, "up"]);
            let inner_ip = format!("10.{}.{r}.{}/30", self.n, base + 2);
            sh("ip", &["-n", &ns, "addr", "add", &inner_ip, "dev", &inner]);
            sh("ip", &["-n", &ns, "link", "set", &inner, "up"]);
            sh(
                "ip",
                &["-n", &ns, "route", "add", &format!("{}/32", svc.ip), "via", &host_ip],
            );
        }
        r
    }

    /// The namespace name of relay `r` (for [`super::relay_process::NETNS`]).
    pub fn netns(&self, r: usize) -> &str {
        &self.relays[r - 1]
    }

    fn host_if(&self, r: usize, s: usize) -> String {
        format!("nm{}r{r}s{s}h", self.n)
    }

    fn inner_if(&self, r: usize, s: usize) -> String {
        format!("nm{}r{r}s{s}i", self.n)
    }

    /// Cuts relay `r`'s link to service `s` silently in `dir` (adding to any cut already there).
    pub fn cut(&self, r: usize, s: usize, dir: Dir) {
        if matches!(dir, Dir::ToService | Dir::Both) {
            sh(
                "tc",
                &[
                    "-n",
                    self.netns(r),
                    "qdisc",
                    "replace",
                    "dev",
                    &self.inner_if(r, s),
                    "root",
                    "blackhole",
                ],
            );
        }
        if matches!(dir, Dir::FromService | Dir::Both) {
            sh(
                "tc",
                &["qdisc", "replace", "dev", &self.host_if(r, s), "root", "blackhole"],
            );
        }
        eprintln!("nemesis: cut relay {r} from {} ({dir:?})", self.services[s - 1].name);
    }

    /// Restores relay `r`'s link to service `s` in both directions.
    pub fn heal(&self, r: usize, s: usize) {
        sh_quiet(
            "tc",
            &["-n", self.netns(r), "qdisc", "del", "dev", &self.inner_if(r, s), "root"],
        );
        sh_quiet("tc", &["qdisc", "del", "dev", &self.host_if(r, s), "root"]);
    }

    /// Restores every link and puts every proxy back to [`Mode::Pass`].
    pub fn heal_all(&self) {
        for r in 1..=self.relays.len() {
            for s in 1..=self.services.len() {
                self.heal(r, s);
            }
        }
        self.all_proxies(Mode::Pass);
    }
}

impl Default for FaultNet {
    fn default() -> Self {
        FaultNet::new()
    }
}

impl Drop for FaultNet {
    fn drop(&mut self) {
        delete_links(&format!("nm{}r", self.n));
        for ns in &self.relays {
            sh_quiet("ip", &["netns", "del", ns]);
        }
        for svc in &self.services {
            sh_quiet("ip", &["addr", "del", &format!("{}/32", svc.ip), "dev", "lo"]);
        }
        let _ = std::fs::remove_file(&self.lock);
    }
}
