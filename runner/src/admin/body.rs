//! Request bodies: content-type checks and size-limited reads.
//!
//! Invariants: no body is buffered past its limit (a declared `Content-Length` over the limit
//! is refused before reading; a chunked body is cut off as soon as it passes the limit), and
//! JSON that does not parse is a 400 that says where.

use std::pin::pin;

use bytes::{Buf, Bytes, BytesMut};
use futures::{Stream, StreamExt};
use serde::de::DeserializeOwned;
use warp::{Filter, Rejection};

use super::error::ApiError;

pub const JSON: &str = "application/json";
pub const WASM: &str = "application/wasm";
/// What generated clients send a file as; module uploads take it too.
pub const OCTET_STREAM: &str = "application/octet-stream";

/// Refuses a request whose `Content-Type` is not `expected` (parameters such as `charset`
/// are ignored).
pub fn check_content_type(content_type: Option<&str>, expected: &str) -> Result<(), ApiError> {
    let essence = content_type.and_then(|ct| ct.split(';').next()).map(str::trim);
    match essence {
        Some(e) if e.eq_ignore_ascii_case(expected) => Ok(()),
        Some(e) => Err(ApiError::unsupported_media_type(format!(
            "expected Content-Type: {expected}, got {e:?}"
        ))),
        None => Err(ApiError::unsupported_media_type(format!("expected Content-Type: {expected}"))),
    }
}

/// Reads a body of at most `limit` bytes.
pub async fn read_limited<S, B>(
    content_length: Option<u64>,
    body: S,
    limit: usize,
) -> Result<Bytes, ApiError>
where
    S: Stream<Item = Result<B, warp::Error>>,
    B: Buf,
{
    let too_large = || ApiError::too_large(format!("request body is larger than {limit} bytes"));
    let declared = content_length.map(|n| usize::try_from(n).unwrap_or(usize::MAX));
    if declared.is_some_and(|n| n > limit) {
        return Err(too_large());
    }
    let mut out = BytesMut::with_capacity(declared.unwrap_or(0).min(limit));
    let mut body = pin!(body);
    while let Some(chunk) = body.next().await {
        let mut chunk = chunk.map_err(|e| {
            ApiError::bad_request("invalid_body", format!("could not read the request body: {e}"))
        })?;
        if out.len().saturating_add(chunk.remaining()) > limit {
            return Err(too_large());
        }
        while chunk.has_remaining() {
            let part = chunk.chunk();
            let n = part.len();
            out.extend_from_slice(part);
            chunk.advance(n);
        }
    }
    Ok(out.freeze())
}

/// Parses `bytes` as `T` (its structs from JSON objects only, see `json_input`); a syntax or
/// shape error is a 400 naming line and column.
pub fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    super::json_input::from_slice(bytes)
        .map_err(|e| ApiError::bad_request("invalid_json", format!("invalid JSON body: {e}")))
}

/// A JSON body of at most `limit` bytes, parsed as `T`.
pub fn json<T>(limit: usize) -> impl Filter<Extract = (T,), Error = Rejection> + Clone
where
    T: DeserializeOwned + Send + 'static,
{
    warp::header::optional::<String>("content-type")
        .and(warp::header::optional::<u64>("content-length"))
        .and(warp::body::stream())
        .and_then(move |content_type: Option<String>, length: Option<u64>, body| async move {
            let parsed = async {
                check_content_type(content_type.as_deref(), JSON)?;
                let bytes = read_limited(length, body, limit).await?;
                parse_json::<T>(&bytes)
            };
            parsed.await.map_err(ApiError::reject)
        })
}

/// A JSON body of at most `limit` bytes, parsed by `parse` (which says how its errors read).
pub fn json_with<T, F>(
    limit: usize,
    parse: F,
) -> impl Filter<Extract = (T,), Error = Rejection> + Clone
where
    T: Send + 'static,
    F: Fn(&[u8]) -> Result<T, ApiError> + Clone + Send + Sync + 'static,
{
    warp::header::optional::<String>("content-type")
        .and(warp::header::optional::<u64>("content-length"))
        .and(warp::body::stream())
        .and_then(move |content_type: Option<String>, length: Option<u64>, body| {
            let parse = parse.clone();
            async move {
                let parsed = async {
                    check_content_type(content_type.as_deref(), JSON)?;
                    let bytes = read_limited(length, body, limit).await?;
                    parse(&bytes)
                };
                parsed.await.map_err(ApiError::reject)
            }
        })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn chunks(parts: &[&'static [u8]]) -> impl Stream<Item = Result<Bytes, warp::Error>> {
        futures::stream::iter(parts.iter().map(|p| Ok(Bytes::from_static(p))).collect::<Vec<_>>())
    }

    #[tokio::test]
    async fn bodies_are_cut_off_at_the_limit() {
        let got = read_limited(None, chunks(&[b"ab", b"cd"]), 4).await.unwrap();
        assert_eq!(&got[..], b"abcd");
        let e = read_limited(None, chunks(&[b"ab", b"cde"]), 4).await.unwrap_err();
        assert_eq!(e.status.as_u16(), 413);
        let e = read_limited(Some(5), chunks(&[]), 4).await.unwrap_err();
        assert_eq!(e.status.as_u16(), 413, "declared length is checked before reading");
    }

    #[test]
    fn content_types_compare_by_essence() {
        assert!(check_content_type(Some("application/json; charset=utf-8"), JSON).is_ok());
        assert!(check_content_type(Some("Application/Wasm"), WASM).is_ok());
        assert_eq!(check_content_type(Some("text/plain"), WASM).unwrap_err().status.as_u16(), 415);
        assert_eq!(check_content_type(None, JSON).unwrap_err().status.as_u16(), 415);
    }
}
