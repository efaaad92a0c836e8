//! `GET /v1/actors/{type}/{id}/files[/{path}]`: an actor's files and
//! artifacts (PRODUCT.md §5), read from what is committed, whether the
//! actor is awake or not: never a wake-up.
//!
//! Paths are checked on the raw URL before decoding, so a slash, a dot or a
//! backslash hidden as `%2F`, `%2e` or `%5C` is refused like the plain one:
//! `400 invalid_path`.

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;

use super::extract::{ActorPath, Page};
use super::{ApiError, AppState, Query};
use crate::ids::{ActorKey, MAX_FILE_PATH, validate_file_path};
use crate::storage::schema::{FileBody, FileRecord};

fn invalid_path(why: impl Into<String>) -> ApiError {
    ApiError::bad_request("invalid_path", why)
}

/// The file path of a `…/files/{path}` URL, from its raw (still
/// percent-encoded) form.
fn file_path(uri: &Uri) -> Result<String, ApiError> {
    // /v1/actors/{type}/{id}/files/{path…}: type and id are single raw
    // segments (an encoded `/` stays encoded there).
    let raw = uri
        .path()
        .splitn(7, '/')
        .nth(6)
        .ok_or_else(|| invalid_path("no file path"))?;
    let lower = raw.to_ascii_lowercase();
    for hidden in ["%2f", "%5c", "%2e", "%00"] {
        if lower.contains(hidden) {
            return Err(invalid_path(format!(
                "`{hidden}` may not appear in a file path (write `/` and `.` plainly)"
            )));
        }
    }
    let decoded = percent_decode(raw)
        .ok_or_else(|| invalid_path("the path is not valid percent-encoded UTF-8"))?;
    validate_file_path(&decoded)?;
    Ok(decoded)
}

