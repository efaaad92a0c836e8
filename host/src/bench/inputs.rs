//! `marmot bench inputs`: input requests answered one after another on one
//! actor whose settled requests pile up (each with a 16 KB prompt), in
//! blocks; an answer should cost the same in the last block as in the
//! first. (Every settlement used to decode every request the actor kept,
//! so the last of 2,000 answers took 6× the first.)

use std::time::Instant;

use bytes::Bytes;

use super::{BenchArgs, Percentiles, ready_node};
use crate::config::{NodeConfig, TypeConfig};
use crate::ids::ActorKey;
use crate::storage::schema::CodeKind;

const ASKER: &str = r#"import { inputs } from "marmot";
export default {
  onMessage() { return { id: inputs.request({ kind: "q", prompt: "p".repeat(16000) }) }; },
  onInput() {},
};
"#;

/// Blocks the answers are reported in.
const BLOCKS: usize = 4;

pub(super) async fn inputs(args: &BenchArgs) -> anyhow::Result<()> {
    let dir = tempfile::Builder::new().prefix("marmot-bench-").tempdir()?;
    let mut config = NodeConfig::for_dir(dir.path().join("data"));
    let total = args.actors.unwrap_or(2000).max(BLOCKS);
    // Keep every answered request: the pile is what is measured.
    config.inputs.max_settled_per_actor = total as u64 + 1;
    let node = ready_node(config).await?;
    let config = TypeConfig {
        idle_timeout_ms: Some(3_600_000),
        ..Default::default()
    };
    node.deploy("asker", CodeKind::Js, ASKER.as_bytes().to_vec(), config)
        .await?;
    let key = ActorKey::new("asker", "a")?;
    println!(
        "scenario inputs (one JavaScript actor, {total} requests with 16 KB prompts, each answered \
         before the next; `--actors` sets the count)"
    );
    let per_block = total / BLOCKS;
    let mut first = None;
    for block in 0..BLOCKS {
        let mut lat = Vec::with_capacity(per_block);
        for _ in 0..per_block {
            let r = node
                .send(&key, Bytes::from_static(b"{}"), None, None)
                .await?;
            anyhow::ensure!(r.status == 200, "ask: {}", String::from_utf8_lossy(&r.body));
            let id: serde_json::Value = serde_json::from_slice(&r.body)?;
            let id = id["id"].as_str().unwrap_or_default().to_owned();
            let t = Instant::now();
            node.answer_input(&key, &id, b"\"ok\"".to_vec()).await?;
            lat.push(t.elapsed());
        }
        let p = Percentiles::of(&mut lat);
        let ratio = p.p50.as_secs_f64() / first.get_or_insert(p.p50).as_secs_f64();
        println!(
            "  answers {:>5}-{:<5} (settled before: {:>5})  {}  p50 ×{ratio:.2} of the first block",
            block * per_block + 1,
            (block + 1) * per_block,
            block * per_block,
            p.line()
        );
    }
    Ok(())
}
