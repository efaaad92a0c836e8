//! What the cluster keeps in etcd, declared in one place: the key layout,
//! the records (JSON, versioned by [`LAYOUT_VERSION`]) and the two hashes
//! every node must agree on (actor → slot, slot → preferred node).
//!
//! ```text
//! {prefix}/meta                 {"layout": 1, "slots": 1024}
//! {prefix}/credential           [`credential`]: the admin token every node
//!                               must have, as an HMAC under a salt of the
//!                               cluster's (written by the first node to
//!                               start, checked by every other before it
//!                               joins)
//! {prefix}/members/{node_id}    MemberRecord, under the member's lease
//! {prefix}/controller           node_id of the controller, under its lease
//! {prefix}/stores/{node_id}     the store id (`marmot_storage::Storage::
//!                               store_id`) the node last joined with, no
//!                               lease: written with its member key
//! {prefix}/slots/{0000..1023}   SlotRecord, written only by the controller
//!                               (and by the owner, to mark its slot used or
//!                               to drop a backup it cannot reach), always by
//!                               compare-and-swap on mod_revision
//! {prefix}/placements/{t}/{id}  PlacementRecord of an actor that lives in
//!                               another slot than its hash names (placed in
//!                               a region, or moved), written only by the
//!                               owner of the slot it leaves, by
//!                               compare-and-swap; type and id percent-encoded
//! {prefix}/rebalance            RebalanceRecord: an operator asked that used
//!                               slots move to the preferred node of their
//!                               region; deleted by the controller when done
//! ```

use percent_encoding::{NON_ALPHANUMERIC, percent_decode_str, utf8_percent_encode};
use serde::{Deserialize, Serialize};

use crate::ids::ActorKey;

/// Version of the layout above. A node refuses a cluster whose `meta`
/// names another.
pub const LAYOUT_VERSION: u32 = 1;

/// Slots an actor can hash to. Fixed for the life of a cluster (recorded
/// in `meta`).
pub const SLOTS: u32 = 1024;

/// The cluster's keys under one prefix.
#[derive(Debug, Clone)]
pub struct Keys {
    prefix: String,
}

impl Keys {
    /// Keys under `prefix` (`/marmot`).
    pub fn new(prefix: &str) -> Self {
        Self {
            prefix: prefix.to_owned(),
        }
    }

    /// Everything of this cluster (watched as one range).
    pub fn all(&self) -> String {
        format!("{}/", self.prefix)
    }

    pub fn meta(&self) -> String {
        format!("{}/meta", self.prefix)
    }

    pub fn credential(&self) -> String {
        format!("{}/credential", self.prefix)
    }

    /// Every member's key starts with this.
    pub fn members(&self) -> String {
        format!("{}/members/", self.prefix)
    }

    pub fn member(&self, node_id: &str) -> String {
        format!("{}/members/{node_id}", self.prefix)
    }

    pub fn controller(&self) -> String {
        format!("{}/controller", self.prefix)
    }

    pub fn store(&self, node_id: &str) -> String {
        format!("{}/stores/{node_id}", self.prefix)
    }

    pub fn slot(&self, slot: u32) -> String {
        format!("{}/slots/{slot:04}", self.prefix)
    }

    pub fn rebalance(&self) -> String {
        format!("{}/rebalance", self.prefix)
    }

    pub fn placement(&self, actor: &ActorKey) -> String {
        format!(
            "{}/placements/{}/{}",
            self.prefix,
            utf8_percent_encode(actor.ty(), NON_ALPHANUMERIC),
            utf8_percent_encode(actor.id(), NON_ALPHANUMERIC)
        )
    }

    /// What a key under [`Self::all`] is.
    pub fn parse<'k>(&self, key: &'k str) -> Option<Key<'k>> {
        let rest = key.strip_prefix(&self.prefix)?.strip_prefix('/')?;
        if let Some(actor) = rest.strip_prefix("placements/") {
            let (ty, id) = actor.split_once('/')?;
            let ty = percent_decode_str(ty).decode_utf8().ok()?;
            let id = percent_decode_str(id).decode_utf8().ok()?;
            return ActorKey::new(&ty, &id).ok().map(Key::Placement);
        }
        if let Some(id) = rest.strip_prefix("members/") {
            return Some(Key::Member(id));
        }
        if let Some(n) = rest.strip_prefix("slots/") {
            return n.parse().ok().filter(|n| *n < SLOTS).map(Key::Slot);
        }
        match rest {
            "controller" => Some(Key::Controller),
            "meta" | "credential" => Some(Key::Meta),
            "rebalance" => Some(Key::Rebalance),
            _ => None,
        }
    }
}

/// A key of the layout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Key<'k> {
    Meta,
    Member(&'k str),
    Controller,
    Slot(u32),
    Placement(ActorKey),
    Rebalance,
}

