//! The cluster's operations in the OpenAPI document: moving actors,
//! rebalancing, the cluster's state, and the node-to-node endpoints.

use serde_json::json;

use super::{Op, actor, query, required, schema, with};

pub(super) fn operations() -> Vec<Op> {
    vec![
        Op {
            method: "post",
            path: "/v1/actors/{type}/{id}/move",
            id: "moveActor",
            summary: "Move an actor to a region (in a cluster)",
            params: with(
                actor(),
                [required(query(
                    "region",
                    "string",
                    "the region to move it to",
                ))],
            ),
            body: None,
            responses: vec![
                (
                    200,
                    "moved, or in that region already",
                    Some(schema("Moved")),
                ),
                (400, "no live node in that region, or no `region`", None),
                (404, "no such actor", None),
                (409, "a node alone, or another move under way", None),
                (503, "a step failed; nothing changed", None),
            ],
        },
        Op {
            method: "get",
            path: "/v1/cluster",
            id: "clusterStatus",
            summary: "Members (node id, region, advertise URL, slots) and the slot table's state; `clustered: false` on a node that runs alone",
            params: vec![],
            body: None,
            responses: vec![(
                200,
                "the cluster as this node sees it",
                Some(schema("ClusterStatus")),
            )],
        },
        Op {
            method: "get",
            path: "/v1/cluster/catalog",
            id: "clusterCatalog",
            summary: "Every type's current version with its code (base64) and config, and the shared state (secrets sealed, providers, subscriptions, revocations): what a node returning to the cluster takes",
            params: vec![],
            body: None,
            responses: vec![
                (
                    200,
                    "every type's code and config, and the shared state",
                    Some(
                        json!({"type": "object", "required": ["types", "shared"], "properties": {
                        "types": {"type": "array", "items": {"type": "object",
                            "required": ["type", "kind", "code_base64", "config"]}},
                        "shared": {"type": "object"}}}),
                    ),
                ),
                (409, "this node runs alone: no peer needs its catalog", None),
            ],
        },
        Op {
            method: "post",
            path: "/v1/cluster/replicate",
            id: "clusterReplicate",
            summary: "Between nodes: committed batches of a slot's owner (postcard), applied by the slot's backup in order, each once; the owner releases their output after this answers",
            params: vec![],
            body: Some(json!({"required": true, "content": {
                "application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}})),
            responses: vec![
                (
                    200,
                    "one outcome per batch",
                    Some(
                        json!({"type": "object", "required": ["outcomes"], "properties": {
                        "outcomes": {"type": "array",
                            "items": {"enum": ["applied", "repeat", "refused", "gap"]}}}}),
                    ),
                ),
                (400, "not batches, or this node is not in a cluster", None),
            ],
        },
        Op {
            method: "post",
            path: "/v1/cluster/blobs/missing",
            id: "clusterBlobsMissing",
            summary: "Between nodes: which of these files' blobs (postcard SHA-256s) this node lacks, as postcard; it holds the others for the replicated or moved-in rows about to name them",
            params: vec![],
            body: Some(json!({"required": true, "content": {
                "application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}})),
            responses: vec![
                (
                    200,
                    "the names of the blobs this node lacks (postcard)",
                    None,
                ),
                (
                    400,
                    "not blob names, or this node is not in a cluster",
                    None,
                ),
            ],
        },
        Op {
            method: "post",
            path: "/v1/cluster/blobs",
            id: "clusterPutBlobs",
            summary: "Between nodes: files' blobs (postcard name and bytes), stored ahead of the replicated or moved-in rows that name them; answered once durable",
            params: vec![],
            body: Some(json!({"required": true, "content": {
                "application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}})),
            responses: vec![
                (
                    200,
                    "stored",
                    Some(json!({"type": "object", "required": ["stored"],
                        "properties": {"stored": {"type": "integer", "minimum": 0}}})),
                ),
                (
                    400,
                    "not blobs, bytes that do not match their name, or a node alone",
                    None,
                ),
            ],
        },
        Op {
            method: "post",
            path: "/v1/cluster/move-in",
            id: "clusterMoveIn",
            summary: "Between nodes: an actor's rows (postcard) from the node moving it, installed in its new slot; answered once durable here and on the slot's backup",
            params: vec![],
            body: Some(json!({"required": true, "content": {
                "application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}})),
            responses: vec![
                (
                    200,
                    "installed",
                    Some(json!({"type": "object", "required": ["installed"],
                        "properties": {"installed": {"const": true}}})),
                ),
                (400, "not a moved actor", None),
                (
                    409,
                    "the slot is not this node's at that epoch, or a node alone",
                    None,
                ),
                (503, "the rows could not be installed", None),
            ],
        },
        Op {
            method: "post",
            path: "/v1/cluster/drop-copy",
            id: "clusterDropCopy",
            summary: "Between nodes: which copy of an actor (postcard) the owner of its hash slot kept from before, or drop the copy created at a given time, ahead of the removal of its placement entry; a drop is answered once durable here and on the slot's backup",
            params: vec![],
            body: Some(json!({"required": true, "content": {
                "application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}})),
            responses: vec![
                (
                    200,
                    "the copy held (asked), or dropped",
                    Some(
                        json!({"type": "object", "required": ["created_at_ms"], "properties": {
                        "created_at_ms": {"type": ["integer", "null"],
                            "description": "the copy's creation time (null: none)"}}}),
                    ),
                ),
                (400, "not a dropped copy", None),
                (
                    409,
                    "the slot is not this node's at that epoch, or a node alone",
                    None,
                ),
                (503, "the copy could not be dropped", None),
            ],
        },
        Op {
            method: "post",
            path: "/v1/cluster/rebalance",
            id: "clusterRebalance",
            summary: "Move every used slot to the preferred node of its region (after adding a node, or when one came back), a few at a time, with no acknowledged write lost; progress in `GET /v1/cluster`",
            params: vec![],
            body: None,
            responses: vec![
                (202, "requested", Some(schema("Rebalance"))),
                (409, "a node alone", None),
                (503, "etcd did not answer", None),
            ],
        },
    ]
}