fn percent_decode(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = std::str::from_utf8(b.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// Where an actor's artifacts are: all a client token's `files` scope
/// opens.
const ARTIFACTS: &str = "outputs/";

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ListParams {
    #[serde(default)]
    prefix: String,
    #[serde(default)]
    after: Option<String>,
    #[serde(default)]
    limit: Option<usize>,
}

/// `GET …/files?prefix=&after=&limit=`.
pub(super) async fn list(
    State(s): State<AppState>,
    ActorPath(key): ActorPath,
    Query(mut q): Query<ListParams>,
    grant: Option<axum::Extension<crate::tokens::Grant>>,
) -> Result<Response, ApiError> {
    // A prefix is any string, as in the guest's `files.list` (one ending
    // in `.` or `..` is as good as any): it is not a path, and was refused
    // like one.
    if q.prefix.len() > MAX_FILE_PATH {
        return Err(ApiError::bad_request(
            "invalid_path",
            format!("a prefix is at most {MAX_FILE_PATH} bytes, like the paths it matches"),
        ));
    }
    let limit = Page::FILES.size(q.limit)?;
    // A client token sees the artifacts only (its scope, tokens.rs).
    let mut hidden = false;
    if grant.is_some() && !q.prefix.starts_with(ARTIFACTS) {
        if ARTIFACTS.starts_with(q.prefix.as_str()) {
            q.prefix = ARTIFACTS.to_owned();
        } else {
            hidden = true;
        }
    }
    let Some(mut files) = s.node.files(&key, &q.prefix, q.after.as_deref(), limit)? else {
        return Err(ApiError::actor_not_found(&key));
    };
    if hidden {
        files.clear();
    }
    let next_after = (files.len() == limit)
        .then(|| files.last().map(|(p, _)| p.clone()))
        .flatten();
    let files: Vec<serde_json::Value> = files
        .iter()
        .map(|(path, f)| {
            serde_json::json!({
                "path": path,
                "size": f.size,
                "sha256": hex::encode(f.sha256),
                "updated_at_ms": f.updated_at_ms,
            })
        })
        .collect();
    Ok(axum::Json(serde_json::json!({ "files": files, "next_after": next_after })).into_response())
}

/// `GET …/files/{path}`: the bytes, with `ETag`, `Range`, `If-Range`,
/// `If-Match` and `If-None-Match`.
pub(super) async fn download(
    State(s): State<AppState>,
    ActorPath(key): ActorPath,
    uri: Uri,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let path = file_path(&uri)?;
    // A blob may go between the row's read and its open: the file was
    // rewritten and its old blob released (at once past
    // `files.max_released_bytes`). That answered 500 with an error log
    // that read as data loss (a re-probe); the row read again names what
    // the file is now.
    match serve(&s, &key, &path, &headers, false).await? {
        Some(resp) => Ok(resp),
        None => Ok(serve(&s, &key, &path, &headers, true)
            .await?
            .expect("a last try answers")),
    }
}

/// [`download`] from the file's row as committed now; `None` if its blob
/// went meanwhile, unless this is the `last_try`.
async fn serve(
    s: &AppState,
    key: &ActorKey,
    path: &str,
    headers: &HeaderMap,
    last_try: bool,
) -> Result<Option<Response>, ApiError> {
    let file = match s.node.file(key, path)? {
        None => return Err(ApiError::actor_not_found(key)),
        Some(None) => {
            return Err(ApiError::not_found(
                "file_not_found",
                format!("actor {key} has no file `{path}`"),
            ));
        }
        Some(Some(f)) => f,
    };
    let etag = format!("\"{}\"", hex::encode(file.sha256));
    let mut resp = Response::builder()
        .header(header::ETAG, &etag)
        .header(header::ACCEPT_RANGES, "bytes")
        .header(header::CONTENT_TYPE, content_type(path))
        .header(header::CACHE_CONTROL, "no-cache")
        // What an actor wrote is data, never active content of this origin.
        .header("x-content-type-options", "nosniff")
        .header(header::CONTENT_SECURITY_POLICY, "sandbox");
    // A client that names the version it wants gets that one or nothing
    // (RFC 9110 §13.1.1: strong comparison, evaluated first).
    if let Some(wanted) = headers.get(header::IF_MATCH) {
        let matches = wanted
            .to_str()
            .is_ok_and(|v| v.split(',').map(str::trim).any(|t| t == "*" || t == etag));
        if !matches {
            return Err(ApiError::new(
                StatusCode::PRECONDITION_FAILED,
                "precondition_failed",
                format!("`{path}` is now version {etag}, not the one If-Match names"),
            ));
        }
    }
    if headers
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        // Weak comparison (RFC 9110 §13.1.2): `W/"x"` matches `"x"`.
        .is_some_and(|v| {
            v.split(',')
                .map(str::trim)
                .any(|t| t == "*" || t.strip_prefix("W/").unwrap_or(t) == etag)
        })
    {
        return Ok(Some(
            resp.status(StatusCode::NOT_MODIFIED)
                .body(Body::empty())
                .expect("valid response"),
        ));
    }
    let size = file.size;
    // A resumed download names the version it has: a range of another
    // version would stitch two files into one (found by a probe). Only
    // our ETag, compared strongly, keeps the range (RFC 9110 §13.1.5); a
    // date (no Last-Modified is sent) or another tag gets the whole file.
    let range_applies = headers
        .get(header::IF_RANGE)
        .is_none_or(|v| v.to_str().is_ok_and(|t| t.trim() == etag));
    let asked = headers.get(header::RANGE).filter(|_| range_applies);
    let range = match asked.and_then(|v| v.to_str().ok()) {
        None => None,
        Some(r) => match parse_range(r, size) {
            RangeSpec::Whole => None,
            RangeSpec::Part(a, b) => Some((a, b)),
            RangeSpec::Unsatisfiable => {
                let mut refused = ApiError::new(
                    StatusCode::RANGE_NOT_SATISFIABLE,
                    "range_not_satisfiable",
                    format!("`{r}` asks for no byte of `{path}`, which has {size}"),
                )
                .into_response();
                refused.headers_mut().insert(
                    header::CONTENT_RANGE,
                    HeaderValue::from_str(&format!("bytes */{size}")).expect("ASCII"),
                );
                return Ok(Some(refused));
            }
        },
    };
    let Some((body, len)) = read(s, &file, range, last_try).await? else {
        return Ok(None);
    };
    if let Some((a, b)) = range {
        resp = resp
            .status(StatusCode::PARTIAL_CONTENT)
            .header(header::CONTENT_RANGE, format!("bytes {a}-{b}/{size}"));
    }
    // Said up front: a blob that fails mid-way ends the response short of
    // it, which a client can tell from a whole one.
    Ok(Some(
        resp.header(header::CONTENT_LENGTH, len)
            .body(body)
            .expect("valid response"),
    ))
}

/// How much of a blob is read at a time: a download is sent as it is
/// read, not held whole (a file may have 16 MiB, and many downloads run
/// at once).
const CHUNK: u64 = 64 << 10;

/// Blob downloads that may stream at once on a node allowing
/// `max_connections`: each holds a file descriptor besides its
/// connection's, which the connection cap (sized by the open-files limit)
/// does not count. 505 downloads took a node's last descriptors (a probe):
/// accepts failed, turns could not open files. A quarter of the
/// connections, at least 16; past it a download gets 503 and retries.
pub(super) fn streams_for(max_connections: usize) -> usize {
    (max_connections / 4).clamp(16, tokio::sync::Semaphore::MAX_PERMITS)
}

/// The bytes of `file`, or of `range` (inclusive) of it, and how many;
/// `None` if its blob is gone from disk, unless this is the `last_try`.
async fn read(
    s: &AppState,
    file: &FileRecord,
    range: Option<(u64, u64)>,
    last_try: bool,
) -> Result<Option<(Body, u64)>, ApiError> {
    let (start, len) = range.map_or((0, file.size), |(a, b)| (a, b - a + 1));
    match &file.body {
        FileBody::Inline(bytes) => Ok(Some((
            Body::from(bytes[start as usize..(start + len) as usize].to_vec()),
            len,
        ))),
        FileBody::Blob => {
            use tokio::io::{AsyncReadExt as _, AsyncSeekExt as _};
            let Ok(permit) = s.downloads.clone().try_acquire_owned() else {
                return Err(ApiError::overloaded(
                    "the node streams as many downloads as it may at once; retry shortly",
                ));
            };
            let path = s.node.blob_path(&file.sha256);
            let mut f = match tokio::fs::File::open(&path).await {
                Ok(f) => f,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound && !last_try => {
                    return Ok(None);
                }
                Err(e) => return Err(unreadable(&path, e)),
            };
            // A blob of another size was damaged (cut short) on disk.
            let on_disk = f.metadata().await.map_err(|e| unreadable(&path, e))?.len();
            if on_disk != file.size {
                return Err(unreadable(
                    &path,
                    std::io::Error::new(
                        std::io::ErrorKind::InvalidData,
                        format!("{on_disk} bytes on disk, {} committed", file.size),
                    ),
                ));
            }
            f.seek(std::io::SeekFrom::Start(start))
                .await
                .map_err(|e| unreadable(&path, e))?;
            // A whole file is hashed as it goes: one whose bytes are not
            // its SHA-256 (damaged on disk) ends short of its length
            // rather than passing for the file with its ETag (found by a
            // probe).
            use sha2::Digest as _;
            // (A range of every byte, `bytes=0-` of a resumed download, too.)
            let whole = range.is_none_or(|(a, b)| a == 0 && b + 1 == file.size);
            let hasher = whole.then(sha2::Sha256::new);
            let sha256 = file.sha256;
            let chunks =
                futures::stream::unfold((f, len, hasher), move |(mut f, left, mut hasher)| {
                    let path = path.clone();
                    // The permit goes with the stream, and the file with it.
                    let _streaming = &permit;
                    async move {
                        let n = left.min(CHUNK);
                        if n == 0 {
                            return None;
                        }
                        let mut buf = vec![0; n as usize];
                        if let Err(e) = f.read_exact(&mut buf).await {
                            // Logged; the response ends short of its length.
                            log_unreadable(&path, &e);
                            return Some((Err(e), (f, 0, None)));
                        }
                        if let Some(h) = hasher.as_mut() {
                            h.update(&buf);
                        }
                        if left == n
                            && let Some(h) = hasher.take()
                            && h.finalize().as_slice() != sha256
                        {
                            let e = std::io::Error::new(
                                std::io::ErrorKind::InvalidData,
                                "its bytes do not match its SHA-256: damaged on disk",
                            );
                            log_unreadable(&path, &e);
                            return Some((Err(e), (f, 0, None)));
                        }
                        Some((Ok(bytes::Bytes::from(buf)), (f, left - n, hasher)))
                    }
                });
            Ok(Some((Body::from_stream(chunks), len)))
        }
    }
}

/// A committed file's blob cannot be read: logged (the database names a
/// blob the disk does not give) and answered as a server error; a node out
/// of file descriptors or memory is overloaded, not damaged (503).
fn unreadable(path: &std::path::Path, e: std::io::Error) -> ApiError {
    if matches!(e.raw_os_error(), Some(23 | 24 | 12)) {
        tracing::warn!(path = %path.display(), error = %e, "a download cannot open its blob now");
        return ApiError::overloaded("the node cannot open more files now; retry shortly");
    }
    log_unreadable(path, &e);
    ApiError::new(
        StatusCode::INTERNAL_SERVER_ERROR,
        "file_unreadable",
        "the file's content cannot be read",
    )
}

fn log_unreadable(path: &std::path::Path, e: &std::io::Error) {
    tracing::error!(path = %path.display(), error = %e, "a blob named by a committed file cannot be read");
}

/// A `Range` header, as far as this server honours it.
#[derive(Debug, PartialEq, Eq)]
enum RangeSpec {
    /// Absent, malformed or several ranges: the whole file (RFC 9110 lets
    /// a server ignore a range it does not support).
    Whole,
    /// One range, inclusive.
    Part(u64, u64),
    /// A range past the end.
    Unsatisfiable,
}

fn parse_range(header: &str, size: u64) -> RangeSpec {
    let Some(spec) = header.trim().strip_prefix("bytes=") else {
        return RangeSpec::Whole;
    };
    if spec.contains(',') {
        return RangeSpec::Whole;
    }
    let Some((a, b)) = spec.trim().split_once('-') else {
        return RangeSpec::Whole;
    };
    let (a, b) = (a.trim(), b.trim());
    let parsed = match (a.parse::<u64>().ok(), b.parse::<u64>().ok()) {
        // bytes=-N: the last N bytes.
        (None, Some(n)) if a.is_empty() => {
            if n == 0 || size == 0 {
                return RangeSpec::Unsatisfiable;
            }
            (size.saturating_sub(n), size - 1)
        }
        (Some(start), None) if b.is_empty() => (start, size.saturating_sub(1)),
        (Some(start), Some(end)) if start <= end => (start, end.min(size.saturating_sub(1))),
        _ => return RangeSpec::Whole,
    };
    if parsed.0 >= size {
        return RangeSpec::Unsatisfiable;
    }
    RangeSpec::Part(parsed.0, parsed.1)
}

/// The content type of `path`, from its extension.
fn content_type(path: &str) -> HeaderValue {
    let ext = path
        .rsplit('/')
        .next()
        .and_then(|name| name.rsplit_once('.'))
        .map(|(_, e)| e.to_ascii_lowercase())
        .unwrap_or_default();
    HeaderValue::from_static(match ext.as_str() {
        "txt" | "log" => "text/plain; charset=utf-8",
        "md" => "text/markdown; charset=utf-8",
        "csv" => "text/csv; charset=utf-8",
        "html" | "htm" => "text/html; charset=utf-8",
        "css" => "text/css; charset=utf-8",
        "js" | "mjs" => "text/javascript; charset=utf-8",
        "json" => "application/json",
        "xml" => "application/xml",
        "yaml" | "yml" => "application/yaml",
        "pdf" => "application/pdf",
        "png" => "image/png",
        "jpg" | "jpeg" => "image/jpeg",
        "gif" => "image/gif",
        "webp" => "image/webp",
        "svg" => "image/svg+xml",
        "zip" => "application/zip",
        "wasm" => "application/wasm",
        _ => "application/octet-stream",
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges() {
        use RangeSpec::*;
        assert_eq!(parse_range("bytes=0-3", 10), Part(0, 3));
        assert_eq!(parse_range("bytes=5-", 10), Part(5, 9));
        assert_eq!(parse_range("bytes=-3", 10), Part(7, 9));
        assert_eq!(parse_range("bytes=8-100", 10), Part(8, 9));
        assert_eq!(parse_range("bytes=10-", 10), Unsatisfiable);
        assert_eq!(parse_range("bytes=-0", 10), Unsatisfiable);
        assert_eq!(parse_range("bytes=0-1,4-5", 10), Whole);
        assert_eq!(parse_range("items=0-1", 10), Whole);
        assert_eq!(parse_range("bytes=5-2", 10), Whole);
    }

    #[test]
    fn raw_paths_are_checked_before_decoding() {
        let path = |p: &str| file_path(&format!("/v1/actors/t/a/files/{p}").parse().unwrap());
        assert_eq!(path("outputs/report.md").unwrap(), "outputs/report.md");
        assert_eq!(path("a%20b.txt").unwrap(), "a b.txt");
        for bad in [
            "..", "a/../b", "%2e%2e", "%2E%2E/x", "a%2Fb", "a%5Cb", "a%00b", "/x", "a//b", "%ff",
            "a%2",
        ] {
            assert!(path(bad).is_err(), "{bad} was accepted");
        }
    }
}
