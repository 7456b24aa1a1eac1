//! Child-process plumbing: signals, watchdogs and bounded waits for children.
//! (PostgreSQL's own commands run in the library's throwaway cluster, which bounds them.)
//!
//! Signals go through the `kill` command because the crate denies `unsafe` (no libc).

use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// Sends `signal` (a name such as `TERM`, `KILL`, `STOP`, `CONT`, `QUIT`) to `pid`.
/// Returns whether `kill` reported success (false if the process is already gone).
pub fn send_signal(pid: u32, signal: &str) -> bool {
    Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(pid.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

/// A `sh` loop that SIGKILLs `child_pid` once this test process is gone, so a test binary
/// killed mid-run (Ctrl-C, SIGKILL, timeout) does not leave relays or brokers running.
/// It exits by itself when the child exits; dropping it stops the loop.
///
/// `/proc` is checked rather than `kill -0` because the loop may run as another user,
/// for which `kill -0` on our pid fails with EPERM and would look like "gone".
pub struct Watchdog {
    child: Option<Child>,
}

impl Watchdog {
    pub fn guard(child_pid: u32) -> Watchdog {
        let script = r#"P=$1; C=$2
while [ -d /proc/$P ] && [ -d /proc/$C ]; do sleep 0.5; done
if [ ! -d /proc/$P ] && [ -d /proc/$C ]; then kill -KILL $C 2>/dev/null; fi"#;
        let child = Command::new("sh")
            .arg("-c")
            .arg(script)
            .arg("watchdog")
            .arg(std::process::id().to_string())
            .arg(child_pid.to_string())
            // Never inherit the test's stdout/stderr: cargo reads those pipes to EOF and
            // would wait for a lingering watchdog.
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .ok();
        Watchdog { child }
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Polls `child` until it exits or `timeout` passes, without blocking the async runtime.
pub async fn wait_child(child: &mut Child, timeout: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return Some(status);
        }
        if Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}
