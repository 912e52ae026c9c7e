//! The vhost-user backend against a test frontend over real Unix sockets: one binary, a module
//! per topic, which links once where a binary per file linked four times.

mod handover;
mod inflight;
mod protocol;
mod socket_files;
