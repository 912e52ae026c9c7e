//! `exitless`: a KVM VMM whose guests do I/O without VM exits, and the benchmarks that show it.

mod bench;
mod cli;
mod disk;
mod logger;
mod net;
mod probe;
mod qemu;
mod run;
mod seccomp;
mod size;
mod udp;
mod vhost_user;

use clap::Parser;

/// Exit statuses of `exitless` itself (a guest's debug-exit value passes through unchanged).
pub mod status {
    pub const USAGE: i32 = 2;
    pub const GUEST_STOPPED: i32 = 123;
    pub const TIMEOUT: i32 = 124;
    pub const FAILED: i32 = 125;
}

fn main() {
    let cli = match cli::Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) if !e.use_stderr() => e.exit(), // --help, --version
        Err(e) => {
            // One line, as for every other error; `--help` has the rest.
            let text = e.to_string();
            let first = text.lines().next().unwrap_or("invalid arguments");
            std::process::exit(usage_error(first.trim_start_matches("error: ").trim()));
        }
    };
    let prefix = match cli.command {
        cli::Command::VhostUserBlk(_) => "exitless vhost-user-blk",
        _ => "exitless",
    };
    if let Err(e) = logger::init(prefix) {
        std::process::exit(usage_error(e));
    }
    let code = match cli.command {
        cli::Command::Run(args) => run::main(args),
        cli::Command::Probe(cli::ProbeCommand::Export { file }) => match probe::export(&file) {
            Ok(()) => 0,
            Err(e) => fail(format_args!("cannot write {}: {e}", file.display())),
        },
        cli::Command::Bench(args) => bench::main(*args),
        cli::Command::UdpEcho(args) => udp::echo(args),
        cli::Command::UdpRr(args) => udp::rr(args),
        cli::Command::VhostUserBlk(args) => vhost_user::main(args),
    };
    std::process::exit(code);
}

/// Report a mistake on the command line on one line and return the usage status.
pub fn usage_error(message: impl std::fmt::Display) -> i32 {
    eprintln!("exitless: {message} (see `exitless --help`)");
    status::USAGE
}

/// Report an error on one line and return the failure status.
pub fn fail(message: impl std::fmt::Display) -> i32 {
    eprintln!("exitless: error: {message}");
    status::FAILED
}
