//! `exitless`: a KVM VMM whose guests do I/O without VM exits, and the benchmarks that show it.

mod cli;
mod logger;
mod run;
mod vm_api;

use clap::Parser;
use exitless_args::{fail, status, usage_error};

fn main() {
    let cli = match cli::Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) if !e.use_stderr() => e.exit(), // --help, --version
        Err(e) => {
            // One line, as for every other error; `--help` has the rest.
            std::process::exit(usage_error(one_line(&e.to_string())));
        }
    };
    // Before any thread is confined: glibc's malloc would otherwise open files later, on
    // whichever (confined) thread first needs what they say.
    sandbox::settle_allocator();
    let prefix = match cli.command {
        cli::Command::VhostUserBlk(_) => "exitless vhost-user-blk",
        cli::Command::VhostUserNet(_) => "exitless vhost-user-net",
        _ => "exitless",
    };
    if let Err(e) = logger::init(prefix) {
        std::process::exit(usage_error(e));
    }
    let code = match cli.command {
        cli::Command::Run(args) => run::main(args),
        cli::Command::Probe(cli::ProbeCommand::Export { file }) => match probe_image::export(&file) {
            Ok(()) => 0,
            Err(e) => fail(format_args!("cannot write {}: {e}", file.display())),
        },
        cli::Command::Bench(args) => exitless_bench::main(*args),
        cli::Command::UdpEcho(args) => exitless_bench::udp::echo(args),
        cli::Command::UdpRr(args) => exitless_bench::udp::rr(args),
        cli::Command::UdpFlood(args) => exitless_bench::udp::frames_flood(args),
        cli::Command::UdpCount(args) => exitless_bench::udp::frames_count(args),
        cli::Command::VhostUserBlk(args) => match vhost_user_blk::run(args) {
            Ok(()) => 0,
            Err(vhost_user_blk::Error::Usage(e)) => {
                // As clap's own usage errors read.
                eprintln!("error: {e}\n\nFor more information, try '--help'.");
                status::USAGE
            }
            Err(e) => fail(e),
        },
        cli::Command::VhostUserNet(args) => match vhost_user_net::run(args) {
            Ok(()) => 0,
            Err(e) if e.is_usage() => usage_error(e),
            Err(e) => fail(e),
        },
    };
    std::process::exit(code);
}

/// clap's error on one line: its first line, and the list it introduces (the missing arguments
/// are named on the indented lines that follow "the following required arguments were not
/// provided:"), without the usage that follows.
fn one_line(clap_error: &str) -> String {
    let mut lines = clap_error.lines();
    let first = lines.next().unwrap_or("invalid arguments").trim_start_matches("error: ").trim();
    let listed: Vec<&str> = lines.take_while(|l| l.starts_with("  ")).map(str::trim).collect();
    if listed.is_empty() {
        first.to_owned()
    } else {
        format!("{first} {}", listed.join(", "))
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_missing_argument_is_named_on_the_one_line() {
        let clap = "error: the following required arguments were not provided:\n  --stats\n\nUsage: exitless run --json --stats\n\nFor more information, try '--help'.\n";
        assert_eq!(super::one_line(clap), "the following required arguments were not provided: --stats");
        assert_eq!(
            super::one_line("error: unexpected argument '--x' found\n\nUsage: ..."),
            "unexpected argument '--x' found"
        );
    }
}
