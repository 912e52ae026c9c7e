//! The HTTP/1.1 a control API on a Unix socket needs, as Firecracker's and Cloud Hypervisor's
//! APIs speak it: one request per connection, a body only with `Content-Length` (no chunked
//! transfer), a response that closes the connection. The bytes come from any local client, so
//! the parser bounds everything it keeps ([`MAX_HEAD`], [`MAX_BODY`]), and every malformed
//! request is an [`HttpError`] with the status to answer, never a panic. [`server`] is the
//! thread that serves such an API: bounded clients, each checked before a byte is read.

#![deny(missing_docs)]

pub mod server;

use thiserror::Error;

/// The most bytes the request line and headers may take.
pub const MAX_HEAD: usize = 8 << 10;
/// The most bytes a body may take.
pub const MAX_BODY: usize = 64 << 10;
/// The most headers a request may have.
const MAX_HEADERS: usize = 64;

/// A request's method.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    /// `GET`
    Get,
    /// `PUT`
    Put,
    /// `PATCH`
    Patch,
    /// `DELETE`
    Delete,
}

/// A whole request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// Its method.
    pub method: Method,
    /// Its path, without the query (which the API has no use for), percent-decoded.
    pub path: String,
    /// Its body (empty when it had none).
    pub body: Vec<u8>,
}

/// Why a request cannot be served; [`HttpError::status`] is the answer's status code.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum HttpError {
    /// The request line is not `METHOD TARGET HTTP/1.x`.
    #[error("the request line is not `METHOD /path HTTP/1.1`")]
    BadRequestLine,
    /// A method the API does not have.
    #[error("method {0} is not one of GET, PUT, PATCH, DELETE")]
    UnknownMethod(String),
    /// Not HTTP/1.0 or 1.1.
    #[error("HTTP version {0} is not supported: use HTTP/1.1")]
    Version(String),
    /// The target is not an absolute path, or has a bad percent escape.
    #[error("the request target must be a path starting with / (percent escapes valid, UTF-8)")]
    BadTarget,
    /// A header line without a colon, or with bytes a header may not hold.
    #[error("a malformed header line")]
    BadHeader,
    /// More than the parser keeps.
    #[error("the request line and headers take more than {MAX_HEAD} bytes or {MAX_HEADERS} headers")]
    HeadTooLarge,
    /// `Content-Length` not a number, or given twice with different values.
    #[error("Content-Length is not one decimal number")]
    BadLength,
    /// A body over [`MAX_BODY`].
    #[error("the body is over {MAX_BODY} bytes")]
    BodyTooLarge,
    /// `Transfer-Encoding` (chunked bodies): not supported.
    #[error("Transfer-Encoding is not supported: send the body with Content-Length")]
    TransferEncoding,
}

impl HttpError {
    /// The status code that answers it.
    pub fn status(&self) -> u16 {
        match self {
            HttpError::UnknownMethod(_) => 405,
            HttpError::Version(_) => 505,
            HttpError::HeadTooLarge => 431,
            HttpError::BodyTooLarge => 413,
            HttpError::TransferEncoding => 501,
            _ => 400,
        }
    }
}

/// Parse a request from the bytes read so far: `Ok(None)` while it is incomplete.
pub fn parse(bytes: &[u8]) -> Result<Option<Request>, HttpError> {
    let Some(head_len) = find(bytes, b"\r\n\r\n") else {
        return if bytes.len() > MAX_HEAD { Err(HttpError::HeadTooLarge) } else { Ok(None) };
    };
    if head_len > MAX_HEAD {
        return Err(HttpError::HeadTooLarge);
    }
    let head = std::str::from_utf8(&bytes[..head_len]).map_err(|_| HttpError::BadHeader)?;
    let mut lines = head.split("\r\n");
    let (method, path) = request_line(lines.next().unwrap_or(""))?;
    let mut length: Option<usize> = None;
    for (count, line) in lines.enumerate() {
        if count >= MAX_HEADERS {
            return Err(HttpError::HeadTooLarge);
        }
        let (name, value) = line.split_once(':').ok_or(HttpError::BadHeader)?;
        if name.is_empty()
            || !name.bytes().all(is_token)
            || value.bytes().any(|b| b.is_ascii_control() && b != b'\t')
        {
            return Err(HttpError::BadHeader);
        }
        let value = value.trim_matches([' ', '\t']);
        if name.eq_ignore_ascii_case("transfer-encoding") {
            return Err(HttpError::TransferEncoding);
        }
        if name.eq_ignore_ascii_case("content-length") {
            if value.is_empty() || !value.bytes().all(|b| b.is_ascii_digit()) {
                return Err(HttpError::BadLength);
            }
            let n: usize = value.parse().map_err(|_| HttpError::BodyTooLarge)?;
            if length.is_some_and(|l| l != n) {
                return Err(HttpError::BadLength);
            }
            length = Some(n);
        }
    }
    let length = length.unwrap_or(0);
    if length > MAX_BODY {
        return Err(HttpError::BodyTooLarge);
    }
    let body_start = head_len + 4;
    let Some(body) = bytes.get(body_start..body_start + length) else { return Ok(None) };
    Ok(Some(Request { method, path, body: body.to_vec() }))
}

