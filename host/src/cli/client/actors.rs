//! Actors: list, inspect, alarms and events (paged, or followed as SSE).

use anyhow::Context as _;
use reqwest::Method;
use serde_json::value::RawValue;

use super::{Client, api_error, print_json, seg};
use crate::cli::ClientArgs;

pub(in crate::cli) async fn actors(
    args: &ClientArgs,
    ty: &str,
    prefix: &str,
    limit: usize,
) -> anyhow::Result<()> {
    let c = Client::new(args)?;
    let mut cursor: Option<String> = None;
    let mut shown = 0;
    let header = || {
        println!(
            "{:<40} {:<11} {:>8} {:>10} {:>12}",
            "ID", "STATUS", "VERSION", "TURNS", "STATE BYTES"
        );
    };
    while shown < limit {
        let page = (limit - shown).min(1000);
        let mut req = c
            .request(Method::GET, &format!("/v1/actors/{}", seg(ty)))
            .query(&[("prefix", prefix), ("limit", &page.to_string())]);
        if let Some(cur) = &cursor {
            req = req.query(&[("cursor", cur)]);
        }
        let (_, body) = c.send(req).await?;
        let v: serde_json::Value = serde_json::from_slice(&body).context("invalid response")?;
        // After the first answer: an error prints nothing on stdout.
        if cursor.is_none() {
            header();
        }
        let items = v["actors"].as_array().cloned().unwrap_or_default();
        for a in &items {
            println!(
                "{:<40} {:<11} {:>8} {:>10} {:>12}",
                a["id"].as_str().unwrap_or(""),
                a["status"].as_str().unwrap_or(""),
                a["version"].to_string(),
                a["turns"].to_string(),
                a["state_bytes"].to_string()
            );
        }
        shown += items.len();
        match v["next_cursor"].as_str() {
            Some(next) if !items.is_empty() => {
                cursor = Some(next.to_owned());
                if shown >= limit {
                    // Said on stderr: stdout stays the table.
                    eprintln!("… more actors: list them with a larger --limit (or a --prefix)");
                }
            }
            _ => break,
        }
    }
    Ok(())
}

pub(in crate::cli) async fn inspect(args: &ClientArgs, ty: &str, id: &str) -> anyhow::Result<()> {
    let c = Client::new(args)?;
    let base = format!("/v1/actors/{}/{}", seg(ty), seg(id));
    let (_, info) = c.send(c.request(Method::GET, &base)).await?;
    let (_, state) = c
        .send(
            c.request(Method::GET, &format!("{base}/state"))
                .query(&[("limit", "50")]),
        )
        .await?;
    let info: serde_json::Value = serde_json::from_slice(&info).context("invalid response")?;
    let state: StatePage = serde_json::from_slice(&state).context("invalid response")?;
    let last = info["last_event_seq"].as_u64().unwrap_or(0);
    let (_, events) = c
        .send(
            c.request(Method::GET, &format!("{base}/events"))
                .query(&[("after", last.saturating_sub(10).to_string())]),
        )
        .await?;
    let events: EventPage = serde_json::from_slice(&events).context("invalid response")?;
    if let Some(after) = &state.next_after {
        // Said on stderr: stdout stays the JSON.
        eprintln!(
            "… the first {} of {} state entries: page on with GET {base}/state?after={}",
            state.entries.len(),
            info["state_keys"],
            seg(after)
        );
    }
    // Pretty as a whole; values nested deeper than `serde_json::Value`
    // goes (128 levels, which an actor may store) as they came (a value
    // like that made the whole inspection "invalid response").
    #[derive(serde::Serialize)]
    struct Inspected<'a> {
        actor: &'a serde_json::Value,
        state: &'a [Box<RawValue>],
        recent_events: &'a [Box<RawValue>],
    }
    let values = |raw: &[Box<RawValue>]| -> Option<Vec<serde_json::Value>> {
        raw.iter()
            .map(|r| serde_json::from_str(r.get()).ok())
            .collect()
    };
    let out = match (values(&state.entries), values(&events.events)) {
        (Some(state), Some(recent)) => serde_json::to_string_pretty(&serde_json::json!({
            "actor": info,
            "state": state,
            "recent_events": recent,
        }))?,
        _ => serde_json::to_string_pretty(&Inspected {
            actor: &info,
            state: &state.entries,
            recent_events: &events.events,
        })?,
    };
    println!("{out}");
    Ok(())
}

/// A page of state entries, each as it came.
#[derive(serde::Deserialize)]
struct StatePage {
    entries: Vec<Box<RawValue>>,
    next_after: Option<String>,
}

/// A page of events, each as it came (its data may nest deeper than a
/// `serde_json::Value` goes).
#[derive(serde::Deserialize)]
struct EventPage {
    events: Vec<Box<RawValue>>,
    next_after: Option<u64>,
    gap: Option<serde_json::Value>,
    reset: Option<serde_json::Value>,
}

/// A page of alarms, each as it came.
#[derive(serde::Deserialize)]
struct AlarmPage {
    alarms: Vec<Box<RawValue>>,
    next_after: Option<String>,
}

