//! `exitless bench`: scenarios, the machine they ran on, and report formats.

mod baseline;
mod exitcost;
mod machine;

use crate::cli::{BenchArgs, BenchScenario};

pub fn main(args: BenchArgs) -> i32 {
    match args.scenario {
        BenchScenario::Exitcost(args) => exitcost::main(args),
    }
}

/// The command as typed, for reports.
pub fn command_line() -> String {
    let args: Vec<String> = std::env::args().skip(1).collect();
    format!("exitless {}", crate::qemu::shell_words(&args))
}

/// Progress for long runs, on standard error.
pub fn progress(message: std::fmt::Arguments) {
    eprintln!("exitless bench: {message}");
}
