//! The control API's routes, answered by the control thread, which owns the NICs:
//!
//! - `GET /nics`, `GET /nics/{name}`: each NIC's spec, state and counters.
//! - `PUT /nics/{name}`: add a NIC; the body holds `--nic`'s keys as JSON.
//! - `DELETE /nics/{name}`: remove a NIC no frontend is connected to (409 while one is).
//! - `GET /metrics`: the Prometheus text exposition.

use api_http::server::error;
use api_http::{Method, Request, Response};
use iocore::IoCore;
use serde_json::Value;
use switch::Switch;

use crate::args::nic_from_json;
use crate::metrics;
use crate::nics::Nics;

/// The answer to `request`.
pub fn handle(nics: &mut Nics, iocores: &[IoCore<Switch>], request: &Request) -> Response {
    let path = request.path.trim_end_matches('/');
    match (request.method, path) {
        (Method::Get, "/metrics") => Response {
            status: 200,
            content_type: metrics::CONTENT_TYPE,
            body: metrics::render(nics, iocores).into_bytes(),
        },
        (_, "/metrics") => error(405, "/metrics takes GET"),
        (Method::Get, "/nics") => {
            Response::json(200, Value::Array(nics.iter().map(|nic| nic.describe()).collect()).to_string())
        }
        (_, "/nics") => error(405, "/nics takes GET; add a NIC with PUT /nics/{name}"),
        (method, path) => match path.strip_prefix("/nics/") {
            Some(name) if !name.contains('/') => nic(nics, method, name, &request.body),
            _ => error(404, format!("no such resource {path}: see /nics and /metrics")),
        },
    }
}

fn nic(nics: &mut Nics, method: Method, name: &str, body: &[u8]) -> Response {
    if !api_http::server::is_resource_name(name) {
        return error(
            400,
            format!("NIC name {name:?}: use letters, digits, '.', '_' or '-', not starting with '.'"),
        );
    }
    match method {
        Method::Get => match nics.get(name) {
            Some(nic) => Response::json(200, nic.describe().to_string()),
            None => error(404, format!("no NIC is named {name}")),
        },
        Method::Put => {
            let body = match serde_json::from_slice::<Value>(body) {
                Ok(body) => body,
                Err(e) if body.is_empty() => {
                    return error(400, format!("the request needs a JSON body: {e}"))
                }
                Err(e) => return error(400, format!("malformed JSON: {e}")),
            };
            match nic_from_json(name, &body) {
                Err(message) => error(400, message),
                Ok(spec) => match nics.add(spec) {
                    Ok(nic) => Response::json(201, nic.describe().to_string()),
                    Err(e) => error(e.status(), e),
                },
            }
        }
        Method::Delete => match nics.remove(name) {
            Ok(()) => Response::empty(204),
            Err(e) => error(e.status(), e),
        },
        Method::Patch => error(405, "a NIC takes GET, PUT and DELETE"),
    }
}