/// `marmot alarms TYPE ID`: every page of the listing, as one object.
pub(in crate::cli) async fn alarms(args: &ClientArgs, ty: &str, id: &str) -> anyhow::Result<()> {
    let c = Client::new(args)?;
    let path = format!("/v1/actors/{}/{}/alarms", seg(ty), seg(id));
    let mut all = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let mut req = c.request(Method::GET, &path);
        if let Some(a) = &after {
            req = req.query(&[("after", a)]);
        }
        let (_, body) = c.send(req).await?;
        let page: AlarmPage =
            serde_json::from_slice(&body).context("the node's alarm listing is not JSON")?;
        all.extend(page.alarms);
        match page.next_after {
            Some(next) => after = Some(next),
            None => break,
        }
    }
    #[derive(serde::Serialize)]
    struct All {
        alarms: Vec<Box<RawValue>>,
    }
    let body = serde_json::to_vec(&All { alarms: all }).context("cannot print the alarms")?;
    print_json(&body);
    Ok(())
}

/// Print an actor's events after `after`, one JSON object per line; with
/// `follow`, keep streaming new ones (SSE), resuming after the last one
/// printed whenever the connection drops.
pub(in crate::cli) async fn events(
    args: &ClientArgs,
    ty: &str,
    id: &str,
    after: u64,
    follow: bool,
) -> anyhow::Result<()> {
    let c = Client::new(args)?;
    let path = format!("/v1/actors/{}/{}/events", seg(ty), seg(id));
    if !follow {
        let mut after = after;
        loop {
            let req = c
                .request(Method::GET, &path)
                .query(&[("after", after.to_string()), ("limit", "1000".into())]);
            let (_, body) = c.send(req).await?;
            let page: EventPage = serde_json::from_slice(&body).context("invalid response")?;
            if let Some(reset) = &page.reset {
                // Past the log's end (the actor was deleted and made
                // again): the page starts over from the log's start.
                eprintln!("marmot: {}", reset_note(reset));
                after = 0;
            }
            if let Some(gap) = &page.gap {
                eprintln!("marmot: events missing (past retention): {gap}");
            }
            // Each as it came: compact JSON, one per line.
            for e in &page.events {
                println!("{}", e.get());
            }
            match page.next_after {
                Some(next) if !page.events.is_empty() && next > after => after = next,
                _ => return Ok(()),
            }
        }
    }
    let mut last = after;
    let mut backoff = std::time::Duration::from_millis(250);
    // A node that never answered is a wrong `--url` (or a node not
    // started): said once, not retried for ever. Once following, a lost
    // connection is retried.
    let mut answered = false;
    loop {
        let req = c
            .request(Method::GET, &path)
            .header("accept", "text/event-stream")
            .header("last-event-id", last.to_string());
        let resp = match req.send().await {
            Ok(r) => {
                answered = true;
                r
            }
            Err(e) if !answered => {
                return Err(
                    anyhow::Error::new(e).context(format!("cannot reach marmot at {}", c.base))
                );
            }
            Err(e) => {
                eprintln!("marmot: stream interrupted ({e}); reconnecting");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(std::time::Duration::from_secs(10));
                continue;
            }
        };
        if !resp.status().is_success() {
            let status = resp.status();
            let body = resp.bytes().await.unwrap_or_default();
            return Err(api_error(status, &body));
        }
        backoff = std::time::Duration::from_millis(250);
        let mut resp = resp;
        let mut buf: Vec<u8> = Vec::new();
        while let Ok(Some(chunk)) = resp.chunk().await {
            buf.extend_from_slice(&chunk);
            while let Some(end) = find_frame_end(&buf) {
                let frame: Vec<u8> = buf.drain(..end).collect();
                if let Some(seq) = print_frame(&String::from_utf8_lossy(&frame)) {
                    last = seq;
                }
            }
        }
        tokio::time::sleep(backoff).await;
    }
}

/// The end (exclusive, including the blank line) of the first complete SSE
/// frame in `buf`.
fn find_frame_end(buf: &[u8]) -> Option<usize> {
    buf.windows(2).position(|w| w == b"\n\n").map(|i| i + 2)
}

/// What a `reset` (page field or stream frame) means, in one line.
fn reset_note(reset: &impl std::fmt::Display) -> String {
    format!(
        "no event after the seq asked for; the actor's log was made again \
         (deleted and recreated?): printing it from its start: {reset}"
    )
}

/// Print one SSE frame's event on stdout (what the stream says about
/// itself on stderr; a model's live deltas, which are not events, not at
/// all); return its id (0 for a reset: the log starts over).
fn print_frame(frame: &str) -> Option<u64> {
    let (mut id, mut event, mut data) = (None, None, Vec::new());
    for line in frame.lines() {
        if let Some(v) = line.strip_prefix("id:") {
            id = v.trim().parse::<u64>().ok();
        } else if let Some(v) = line.strip_prefix("event:") {
            event = Some(v.trim().to_owned());
        } else if let Some(v) = line.strip_prefix("data:") {
            data.push(v.strip_prefix(' ').unwrap_or(v).to_owned());
        }
    }
    let data = data.join("\n");
    match event.as_deref() {
        Some("gap") => eprintln!("marmot: events missing (past retention): {data}"),
        Some("reset") => {
            eprintln!("marmot: {}", reset_note(&data));
            // The stream starts over: so does where a reconnect resumes
            // (it would meet the reset again, and again).
            return Some(0);
        }
        Some("lagged") => eprintln!("marmot: {data} live deltas missed (the terminal was slow)"),
        None | Some("message") if !data.is_empty() => println!("{data}"),
        _ => {}
    }
    id
}
