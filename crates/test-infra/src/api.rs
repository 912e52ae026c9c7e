//! A client for the control APIs (`--api-socket`): HTTP/1.1 on a Unix socket.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

/// One HTTP request on its own connection: the status and the body.
pub fn http(api: &Path, method: &str, path: &str, body: Option<&str>) -> (u16, String) {
    http_within(Duration::from_secs(30), api, method, path, body)
}

/// As `http`, waiting up to `limit` for the answer.
pub fn http_within(
    limit: Duration,
    api: &Path,
    method: &str,
    path: &str,
    body: Option<&str>,
) -> (u16, String) {
    let mut stream = UnixStream::connect(api).unwrap();
    stream.set_read_timeout(Some(limit)).unwrap();
    let body = body.unwrap_or("");
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    let (head, body) = answer.split_once("\r\n\r\n").unwrap_or_else(|| panic!("no head: {answer:?}"));
    let status = head.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or_else(|| panic!("{head}"));
    (status, body.to_owned())
}
