fn main() -> std::process::ExitCode {
    // Crash tests configure failpoints through FAILPOINTS (see src/failpoints.rs).
    #[cfg(feature = "failpoints")]
    let _failpoints = fail::FailScenario::setup();
    outbox_relay::cli::main()
}
