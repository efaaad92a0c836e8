//! A recorded history of writes for the cluster's fault tests, and its
//! checker (Jepsen-style, for one kind of operation): each operation adds a
//! unique id to one actor's set (the testkit's `record`), is invoked, and
//! ends `ok` (acknowledged, with the node, slot and epoch that served it),
//! `fail` (refused: not applied) or `unknown` (no answer: maybe applied).
//! Retries of one id use the same idempotency key.
//!
//! The checker asks of the final state: every acknowledged id is there, no
//! id is there twice, no id is there that was never invoked, and at most
//! one node acknowledged writes for any (slot, epoch). A named history is
//! also written, with the final state, to
//! `target/tmp/histories/{name}.history` for a look after the run.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;

/// One line of the history.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Line {
    Invoke {
        actor: String,
        id: String,
    },
    Ok {
        actor: String,
        id: String,
        node: String,
        slot: u32,
        epoch: u64,
    },
    Fail {
        actor: String,
        id: String,
        status: u16,
    },
    Unknown {
        actor: String,
        id: String,
    },
}

/// A history, appended to from many clients.
#[derive(Default)]
pub struct History {
    /// Names the file it is written to (none: not written).
    name: String,
    lines: Mutex<Vec<Line>>,
}

impl std::fmt::Display for Line {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Line::Invoke { actor, id } => write!(f, "invoke {actor} {id}"),
            Line::Ok {
                actor,
                id,
                node,
                slot,
                epoch,
            } => write!(f, "ok {actor} {id} {node} {slot} {epoch}"),
            Line::Fail { actor, id, status } => write!(f, "fail {actor} {id} {status}"),
            Line::Unknown { actor, id } => write!(f, "unknown {actor} {id}"),
        }
    }
}

impl History {
    /// A history written to a file named `name` when it is checked.
    pub fn named(name: &str) -> Self {
        Self {
            name: name.to_owned(),
            lines: Mutex::default(),
        }
    }

    pub fn invoke(&self, actor: &str, id: &str) {
        self.push(Line::Invoke {
            actor: actor.into(),
            id: id.into(),
        });
    }

    /// The outcome of one attempt: `None` is no answer.
    pub fn outcome(&self, actor: &str, id: &str, resp: Option<&super::Resp>) {
        let header = |r: &super::Resp, name: &str| {
            r.headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        };
        let (actor, id) = (actor.to_owned(), id.to_owned());
        self.push(match resp {
            None => Line::Unknown { actor, id },
            Some(r) if r.status == 200 => Line::Ok {
                node: header(r, "x-marmot-node").expect("an actor's reply names its node"),
                slot: header(r, "x-marmot-slot")
                    .and_then(|v| v.parse().ok())
                    .unwrap(),
                epoch: header(r, "x-marmot-epoch")
                    .and_then(|v| v.parse().ok())
                    .unwrap(),
                actor,
                id,
            },
            Some(r) => Line::Fail {
                actor,
                id,
                status: r.status,
            },
        });
    }

    fn push(&self, line: Line) {
        self.lines.lock().unwrap().push(line);
    }

    /// Append a line as it is (the checker's own test).
    pub fn push_line(&self, line: Line) {
        self.push(line);
    }

    pub fn lines(&self) -> Vec<Line> {
        self.lines.lock().unwrap().clone()
    }

    /// Acknowledged ids per actor.
    pub fn acked(&self) -> BTreeMap<String, BTreeSet<String>> {
        let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for l in self.lines() {
            if let Line::Ok { actor, id, .. } = l {
                out.entry(actor).or_default().insert(id);
            }
        }
        out
    }

    /// Check the history against `state`: per actor, how many times each id
    /// was applied. Panics with every violation found.
    pub fn check(&self, state: &BTreeMap<String, BTreeMap<String, i64>>) -> Summary {
        let lines = self.lines();
        let saved = self.save(&lines, state);
        let mut invoked: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
        let mut committers: BTreeMap<(u32, u64), BTreeSet<&str>> = BTreeMap::new();
        let mut summary = Summary::default();
        for l in &lines {
            match l {
                Line::Invoke { actor, id } => {
                    summary.invoked += 1;
                    invoked.entry(actor).or_default().insert(id);
                }
                Line::Ok {
                    node, slot, epoch, ..
                } => {
                    summary.ok += 1;
                    committers.entry((*slot, *epoch)).or_default().insert(node);
                }
                Line::Fail { status, .. } => {
                    summary.failed += 1;
                    *summary.failed_by_status.entry(*status).or_default() += 1;
                }
                Line::Unknown { .. } => summary.unknown += 1,
            }
        }
        let mut violations = Vec::new();
        for (actor, ids) in self.acked() {
            let seen = state.get(&actor);
            for id in ids {
                match seen.and_then(|s| s.get(&id)) {
                    Some(1) => {}
                    None => violations.push(format!("{actor}: acknowledged {id} lost")),
                    Some(n) => violations.push(format!("{actor}: {id} applied {n} times")),
                }
            }
        }
        for (actor, seen) in state {
            for (id, n) in seen {
                if *n != 1 {
                    violations.push(format!("{actor}: {id} applied {n} times"));
                }
                if !invoked
                    .get(actor.as_str())
                    .is_some_and(|i| i.contains(id.as_str()))
                {
                    violations.push(format!("{actor}: {id} applied but never invoked"));
                }
            }
        }
        for ((slot, epoch), nodes) in &committers {
            if nodes.len() > 1 {
                violations.push(format!("slot {slot} epoch {epoch}: committed by {nodes:?}"));
            }
        }
        summary.epochs = committers.len();
        assert!(
            violations.is_empty(),
            "{} violations in a history of {} lines{}:\n{}",
            violations.len(),
            lines.len(),
            saved
                .map(|p| format!(" (written to {})", p.display()))
                .unwrap_or_default(),
            violations.join("\n")
        );
        summary
    }

    /// Write the lines and the final state (`final actor id times`) to
    /// this history's file, if it is named.
    fn save(
        &self,
        lines: &[Line],
        state: &BTreeMap<String, BTreeMap<String, i64>>,
    ) -> Option<std::path::PathBuf> {
        if self.name.is_empty() {
            return None;
        }
        let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("histories");
        std::fs::create_dir_all(&dir).ok()?;
        let path = dir.join(format!("{}.history", self.name));
        let mut text = String::new();
        for l in lines {
            text.push_str(&format!("{l}\n"));
        }
        for (actor, seen) in state {
            for (id, n) in seen {
                text.push_str(&format!("final {actor} {id} {n}\n"));
            }
        }
        std::fs::write(&path, text).ok()?;
        eprintln!("history written to {}", path.display());
        Some(path)
    }
}

/// What a checked history held.
#[derive(Debug, Default, Clone)]
pub struct Summary {
    pub invoked: usize,
    pub ok: usize,
    pub failed: usize,
    pub failed_by_status: BTreeMap<u16, usize>,
    pub unknown: usize,
    /// Distinct (slot, epoch) pairs that acknowledged writes.
    pub epochs: usize,
}
