//! The `outbox-relay` binary: the CLI and everything behind it live in the library (`src/cli.rs`).

fn main() -> std::process::ExitCode {
    // Crash tests configure failpoints through FAILPOINTS (see src/failpoints.rs).
    #[cfg(feature = "failpoints")]
    let _failpoints = fail::FailScenario::setup();
    outbox_relay::cli::main()
}
