//! A replay's progress: a bar redrawn in place on stderr when stderr is a terminal, a log line
//! every [`LOG_EVERY`] otherwise (a pipe or a log collector would only get carriage returns).

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

use tracing::info;

/// Between two redraws of the bar.
const REDRAW_EVERY: Duration = Duration::from_millis(100);
/// Between two progress log lines when stderr is not a terminal.
const LOG_EVERY: Duration = Duration::from_secs(10);
/// Characters of the bar itself.
const WIDTH: usize = 30;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Output {
    Terminal,
    Log,
}

pub(crate) struct Progress {
    total: u64,
    output: Output,
    started: Instant,
    last: Instant,
}

impl Progress {
    /// `total`: rows this run will hand over at most.
    pub(crate) fn new(total: u64) -> Progress {
        let now = Instant::now();
        Progress {
            total,
            output: if std::io::stderr().is_terminal() {
                Output::Terminal
            } else {
                Output::Log
            },
            started: now,
            last: now,
        }
    }

    /// `done` rows acknowledged so far in this run.
    pub(crate) fn update(&mut self, done: u64) {
        let every = match self.output {
            Output::Terminal => REDRAW_EVERY,
            Output::Log => LOG_EVERY,
        };
        if self.last.elapsed() < every {
            return;
        }
        self.last = Instant::now();
        let rate = done as f64 / self.started.elapsed().as_secs_f64().max(1e-3);
        match self.output {
            Output::Terminal => {
                let mut err = std::io::stderr().lock();
                // A failed write to the terminal only loses a frame of the bar.
                let _ = write!(err, "\r{} {rate:.0} ev/s ", line(done, self.total));
                let _ = err.flush();
            }
            Output::Log => info!(
                acknowledged = done,
                total = self.total,
                rate = format!("{rate:.0} ev/s"),
                "replay in progress"
            ),
        }
    }

    /// Ends the bar's line, so the summary starts on a fresh one.
    pub(crate) fn finish(&mut self) {
        if self.output == Output::Terminal {
            eprintln!();
        }
    }
}

/// `[#########.....................] 300/1000 (30%)`
fn line(done: u64, total: u64) -> String {
    let shown = done.min(total);
    let filled = (shown as usize * WIDTH).checked_div(total as usize).unwrap_or(WIDTH);
    let percent = (shown * 100).checked_div(total).unwrap_or(100);
    format!(
        "[{}{}] {done}/{total} ({percent}%)",
        "#".repeat(filled),
        ".".repeat(WIDTH - filled)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bar_fills_in_proportion() {
        assert_eq!(line(0, 10), format!("[{}] 0/10 (0%)", ".".repeat(WIDTH)));
        assert_eq!(
            line(5, 10),
            format!("[{}{}] 5/10 (50%)", "#".repeat(WIDTH / 2), ".".repeat(WIDTH / 2))
        );
        assert_eq!(line(0, 0), format!("[{}] 0/0 (100%)", "#".repeat(WIDTH)));
        // Rows inserted after the count (no --until) never overflow the bar.
        assert!(line(12, 10).starts_with(&format!("[{}]", "#".repeat(WIDTH))));
    }
}
