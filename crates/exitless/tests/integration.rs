//! exitless's integration tests: one binary, a module per topic (each module's own doc says what
//! it covers). One binary links once where a binary per file linked 34 times.
//!
//! Tests run two at a time, as `cargo test` runs them on this two-CPU host. A test that needs the
//! machine to itself (polling modes take both CPUs; exit counts and idle CPU time are clean only
//! then) holds `test_infra::one_at_a_time()` for its whole run; every other test holds
//! `test_infra::alongside_others()`, so it never runs beside one of those.
//!
//! Run one topic with `cargo test --release -p exitless --test integration TOPIC::`.

mod bad_input;
mod bench;
mod bench_scale;
mod bench_upgrade;
mod blk;
mod durability;
mod faults;
mod flush;
mod handover;
mod handover_confined;
mod inflight;
mod linux_compat;
mod linux_discard;
mod linux_mq;
mod linux_net;
mod linux_wce;
mod live_migration;
mod local_attacker_daemon;
mod local_attacker_vm;
mod matrix;
mod migration;
mod migration_tcp;
mod net;
mod net_live_migration;
mod net_migration;
mod probe_chains;
mod qemu_peer;
mod rbd;
mod run_probe;
mod seccomp;
mod snapshot;
mod vhost_user_api;
mod vhost_user_blk;
mod vhost_user_frontend;
mod vhost_user_hostile;
mod vhost_user_shared;