/// What `{prefix}/credential` holds for nodes whose admin token is
/// `admin_token` (none: auth off): `v1:{salt}:{mac}`, an HMAC-SHA256 of
/// the token under a random salt of the cluster's (hex), never the token:
/// no table computed once reads the tokens of every cluster. Nodes with
/// different tokens refuse each other's requests; one that joined anyway
/// took slots that nobody could reach (found by a probe), so a node whose
/// token differs does not join.
pub fn credential(admin_token: Option<&str>, salt: &[u8; 16]) -> String {
    use hmac::Mac as _;
    let mut mac = <hmac::Hmac<sha2::Sha256>>::new_from_slice(salt).expect("any key length");
    mac.update(b"marmot cluster credential v1\0");
    match admin_token {
        Some(t) => {
            mac.update(&[1]);
            mac.update(t.as_bytes());
        }
        None => mac.update(&[0]),
    }
    let tag = hex::encode(mac.finalize().into_bytes());
    format!("v1:{}:{tag}", hex::encode(salt))
}

/// Whether `recorded` (a `{prefix}/credential` value) is the credential of
/// `admin_token`.
pub fn credential_matches(recorded: &[u8], admin_token: Option<&str>) -> bool {
    let salt = std::str::from_utf8(recorded)
        .ok()
        .and_then(|r| r.strip_prefix("v1:")?.split(':').next())
        .and_then(|s| hex::decode(s).ok())
        .and_then(|s| <[u8; 16]>::try_from(s).ok());
    salt.is_some_and(|salt| credential(admin_token, &salt).as_bytes() == recorded)
}

/// `{prefix}/meta`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MetaRecord {
    pub layout: u32,
    pub slots: u32,
}

/// A live node. The key exists only while the node's lease does.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberRecord {
    pub node_id: String,
    pub region: String,
    /// Base URL the other nodes reach it at.
    pub advertise: String,
    /// The lease it joined with: a new process (or a rejoin after the
    /// lease was lost) is a new incarnation.
    pub incarnation: i64,
    /// It is stopping (a graceful stop, handing its slots over): still
    /// serving what it owns, but given nothing new — no slot, backup or
    /// handoff.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub leaving: bool,
}

impl MemberRecord {
    /// Whether slots may be given to it: not while it is leaving.
    pub fn takes_slots(&self) -> bool {
        !self.leaving
    }
}

/// Who serves a slot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SlotRecord {
    /// The owner's `node_id`.
    pub owner: String,
    /// Incremented on every change of owner: a request or commit made
    /// under an older epoch is refused.
    pub epoch: u64,
    /// The owner has served the slot, so it may hold actors' data there.
    /// A used slot moves only to its backup (which has the data); an unused
    /// one the controller may hand to any node.
    pub used: bool,
    /// The node every commit of the slot reaches before its output is
    /// released, and which becomes the owner if the owner dies. A backup
    /// holds the slot's data since the slot was first used; once dropped
    /// (it died, or the owner could not reach it) a used slot has none
    /// (degraded) until a new backup has caught up from a snapshot
    /// (`joining`). Absent in records of layout 1 written before backups.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backup: Option<String>,
    /// A node catching up to become the backup of a used slot that has
    /// none: the owner ships it a snapshot of the slot, then every write;
    /// once it has the snapshot the owner names it the backup. Never
    /// promoted to owner before that.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub joining: Option<String>,
    /// A node the owner dropped as backup or joining node because it could
    /// not reach it: not chosen as the next joining node (which would stall
    /// the slot's writes again), until a backup has caught up.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub avoid: Option<String>,
    /// A rebalance asks the owner to hand the slot to its backup (this
    /// node, the preferred one of the owner's region). The owner fences
    /// the slot, waits until the backup has every commit, and writes the
    /// switch itself (owner ↔ backup, epoch + 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub handoff: Option<String>,
    /// The region the slot belongs to: its owner's when the controller
    /// assigned it unused. A failover that finds no live node of it goes
    /// to another region and keeps this, so that backups and a rebalance
    /// bring the slot (and the actors placed near their users in it)
    /// home. Absent in records written before 2026-12-06: the owner's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region: Option<String>,
}

/// `{prefix}/rebalance`: a rebalance was asked for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RebalanceRecord {
    /// When (the asking node's clock).
    pub requested_at_ms: u64,
    /// The node that was asked.
    pub by: String,
}

