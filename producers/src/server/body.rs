//! Request bodies: at most the proxy's limit, undoing their `Content-Encoding`.

use axum::body::Bytes;
use axum::http::{header, HeaderMap};
use forgelog_dialects::dialect::{DialectError, ErrorKind};

pub(super) fn too_large(limit: usize) -> DialectError {
    DialectError::new(
        ErrorKind::TooLarge,
        format!("request body over {limit} bytes"),
    )
}

/// The request body, read up to `limit` bytes and decoded ([`decode_body`]).
pub(super) async fn read_body(
    headers: &HeaderMap,
    body: axum::body::Body,
    limit: usize,
) -> Result<Bytes, DialectError> {
    let body = axum::body::to_bytes(body, limit)
        .await
        .map_err(|_| too_large(limit))?;
    if !headers.contains_key(header::CONTENT_ENCODING) {
        return Ok(body);
    }
    // Decompressing megabytes is CPU work: not on the async workers.
    let headers = headers.clone();
    tokio::task::spawn_blocking(move || decode_body(&headers, body, limit))
        .await
        .unwrap_or_else(|e| Err(DialectError::invalid(format!("decoding the body: {e}"))))
}

/// The request body as sent, undoing its `Content-Encoding` (Codex compresses
/// large Responses bodies with zstd; gzip and deflate too), at most `limit`
/// bytes decoded. The decoded body is what is recorded.
pub fn decode_body(headers: &HeaderMap, body: Bytes, limit: usize) -> Result<Bytes, DialectError> {
    use std::io::Read;
    let encoding = headers
        .get(header::CONTENT_ENCODING)
        .and_then(|v| v.to_str().ok())
        .map(|v| v.trim().to_ascii_lowercase());
    let reader: Box<dyn Read + '_> = match encoding.as_deref() {
        None | Some("" | "identity") => return Ok(body),
        Some("zstd") => Box::new(
            zstd::stream::read::Decoder::new(&body[..])
                .map_err(|e| DialectError::invalid(format!("zstd body: {e}")))?,
        ),
        Some("gzip" | "x-gzip") => Box::new(flate2::read::GzDecoder::new(&body[..])),
        Some("deflate") => Box::new(flate2::read::ZlibDecoder::new(&body[..])),
        Some(other) => {
            return Err(DialectError::invalid(format!(
                "Content-Encoding '{other}' is not supported (zstd, gzip, deflate)"
            )))
        }
    };
    let mut out = Vec::new();
    reader
        .take(limit as u64 + 1)
        .read_to_end(&mut out)
        .map_err(|e| DialectError::invalid(format!("compressed body does not decode: {e}")))?;
    if out.len() > limit {
        return Err(too_large(limit));
    }
    Ok(Bytes::from(out))
}
