//! The daemon's control API reads requests from any local client: whatever the bytes, in
//! whatever pieces they arrive, the parser answers with a request, "not yet", or an error with
//! a 4xx/5xx status, and a request it returns stays within its bounds.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // The first byte splits the input in two reads, as a socket may deliver it.
    let Some((&split, bytes)) = data.split_first() else { return };
    let cut = usize::from(split).min(bytes.len());
    let first = api_http::parse(&bytes[..cut]);
    match api_http::parse(bytes) {
        Ok(Some(request)) => {
            assert!(request.body.len() <= api_http::MAX_BODY);
            assert!(request.path.starts_with('/'));
            // A prefix of a whole request is incomplete or the same request, never an error.
            assert!(matches!(first, Ok(None) | Ok(Some(_))), "{first:?}");
        }
        Ok(None) => assert!(bytes.len() <= api_http::MAX_HEAD + 4 + api_http::MAX_BODY),
        Err(error) => assert!((400..600).contains(&error.status())),
    }
});
