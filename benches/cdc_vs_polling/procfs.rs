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
