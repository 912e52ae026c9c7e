//! `exitless run --api-socket`: Cloud Hypervisor's verbs for a running VM, over the same
//! bounded HTTP thread the vhost-user daemon's API uses ([`api_http::server`]):
//! `PUT /api/v1/vm.pause`, `PUT /api/v1/vm.resume` and `PUT /api/v1/vm.snapshot` with
//! `{"destination_url": "file:///DIR"}` (of a paused VM), and `PUT /api/v1/vm.send-migration`
//! with `{"destination_url": "unix:/PATH"}`, `"tcp:IP:PORT"` (mutual TLS) or
//! `"tcp+plain:IP:PORT"` (a live migration, see `vmm::migration`). The VMM's main thread answers them
//! on its control tick; the data plane never waits for either thread.

use std::fs::File;
use std::io::Write;
use std::path::Path;
use std::sync::mpsc::{self, Receiver};

use api_http::server::{error, eventfd_pair, ApiServer, Call};
use api_http::{Method, Request, Response};
use sandbox::{Filter, SeccompMode, ThreadKind};
use vmm::{ControlError, VmControl};

/// The API's thread, and how to stop it once the VM has ended.
pub struct VmApi {
    api: ApiServer,
    stop: File,
}

/// Listen on `path`; the returned hook (for `Vm::with_control`) answers what arrives.
pub fn start(path: &Path, seccomp: SeccompMode) -> Result<(VmApi, impl FnMut(&VmControl) + Send), String> {
    let eventfd_error = |e: std::io::Error| format!("--api-socket: cannot make an eventfd: {e}");
    let (stop_writer, stop) = eventfd_pair().map_err(eventfd_error)?;
    // The main thread looks for requests on every control tick; the wake-up is not needed.
    let (wake, _) = eventfd_pair().map_err(eventfd_error)?;
    let (sender, calls) = mpsc::sync_channel(16);
    let filter = Filter::new(ThreadKind::VmmApi, seccomp).map_err(|e| e.to_string())?;
    let api = ApiServer::start(path, stop.into(), move || filter.install(), sender, wake)
        .map_err(|e| format!("--api-socket: {e}"))?;
    log::info!("control API on {}", path.display());
    Ok((VmApi { api, stop: stop_writer }, move |vm: &VmControl| answer_all(&calls, vm)))
}

impl VmApi {
    /// Stop the API's thread (the VM has ended) and wait for it.
    pub fn stop(mut self) {
        let _ = self.stop.write_all(&1u64.to_ne_bytes());
        self.api.join();
    }
}

fn answer_all(calls: &Receiver<Call>, vm: &VmControl) {
    while let Ok(Call { request, reply }) = calls.try_recv() {
        let _ = reply.send(route(&request, vm));
    }
}

fn route(request: &Request, vm: &VmControl) -> Response {
    let verb = match request.path.as_str() {
        "/api/v1/vm.pause" => "pause",
        "/api/v1/vm.resume" => "resume",
        "/api/v1/vm.snapshot" => "snapshot",
        "/api/v1/vm.send-migration" => "send-migration",
        other => {
            return error(
                404,
                format!("no such endpoint: {other} (vm.pause, vm.resume, vm.snapshot, vm.send-migration)"),
            )
        }
    };
    if request.method != Method::Put {
        return error(405, format!("/api/v1/vm.{verb} takes PUT"));
    }
    let outcome = match verb {
        "pause" => vm.pause().map(|took| log::info!("paused in {:.3} ms", took.as_secs_f64() * 1e3)),
        "resume" => vm.resume().map(|took| log::info!("resumed in {:.3} ms", took.as_secs_f64() * 1e3)),
        "send-migration" => {
            let url = match migration_destination(&request.body) {
                Ok(url) => url,
                Err(message) => return error(400, message),
            };
            return match vm.send_migration(&url) {
                Ok(report) => {
                    log::info!(
                        "migrated to {url} in {:.3} ms, downtime {:.3} ms, {} pre-copy rounds",
                        report.total_ms,
                        report.downtime_ms,
                        report.rounds
                    );
                    Response::json(200, serde_json::to_string(&report).unwrap_or_default())
                }
                Err(e) => {
                    log::error!("migration to {url} failed; the VM runs on here: {e}");
                    error(500, e)
                }
            };
        }
        _ => {
            let dir = match destination(&request.body) {
                Ok(dir) => dir,
                Err(message) => return error(400, message),
            };
            vm.snapshot(&dir).map(|(bytes, took)| {
                log::info!(
                    "snapshot written to {}: {bytes} bytes in {:.3} ms",
                    dir.display(),
                    took.as_secs_f64() * 1e3
                )
            })
        }
    };
    match outcome {
        Ok(()) => Response::empty(204),
        Err(e @ (ControlError::AlreadyPaused | ControlError::NotPaused)) => error(409, e),
        Err(e) => error(500, e),
    }
}

/// The URL of a vm.send-migration body, `{"destination_url": "unix:/PATH"}` (or `tcp:IP:PORT`,
/// `tcp+plain:IP:PORT`).
fn migration_destination(body: &[u8]) -> Result<String, String> {
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Body {
        destination_url: String,
    }
    let body: Body = serde_json::from_slice(body)
        .map_err(|e| format!("the body is not {{\"destination_url\": \"unix:/PATH\"}}: {e}"))?;
    vmm::migration::MigrationUrl::parse(&body.destination_url).map_err(|e| e.to_string())?;
    Ok(body.destination_url)
}

/// The directory of a vm.snapshot body, `{"destination_url": "file:///DIR"}`.
fn destination(body: &[u8]) -> Result<std::path::PathBuf, String> {
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Body {
        destination_url: String,
    }
    let body: Body = serde_json::from_slice(body)
        .map_err(|e| format!("the body is not {{\"destination_url\": \"file:///DIR\"}}: {e}"))?;
    vmm::snapshot::dir_from_url(&body.destination_url).map_err(|e| e.to_string())
}
