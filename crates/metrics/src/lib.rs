//! Metrics of exitless's data path that workers keep without a lock: [`latency`] holds the
//! service-time histograms (in ticks of the `clock` crate); [`exposition`] writes metrics in
//! the Prometheus text format.

#![deny(missing_docs)]
#![cfg_attr(not(test), warn(clippy::cast_possible_truncation, clippy::cast_sign_loss))]

pub mod exposition;
pub mod latency;
