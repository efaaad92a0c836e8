//! The cluster: members and slots, moving an actor, rebalancing.

use anyhow::Context as _;
use reqwest::Method;

use super::{Client, seg};
use crate::cli::ClientArgs;

/// A member's `alive` column: `leaving` while it stops gracefully, and `?`
/// when the node cannot tell (its view of etcd is stale: `GET
/// /v1/cluster` says `null`, which the table printed as is).
fn liveness(m: &serde_json::Value) -> &'static str {
    match (m["alive"].as_bool(), m["leaving"].as_bool()) {
        (Some(true), Some(true)) => "leaving",
        (Some(true), _) => "true",
        (Some(false), _) => "false",
        (None, _) => "?",
    }
}

/// `marmot cluster status`.
pub(in crate::cli) async fn cluster_status(args: &ClientArgs) -> anyhow::Result<()> {
    let c = Client::new(args)?;
    let (_, body) = c.send(c.request(Method::GET, "/v1/cluster")).await?;
    let v: serde_json::Value = serde_json::from_slice(&body).context("invalid response")?;
    if v["clustered"] == false {
        println!("this node runs alone (no [cluster] section in its config)");
        return Ok(());
    }
    println!(
        "node {}  controller {}  revision {}  slots {}/{} assigned, {} unavailable, {} without a backup, max epoch {}",
        v["node_id"].as_str().unwrap_or("?"),
        v["controller"].as_str().unwrap_or("(none)"),
        v["revision"],
        v["slots_assigned"],
        v["slots"],
        v["slots_unavailable"],
        v["slots_degraded"],
        v["max_epoch"],
    );
    if let Some(view) = v["view"].as_str().filter(|v| *v != "live") {
        println!("view: {view}");
    }
    println!(
        "actors placed outside their hash slot: {} ({} moving now)",
        v["actors_placed"], v["actors_moving"]
    );
    if let Some(r) = v["rebalance"].as_object() {
        println!(
            "rebalancing (asked through {}): {} used slots to move, {} being handed over",
            r.get("by").and_then(|b| b.as_str()).unwrap_or("?"),
            r.get("slots_to_move").unwrap_or(&serde_json::Value::Null),
            r.get("handoffs").unwrap_or(&serde_json::Value::Null),
        );
    }
    let count =
        |m: &serde_json::Value, k: &str| m[k].as_u64().map_or("-".into(), |u| u.to_string());
    println!(
        "{:<16} {:<12} {:<6} {:>6} {:>6} {:>7}  advertise",
        "node", "region", "alive", "slots", "used", "backup"
    );
    for m in v["members"].as_array().into_iter().flatten() {
        println!(
            "{:<16} {:<12} {:<6} {:>6} {:>6} {:>7}  {}",
            m["node_id"].as_str().unwrap_or("?"),
            m["region"].as_str().unwrap_or("-"),
            liveness(m),
            m["slots"].to_string(),
            count(m, "slots_used"),
            count(m, "backup_of"),
            m["advertise"].as_str().unwrap_or("-"),
        );
    }
    Ok(())
}

/// `marmot cluster move TYPE ID --region REGION`.
pub(in crate::cli) async fn move_actor(
    args: &ClientArgs,
    ty: &str,
    id: &str,
    region: &str,
) -> anyhow::Result<()> {
    let c = Client::new(args)?;
    let path = format!(
        "/v1/actors/{}/{}/move?region={}",
        seg(ty),
        seg(id),
        seg(region)
    );
    let (_, body) = c.send(c.request(Method::POST, &path)).await?;
    let v: serde_json::Value = serde_json::from_slice(&body).context("invalid response")?;
    if v["moved"] == true {
        println!(
            "{ty}/{id} moved to region {region} (node {}, slot {})",
            v["node"].as_str().unwrap_or("?"),
            v["slot"]
        );
    } else {
        println!("{ty}/{id} is in region {region} already");
    }
    Ok(())
}

/// `marmot cluster rebalance`.
pub(in crate::cli) async fn rebalance(args: &ClientArgs) -> anyhow::Result<()> {
    let c = Client::new(args)?;
    let (_, body) = c
        .send(c.request(Method::POST, "/v1/cluster/rebalance"))
        .await?;
    let v: serde_json::Value = serde_json::from_slice(&body).context("invalid response")?;
    println!(
        "rebalance asked for: {} used slots to move (see `marmot cluster status`)",
        v["slots_to_move"]
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_status_table_says_leaving_and_unknown() {
        let m = |v: serde_json::Value| liveness(&v);
        assert_eq!(m(serde_json::json!({"alive": true})), "true");
        assert_eq!(
            m(serde_json::json!({"alive": true, "leaving": false})),
            "true"
        );
        assert_eq!(
            m(serde_json::json!({"alive": true, "leaving": true})),
            "leaving"
        );
        assert_eq!(
            m(serde_json::json!({"alive": false, "leaving": true})),
            "false"
        );
        assert_eq!(m(serde_json::json!({"alive": null})), "?");
    }
}