/// Where an actor lives when not in the slot its hash names: it was
/// placed in a region when created, or moved. The entry is the switch of a
/// move: the actor's rows count only in the slot it names.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlacementRecord {
    /// The slot the actor lives in.
    pub slot: u32,
    /// A move (or a placement) out of `slot` is under way, by the slot's
    /// owner `by`: requests wait, and nothing of the actor commits, until
    /// the entry names its new slot — or the move is undone (by `by`, or by
    /// whichever node owns `slot` once `by` is gone).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub moving: Option<String>,
}

/// The slot of an actor by its hash (where it lives unless a
/// [`PlacementRecord`] says otherwise): FNV-1a (64 bit) of `type \0 id`, modulo
/// [`SLOTS`]. Part of the layout: changing it moves every actor.
pub fn hash_slot(key: &ActorKey) -> u32 {
    let h = fnv1a(&[key.ty().as_bytes(), b"\0", key.id().as_bytes()]);
    (h % u64::from(SLOTS)) as u32
}

/// Rendezvous (highest random weight) score of `node_id` for `slot`: the
/// node with the highest score is the slot's preferred owner, so a node
/// joining or leaving moves only the slots it wins or held.
pub fn score(slot: u32, node_id: &str) -> u64 {
    // A final mix spreads FNV's weak low bits.
    let h = fnv1a(&[&slot.to_le_bytes(), node_id.as_bytes()]);
    let mut x = h ^ (h >> 33);
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^ (x >> 33)
}

fn fnv1a(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for part in parts {
        for b in *part {
            h ^= u64::from(*b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_stable_and_spread() {
        // Pinned: these values are part of the layout (a change needs a
        // new LAYOUT_VERSION, or nodes of two versions would put one actor
        // in two slots).
        let k = ActorKey::new("counter", "alice").unwrap();
        assert_eq!(hash_slot(&k), 131);
        assert_eq!(score(0, "n1"), 10_030_153_729_468_102_591);
        let mut counts = vec![0u32; SLOTS as usize];
        for i in 0..100_000 {
            let k = ActorKey::new("t", &format!("user-{i}")).unwrap();
            counts[hash_slot(&k) as usize] += 1;
        }
        let (min, max) = (counts.iter().min().unwrap(), counts.iter().max().unwrap());
        assert!(*min > 50 && *max < 160, "uneven: {min}..{max}");
    }

    #[test]
    fn rendezvous_moves_only_the_slots_a_node_wins_or_held() {
        fn best(nodes: &[&'static str], s: u32) -> &'static str {
            nodes.iter().max_by_key(|n| score(s, n)).unwrap()
        }
        let three = ["n1", "n2", "n3"];
        let four = ["n1", "n2", "n3", "n4"];
        let mut moved = 0;
        let mut won = [0; 3];
        for s in 0..SLOTS {
            let (a, b) = (best(&three, s), best(&four, s));
            if a != b {
                assert_eq!(b, "n4", "a slot moved between old nodes");
                moved += 1;
            }
            won[three.iter().position(|n| *n == a).unwrap()] += 1;
        }
        assert!((180..330).contains(&moved), "moved {moved}");
        assert!(won.iter().all(|w| (270..420).contains(w)), "{won:?}");
    }

    #[test]
    fn keys_parse_back() {
        let k = Keys::new("/marmot");
        assert_eq!(k.parse(&k.member("n1")), Some(Key::Member("n1")));
        assert_eq!(k.parse(&k.slot(17)), Some(Key::Slot(17)));
        assert_eq!(k.parse(&k.controller()), Some(Key::Controller));
        assert_eq!(k.parse(&k.meta()), Some(Key::Meta));
        let odd = ActorKey::new("counter", "x y/ü").unwrap();
        assert_eq!(k.parse(&k.placement(&odd)), Some(Key::Placement(odd)));
        assert_eq!(k.parse("/marmot/slots/9999"), None);
        assert_eq!(k.parse("/other/meta"), None);
    }

    /// A node's credential matches the recorded one only with the same
    /// admin token (or both without), whatever salt recorded it.
    #[test]
    fn credentials_match_only_the_same_token() {
        let recorded = credential(Some("token-of-the-cluster"), &[7; 16]);
        assert!(recorded.starts_with("v1:07070707"), "{recorded}");
        assert!(!recorded.contains("token-of-the-cluster"));
        let ok = |t| credential_matches(recorded.as_bytes(), t);
        assert!(ok(Some("token-of-the-cluster")));
        assert!(!ok(Some("token-of-another-one")));
        assert!(!ok(None));
        let open = credential(None, &[9; 16]);
        assert!(credential_matches(open.as_bytes(), None));
        assert!(!credential_matches(open.as_bytes(), Some("")));
        assert_ne!(credential(None, &[1; 16]), open, "salted");
        for junk in ["", "v1:", "v1:zz:00", "v2:07:00", "v1:0707:00"] {
            assert!(!credential_matches(junk.as_bytes(), None), "{junk}");
        }
    }
}
