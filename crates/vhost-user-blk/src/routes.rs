//! The control API's routes, answered by the control thread, which owns the disks:
//!
//! - `GET /disks`, `GET /disks/{name}`: each disk's spec, state and counts.
//! - `PUT /disks/{name}`: add a disk; the body holds `--disk`'s keys as JSON.
//! - `PATCH /disks/{name}`: change its `iops` / `bw` limits (`null` removes one).
//! - `DELETE /disks/{name}`: remove a disk no frontend is connected to (409 while one is).
//! - `GET /metrics`: the Prometheus text exposition.

use api_http::{Method, Request, Response};
use serde_json::Value;

use crate::disks::Disks;
use crate::{prometheus, spec};
use api_http::server::error;

/// The answer to `request`.
pub fn handle(disks: &mut Disks, request: &Request) -> Response {
    let path = request.path.trim_end_matches('/');
    match (request.method, path) {
        (Method::Get, "/metrics") => Response {
            status: 200,
            content_type: prometheus::CONTENT_TYPE,
            body: prometheus::render(disks).into_bytes(),
        },
        (_, "/metrics") => error(405, "/metrics takes GET"),
        (Method::Get, "/disks") => {
            Response::json(200, Value::Array(disks.iter().map(|d| d.describe()).collect()).to_string())
        }
        (_, "/disks") => error(405, "/disks takes GET; add a disk with PUT /disks/{name}"),
        (method, path) => match path.strip_prefix("/disks/") {
            Some(name) if !name.contains('/') => disk(disks, method, name, &request.body),
            _ => error(404, format!("no such resource {path}: see /disks and /metrics")),
        },
    }
}

fn disk(disks: &mut Disks, method: Method, name: &str, body: &[u8]) -> Response {
    if let Err(message) = spec::check_name(name) {
        return error(400, message);
    }
    let answer = match method {
        Method::Get => disks
            .get(name)
            .map(|d| (200, d.describe()))
            .ok_or_else(|| error(404, format!("no disk is named {name}"))),
        Method::Put => json(body).and_then(|body| {
            let spec = spec::from_json(name, &body).map_err(|message| error(400, message))?;
            let socket = spec.socket.clone().unwrap_or_default();
            disks.add_from_api(spec, socket).map(|d| (201, d.describe())).map_err(|e| error(e.status(), e))
        }),
        Method::Patch => json(body).and_then(|body| {
            let current = disks.get(name).ok_or_else(|| error(404, format!("no disk is named {name}")))?;
            let limits = spec::patch_limits(current.figures.limits(), &body).map_err(|m| error(400, m))?;
            disks.set_limits(name, limits).map(|d| (200, d.describe())).map_err(|e| error(e.status(), e))
        }),
        Method::Delete => disks.remove(name).map(|()| (204, Value::Null)).map_err(|e| error(e.status(), e)),
    };
    match answer {
        Ok((204, _)) => Response::empty(204),
        Ok((status, value)) => Response::json(status, value.to_string()),
        Err(response) => response,
    }
}

fn json(body: &[u8]) -> Result<Value, Response> {
    if body.is_empty() {
        return Err(error(400, "the request needs a JSON body"));
    }
    serde_json::from_slice(body).map_err(|e| error(400, format!("malformed JSON: {e}")))
}
