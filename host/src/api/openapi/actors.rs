//! The operations on actors (`/v1/actors/{type}…`) in the OpenAPI
//! document: messages, inspection, events, inputs, evals, runs and files.
//! Moving an actor is with the cluster's (`cluster.rs`).

use serde_json::json;

use super::{
    ANY_STATUS, Op, Page, actor, any_json, header, json_body, limit, media_types, names,
    path_param, query, query_with, schema, with,
};

pub(super) fn operations() -> Vec<Op> {
    vec![
        Op {
            method: "get",
            path: "/v1/actors/{type}",
            id: "listActors",
            summary: "Actors of a type, a page at a time",
            params: vec![
                path_param("type", "actor type", names::type_name()),
                query("prefix", "string", "ids starting with this"),
                query("cursor", "string", "next_cursor of the previous page"),
                limit(Page::LIST),
            ],
            body: None,
            responses: vec![
                (200, "a page", Some(schema("ActorPage"))),
                (404, "unknown type", None),
            ],
        },
        Op {
            method: "post",
            path: "/v1/actors/{type}/{id}",
            id: "send",
            summary: "Send a message and wait for the turn's reply (released once durable); ?wait=false enqueues durably and answers 202",
            params: with(
                actor(),
                [
                    query(
                        "wait",
                        "boolean",
                        "false: enqueue and answer 202 {message_id}",
                    ),
                    query(
                        "region",
                        "string",
                        "in a cluster: the region a new actor lives in (an existing one stays)",
                    ),
                    header(
                        "Idempotency-Key",
                        "a repeat returns the first reply without running again",
                        names::idempotency_key(),
                    ),
                ],
            ),
            body: Some(json!({"required": false, "content": {"*/*": {"schema": {}}}})),
            // An actor replies with any status it chooses (`default`), so
            // a 400 or 404 may also be the actor's own body.
            responses: vec![
                (
                    200,
                    "the actor's reply (status and content type are the actor's)",
                    None,
                ),
                (
                    202,
                    "queued (?wait=false); or an agent's run waits for a person: {run_id, status: waiting, waiting_for}",
                    Some(json!({"anyOf": [schema("Queued"), schema("RunWaiting"),
                        {"description": "or the actor's own 202, whatever its body"}]})),
                ),
                (
                    400,
                    "bad id, key or body, or the actor's own 400",
                    Some(any_json()),
                ),
                (
                    404,
                    "unknown type, or the actor's own 404",
                    Some(any_json()),
                ),
                (409, "the same Idempotency-Key is in progress", None),
                (
                    422,
                    "the Idempotency-Key was used with a different body, or the actor's own 422",
                    Some(any_json()),
                ),
                (
                    ANY_STATUS,
                    "the actor's reply, with the status it chose",
                    None,
                ),
                (413, "body too large", None),
                (429, "mailbox full (Retry-After)", None),
                (500, "the actor failed", None),
                (
                    503,
                    "overloaded: no instance slot, or the node's guest memory or request body budget is spent; or, in a cluster, the actor kept moving while the request ran (actor_moved); nothing changed (Retry-After)",
                    None,
                ),
            ],
        },
        Op {
            method: "get",
            path: "/v1/actors/{type}/{id}",
            id: "actorInfo",
            summary: "Status, version, statistics of an actor",
            params: actor(),
            body: None,
            responses: vec![
                (200, "info", Some(schema("ActorInfo"))),
                (404, "no such actor", None),
            ],
        },
        Op {
            method: "delete",
            path: "/v1/actors/{type}/{id}",
            id: "deleteActor",
            summary: "Delete an actor: state, alarms, events, inputs, files",
            params: actor(),
            body: None,
            responses: vec![
                (200, "deleted", Some(schema("Removed"))),
                (404, "no such actor", None),
            ],
        },
        Op {
            method: "get",
            path: "/v1/actors/{type}/{id}/state",
            id: "listState",
            summary: "State keys and values (inspection): a page holds at most `limit` entries and 8 MiB of values (at least one); `next_after` is given when more follow",
            params: with(
                actor(),
                [
                    query("prefix", "string", "keys starting with this"),
                    query("after", "string", "continue after this key"),
                    limit(Page::LIST),
                ],
            ),
            body: None,
            responses: vec![
                (200, "a page", Some(schema("StatePage"))),
                (404, "no such actor", None),
            ],
        },
        Op {
            method: "get",
            path: "/v1/actors/{type}/{id}/state/{key}",
            id: "getState",
            summary: "One state value",
            params: with(
                actor(),
                [path_param(
                    "key",
                    "state key (may contain `/`)",
                    names::state_key(),
                )],
            ),
            body: None,
            responses: vec![(200, "the value", None), (404, "no such key", None)],
        },
        Op {
            method: "get",
            path: "/v1/actors/{type}/{id}/events",
            id: "events",
            summary: "Event page ({events, next_after}: at most `limit` events and 8 MiB of them, so a page of large events may be shorter; the next starts after `next_after`; and {gap: {after, next}} when retention removed events since `after`; {reset: {after, last}} and the page from the start when `after` is past the log's end, as after the actor was deleted and made again); with Accept: text/event-stream a live SSE stream (Last-Event-ID resumes; `gap` and `reset` frames say the same)",
            params: with(
                actor(),
                [
                    query_with(
                        "after",
                        "events after this seq",
                        json!({"type": "integer", "minimum": 0, "maximum": u64::MAX}),
                    ),
                    limit(Page::LIST),
                    query("access_token", "string", "a client token, for EventSource"),
                    header(
                        "Last-Event-ID",
                        "start after this seq, stream or page (wins over `after`)",
                        json!({"type": "string", "pattern": "^[0-9]+$"}),
                    ),
                ],
            ),
            body: None,
            responses: vec![
                (
                    200,
                    "a page, or with Accept: text/event-stream a live stream",
                    Some(media_types(json!({
                        "application/json": {"schema": schema("EventPage")},
                        "text/event-stream": {"schema": {"type": "string",
                            "description": "frames whose `id:` is the seq and whose `data:` is an event as in a page; `gap`, `reset` and `lagged` frames"}}}))),
                ),
                (404, "no such actor", None),
                (
                    429,
                    "the client token holds as many streams as it may (events.max_streams_per_token)",
                    None,
                ),
                (503, "too many streams on the node", None),
            ],
        },
        Op {
            method: "get",
            path: "/v1/actors/{type}/{id}/alarms",
            id: "alarms",
            summary: "Pending alarms, by name: a page holds at most `limit` and 8 MiB of stored alarms (at least one); `next_after` is given when more follow",
            params: with(
                actor(),
                [
                    query("after", "string", "continue after this alarm name"),
                    limit(Page::ALARMS),
                ],
            ),
            body: None,
            responses: vec![
                (200, "alarms", Some(schema("AlarmList"))),
                (404, "no such actor", None),
            ],
        },
        Op {
            method: "get",
            path: "/v1/actors/{type}/{id}/inputs",
            id: "inputs",
            summary: "Input requests, by id: a page holds at most `limit` and 8 MiB of stored requests and answers (at least one); `next_after` is given when more follow",
            params: with(
                actor(),
                [
                    query_with(
                        "status",
                        "which (default pending)",
                        json!({"enum": ["pending", "answered", "expired", "cancelled", "all"]}),
                    ),
                    query("after", "string", "continue after this input id"),
                    limit(Page::INPUTS),
                ],
            ),
            body: None,
            responses: vec![
                (200, "inputs", Some(schema("InputList"))),
                (404, "no such actor", None),
            ],
        },
        Op {
            method: "post",
            path: "/v1/actors/{type}/{id}/inputs/{input}",
            id: "answerInput",
            summary: "Answer an input request (runs the actor's input turn)",
            params: with(
                actor(),
                [path_param("input", "input request id", names::handed_out())],
            ),
            body: Some(json_body(any_json())),
            responses: vec![
                (200, "answered and durable", Some(schema("InputAnswered"))),
                (404, "no such input", None),
                (
                    422,
                    "the answer is not JSON, or does not fit the request's schema",
                    None,
                ),
                (409, "already answered, expired or cancelled", None),
                (
                    500,
                    "the actor's `on-input` failed (the request stays pending: answer again)",
                    None,
                ),
            ],
        },
        Op {
            method: "post",
            path: "/v1/actors/{type}/{id}/eval",
            id: "eval",
            summary: "Run model-written JavaScript in a fresh sandbox bound to the actor",
            params: actor(),
            body: Some(json!({"required": true, "content": {
                "text/javascript": {"schema": {"type": "string", "pattern": "\\S"}},
                "application/json": {"schema": {"type": "object", "additionalProperties": false,
                    "properties": {"code": {"type": "string", "pattern": "\\S"}}, "required": ["code"]}}}})),
            responses: vec![
                (
                    200,
                    "`result`: the script's last value; `error`: what it threw, or why it was stopped",
                    Some(schema("EvalResult")),
                ),
                (400, "bad script body", None),
            ],
        },
        Op {
            method: "post",
            path: "/v1/actors/{type}/{id}/runs/{run_id}/cancel",
            id: "cancelRun",
            summary: "Cancel an agent run",
            params: with(
                actor(),
                [path_param("run_id", "run id", names::handed_out())],
            ),
            body: None,
            responses: vec![
                (
                    202,
                    "queued: the run stops at its next step",
                    Some(schema("RunCancelling")),
                ),
                (
                    404,
                    "no such actor, or no run of this id that could still end",
                    None,
                ),
                (
                    409,
                    "the run has ended (run_ended), or the type is not an agent",
                    None,
                ),
            ],
        },
        Op {
            method: "get",
            path: "/v1/actors/{type}/{id}/files",
            id: "listFiles",
            summary: "The actor's files",
            params: with(
                actor(),
                [
                    query_with(
                        "prefix",
                        "paths starting with this (outputs/: artifacts)",
                        names::file_prefix(),
                    ),
                    query("after", "string", "continue after this path"),
                    limit(Page::FILES),
                ],
            ),
            body: None,
            responses: vec![
                (200, "files", Some(schema("FilePage"))),
                (400, "bad prefix", None),
            ],
        },
        Op {
            method: "get",
            path: "/v1/actors/{type}/{id}/files/{path}",
            id: "downloadFile",
            summary: "Download a file (ETag, Range, If-Range, If-Match, If-None-Match)",
            params: with(
                actor(),
                [path_param(
                    "path",
                    "file path (may contain `/`)",
                    names::file_path(),
                )],
            ),
            body: None,
            responses: vec![
                (200, "the file", None),
                (206, "a range", None),
                (304, "not modified", None),
                (400, "bad path", None),
                (404, "no such file", None),
                (412, "the file is not the version If-Match names", None),
                (416, "the range asks for no byte of the file", None),
            ],
        },
    ]
}
