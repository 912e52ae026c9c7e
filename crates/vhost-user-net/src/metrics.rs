//! `GET /metrics`: the daemon's figures in the Prometheus text exposition format, counters since
//! each NIC was added (`_total`). Per NIC (label `nic`): every counter the switch keeps for its
//! port (frames each way, drops by cause, interrupts; see `switch::PortCounters`) and whether a
//! frontend is connected. For the uplink (label `interface`): its counters
//! (`switch::UplinkCounters`). For each IOCore (label `iocore`): busy and idle seconds, and the
//! CPU time it used.

use iocore::IoCore;
use metrics::exposition::{family, per_iocore_seconds, sample};
use switch::{PortCounters, Switch};

use crate::nics::{Nic, Nics};

pub use metrics::exposition::CONTENT_TYPE;

/// Every metric of every NIC, the uplink and the IOCores.
pub fn render(nics: &Nics, iocores: &[IoCore<Switch>]) -> String {
    let mut out = String::with_capacity(8 << 10);
    // Each NIC's counters in the order `named` gives them, the same for every NIC.
    let all: Vec<(&Nic, Vec<u64>)> =
        nics.iter().map(|nic| (nic, nic.counters().named().map(|(_, n)| n).collect())).collect();
    for (index, (counter, _)) in PortCounters::default().named().enumerate() {
        let name = format!("exitless_nic_{counter}_total");
        family(
            &mut out,
            &name,
            "counter",
            &format!("The switch's {counter} count for the NIC (see switch::PortCounters)."),
        );
        for (nic, values) in &all {
            sample(&mut out, &name, &[("nic", &nic.name)], values[index]);
        }
    }
    family(
        &mut out,
        "exitless_nic_frontend_connected",
        "gauge",
        "1 while a vhost-user frontend is connected to the NIC.",
    );
    for (nic, _) in &all {
        sample(
            &mut out,
            "exitless_nic_frontend_connected",
            &[("nic", &nic.name)],
            u64::from(nic.frontend_connected()),
        );
    }
    if let Some((interface, shared)) = &nics.uplink {
        for (counter, value) in shared.read().named() {
            let name = format!("exitless_uplink_{counter}_total");
            family(
                &mut out,
                &name,
                "counter",
                &format!("The switch's {counter} count for the uplink (see switch::UplinkCounters)."),
            );
            sample(&mut out, &name, &[("interface", interface)], value);
        }
    }
    let times: Vec<_> = iocores.iter().map(IoCore::times).collect();
    per_iocore_seconds(
        &mut out,
        "exitless_iocore_busy_seconds_total",
        "IOCore time in passes that switched frames.",
        times.iter().map(|t| t.busy),
    );
    per_iocore_seconds(
        &mut out,
        "exitless_iocore_idle_seconds_total",
        "IOCore time in passes that found nothing to do.",
        times.iter().map(|t| t.idle),
    );
    per_iocore_seconds(
        &mut out,
        "exitless_iocore_cpu_seconds_total",
        "CPU time the IOCore used: all of its time when it polls, little when it sleeps.",
        iocores.iter().map(|io| io.cpu_time().unwrap_or_default()),
    );
    out
}