fn request_line(line: &str) -> Result<(Method, String), HttpError> {
    let mut parts = line.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(HttpError::BadRequestLine);
    };
    let method = match method {
        "GET" => Method::Get,
        "PUT" => Method::Put,
        "PATCH" => Method::Patch,
        "DELETE" => Method::Delete,
        "" => return Err(HttpError::BadRequestLine),
        other => return Err(HttpError::UnknownMethod(other.chars().take(16).collect())),
    };
    if version != "HTTP/1.1" && version != "HTTP/1.0" {
        return Err(HttpError::Version(version.chars().take(16).collect()));
    }
    let path = target.split_once('?').map_or(target, |(path, _)| path);
    if !path.starts_with('/') {
        return Err(HttpError::BadTarget);
    }
    Ok((method, percent_decode(path)?))
}

fn percent_decode(path: &str) -> Result<String, HttpError> {
    let bytes = path.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = bytes.get(i + 1..i + 3).ok_or(HttpError::BadTarget)?;
            let hex = std::str::from_utf8(hex).map_err(|_| HttpError::BadTarget)?;
            out.push(u8::from_str_radix(hex, 16).map_err(|_| HttpError::BadTarget)?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| HttpError::BadTarget)
}

/// A header name's characters (RFC 9110's `tchar`).
fn is_token(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// A response: a status, a content type and a body; the connection closes after it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    /// The status code.
    pub status: u16,
    /// Its `Content-Type`.
    pub content_type: &'static str,
    /// Its body.
    pub body: Vec<u8>,
}

impl Response {
    /// A JSON body (already serialized).
    pub fn json(status: u16, body: String) -> Response {
        Response { status, content_type: "application/json", body: body.into_bytes() }
    }

    /// No body.
    pub fn empty(status: u16) -> Response {
        Response { status, content_type: "application/json", body: Vec::new() }
    }

    /// The bytes on the wire.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = format!(
            "HTTP/1.1 {} {}\r\nContent-Type: {}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            self.status,
            reason(self.status),
            self.content_type,
            self.body.len()
        )
        .into_bytes();
        out.extend_from_slice(&self.body);
        out
    }
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        201 => "Created",
        204 => "No Content",
        400 => "Bad Request",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        409 => "Conflict",
        413 => "Content Too Large",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        501 => "Not Implemented",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        505 => "HTTP Version Not Supported",
        _ => "Unknown",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_request_once_it_is_whole() {
        let text = b"PUT /disks/a%20b?x=1 HTTP/1.1\r\nHost: localhost\r\nContent-Length: 7\r\n\r\n{\"a\":1}";
        for cut in 0..text.len() {
            assert_eq!(parse(&text[..cut]), Ok(None), "incomplete at {cut}");
        }
        let request = parse(text).unwrap().unwrap();
        assert_eq!(request.method, Method::Put);
        assert_eq!(request.path, "/disks/a b");
        assert_eq!(request.body, b"{\"a\":1}");
        let get = parse(b"GET /metrics HTTP/1.0\r\n\r\n").unwrap().unwrap();
        assert_eq!((get.method, get.path.as_str(), get.body.len()), (Method::Get, "/metrics", 0));
    }

    #[test]
    fn refuses_malformed_requests_with_their_status() {
        let cases: &[(&[u8], u16)] = &[
            (b"GET /x\r\n\r\n", 400),
            (b"GET  /x HTTP/1.1\r\n\r\n", 400),
            (b"POST /x HTTP/1.1\r\n\r\n", 405),
            (b"GET /x HTTP/2\r\n\r\n", 505),
            (b"GET x HTTP/1.1\r\n\r\n", 400),
            (b"GET /%zz HTTP/1.1\r\n\r\n", 400),
            (b"GET /%ff HTTP/1.1\r\n\r\n", 400),
            (b"GET / HTTP/1.1\r\nNoColon\r\n\r\n", 400),
            (b"GET / HTTP/1.1\r\nBad Name: x\r\n\r\n", 400),
            (b"PUT / HTTP/1.1\r\nContent-Length: -1\r\n\r\n", 400),
            (b"PUT / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n", 400),
            (b"PUT / HTTP/1.1\r\nContent-Length: 99999999999999999999999\r\n\r\n", 413),
            (b"PUT / HTTP/1.1\r\nContent-Length: 65537\r\n\r\n", 413),
            (b"PUT / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n", 501),
            (b"GET / HTTP/1.1\r\nX: \xff\r\n\r\n", 400),
        ];
        for (text, status) in cases {
            let error = parse(text).expect_err(&String::from_utf8_lossy(text));
            assert_eq!(error.status(), *status, "{}: {error}", String::from_utf8_lossy(text));
        }
        assert_eq!(parse(&vec![b'a'; MAX_HEAD + 1]), Err(HttpError::HeadTooLarge));
        let many = format!("GET / HTTP/1.1\r\n{}\r\n", "A: b\r\n".repeat(MAX_HEADERS + 1));
        assert_eq!(parse(many.as_bytes()), Err(HttpError::HeadTooLarge));
    }

    #[test]
    fn a_response_says_its_length_and_closes() {
        let bytes = Response::json(409, "{\"error\":\"x\"}".into()).to_bytes();
        let text = String::from_utf8(bytes).unwrap();
        assert!(text.starts_with("HTTP/1.1 409 Conflict\r\n"), "{text}");
        assert!(text.contains("Content-Length: 13\r\n") && text.contains("Connection: close\r\n"));
        assert!(text.ends_with("\r\n\r\n{\"error\":\"x\"}"));
    }
}
