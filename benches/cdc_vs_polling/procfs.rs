//! CPU time and memory of processes, from `/proc` (Linux only).
//!
//! CPU is `utime + stime` in clock ticks (`getconf CLK_TCK`, 100 on Linux: 10 ms resolution);
//! measurement windows are long enough that this resolution stays well under the differences
//! measured. PostgreSQL is a tree of processes: its CPU is the postmaster's own time plus its
//! `cutime + cstime` (children it already reaped: backends that exited, finished autovacuum
//! workers) plus the time of every live child — so nothing the server did is missed.

use std::fs;
use std::process::Command;

fn clock_ticks_per_second() -> f64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse::<f64>().ok())
        .filter(|t| *t > 0.0)
        .unwrap_or(100.0)
}

/// The fields of `/proc/<pid>/stat` this benchmark uses, CPU in seconds.
#[derive(Debug, Clone, Copy)]
pub struct ProcStat {
    pub ppid: u32,
    /// `utime + stime`.
    pub own_cpu: f64,
    /// `cutime + cstime`: reaped children.
    pub children_cpu: f64,
}

pub fn stat(pid: u32) -> Option<ProcStat> {
    let text = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may contain spaces and parentheses; fields resume after the last ')'.
    let rest = &text[text.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let num = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok());
    let tck = ticks();
    // Field N of proc(5) is at index N - 3 here.
    Some(ProcStat {
        ppid: f.get(1)?.parse().ok()?,
        own_cpu: (num(11)? + num(12)?) / tck,
        children_cpu: (num(13)? + num(14)?) / tck,
    })
}

fn ticks() -> f64 {
    static TICKS: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    *TICKS.get_or_init(clock_ticks_per_second)
}

/// CPU seconds of one process (all its threads).
pub fn cpu_seconds(pid: u32) -> Option<f64> {
    stat(pid).map(|s| s.own_cpu)
}

/// A `Vm*` line of `/proc/<pid>/status` in KiB, e.g. `VmRSS`, `VmHWM` (peak RSS).
pub fn vm_kib(pid: u32, field: &str) -> Option<u64> {
    let text = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
}

/// Every process whose parent is `ppid`.
pub fn children(ppid: u32) -> Vec<u32> {
    let Ok(dir) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| stat(*pid).is_some_and(|s| s.ppid == ppid))
        .collect()
}

/// All CPU the PostgreSQL server has used so far (see the module docs).
pub fn postgres_cpu(postmaster: u32) -> f64 {
    let Some(root) = stat(postmaster) else { return 0.0 };
    let live: f64 = children(postmaster)
        .iter()
        .filter_map(|c| stat(*c))
        .map(|s| s.own_cpu + s.children_cpu)
        .sum();
    root.own_cpu + root.children_cpu + live
}

/// One thread of a process: its name (`comm`), CPU so far and context switches.
#[derive(Debug, Clone)]
pub struct ThreadStat {
    pub tid: u32,
    pub name: String,
    /// On-CPU time in seconds: `schedstat`'s nanoseconds where the kernel has it, else
    /// `utime + stime` in clock ticks.
    pub cpu: f64,
    pub voluntary_switches: u64,
    pub nonvoluntary_switches: u64,
}

/// Every live thread of `pid` (`/proc/<pid>/task/*`).
pub fn threads(pid: u32) -> Vec<ThreadStat> {
    let Ok(dir) = fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    let mut out: Vec<ThreadStat> = dir
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|tid| {
            let base = format!("/proc/{pid}/task/{tid}");
            let name = fs::read_to_string(format!("{base}/comm")).ok()?.trim().to_owned();
            let cpu = fs::read_to_string(format!("{base}/schedstat"))
                .ok()
                .and_then(|t| t.split_whitespace().next()?.parse::<f64>().ok())
                .map(|ns| ns / 1e9)
                .or_else(|| {
                    let text = fs::read_to_string(format!("{base}/stat")).ok()?;
                    let rest = &text[text.rfind(')')? + 2..];
                    let f: Vec<&str> = rest.split_whitespace().collect();
                    Some((f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?) / ticks())
                })?;
            let status = fs::read_to_string(format!("{base}/status")).ok()?;
            let field = |name: &str| -> u64 {
                status
                    .lines()
                    .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
                    .and_then(|v| v.trim().parse().ok())
                    .unwrap_or(0)
            };
            Some(ThreadStat {
                tid,
                name,
                cpu,
                voluntary_switches: field("voluntary_ctxt_switches"),
                nonvoluntary_switches: field("nonvoluntary_ctxt_switches"),
            })
        })
        .collect();
    out.sort_by_key(|t| t.tid);
    out
}

/// The process listening on TCP `port` (IPv4 or IPv6), found through the socket's inode in
/// `/proc/net/tcp*` and the processes' `fd` links (needs the right to read them: root, or the
/// same user); `None` when it cannot be told.
pub fn listener_pid(port: u16) -> Option<u32> {
    let hex_port = format!("{port:04X}");
    let inodes: Vec<String> = ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .filter_map(|p| fs::read_to_string(p).ok())
        .flat_map(|text| {
            text.lines()
                .skip(1)
                .filter_map(|l| {
                    let f: Vec<&str> = l.split_whitespace().collect();
                    let local_port = f.get(1)?.rsplit(':').next()?;
                    // State 0A: LISTEN.
                    (local_port == hex_port && *f.get(3)? == "0A").then(|| f.get(9).map(|s| s.to_string()))?
                })
                .collect::<Vec<_>>()
        })
        .filter(|i| i != "0")
        .collect();
    if inodes.is_empty() {
        return None;
    }
    let wanted: Vec<String> = inodes.iter().map(|i| format!("socket:[{i}]")).collect();
    let procs = fs::read_dir("/proc").ok()?;
    for pid in procs.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok()) {
        let Ok(fds) = fs::read_dir(format!("/proc/{pid}/fd")) else {
            continue;
        };
        for fd in fds.flatten() {
            if let Ok(link) = fs::read_link(fd.path()) {
                if wanted.iter().any(|w| link.as_os_str() == w.as_str()) {
                    return Some(pid);
                }
            }
        }
    }
    None
}
