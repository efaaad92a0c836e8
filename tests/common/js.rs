//! Helpers for the JavaScript tests (`tests/js.rs`, `tests/js_hostile.rs`).

use reqwest::Method;

use super::{Api, Marmot, Resp, tempdir};

/// A JavaScript counter that also throws, returns odd values and upgrades
/// on request.
pub const COUNTER_JS: &str = r#"
import { state, events, log } from "marmot";

export default {
  async onMessage(body, ctx) {
    if (body === "ping") return "pong";
    if (body?.op === "throw") {
      state.set("n", -1);
      throw new Error("boom: " + ctx.id);
    }
    if (body?.op === "bigint") return { big: 10n };
    if (body?.op === "nothing") return undefined;
    if (body?.op === "ctx") return ctx;
    if (body?.op === "missing-file") {
      try {
        files.read("notes.txt");
      } catch (e) {
        return { error: String(e.message ?? e) };
      }
    }
    const n = (state.get("n") ?? 0) + (body?.by ?? 1);
    state.set("n", n);
    events.emit("counted", { n });
    log.info("counted", { n });
    console.log("counter", ctx.type, ctx.id, n);
    return { n, id: ctx.id, version: ctx.version };
  },
  onUpgrade(from) {
    const log = state.get("upgrades") ?? [];
    log.push(from);
    state.set("upgrades", log);
  },
};
import { files } from "marmot";
"#;

/// `POST …/eval` of `code` on the actor `ty`/`id`.
pub async fn eval(api: &Api, ty: &str, id: &str, code: &str) -> Resp {
    api.req(
        Method::POST,
        &format!("/v1/actors/{ty}/{id}/eval"),
        Some(("text/javascript", code.as_bytes().to_vec())),
        &[],
    )
    .await
}

/// A node with `config` (TOML), its data directory and a client.
pub async fn node(config: Option<&str>) -> (tempfile::TempDir, Marmot, Api) {
    let dir = tempdir();
    let m = Marmot::start_opts(&dir.path().join("data"), &[], config).await;
    let api = m.client();
    (dir, m, api)
}
