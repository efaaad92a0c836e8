//! The document names every route of the router, and only those.

use std::collections::BTreeSet;

use super::*;

/// (method, path) of every route in the router's source, paths in
/// OpenAPI spelling (`{*key}` → `{key}`).
fn router_routes() -> BTreeSet<(String, String)> {
    let src = include_str!("../mod.rs");
    let mut out = BTreeSet::new();
    let mut rest = src;
    while let Some(i) = rest.find(".route(") {
        rest = &rest[i + ".route(".len()..];
        // The route's arguments end at the parenthesis that closes it.
        let mut depth = 1;
        let end = rest
            .char_indices()
            .find(|&(_, c)| {
                match c {
                    '(' => depth += 1,
                    ')' => depth -= 1,
                    _ => {}
                }
                depth == 0
            })
            .map(|(j, _)| j)
            .expect("balanced route call");
        let args = &rest[..end];
        let path = args.split('"').nth(1).expect("a path literal");
        let path = path.replace("{*", "{");
        for method in ["get", "post", "put", "delete"] {
            let called = args.contains(&format!(" {method}("))
                || args.contains(&format!("\t{method}("))
                || args.contains(&format!("\n{method}("))
                || args.contains(&format!(".{method}("))
                || args.contains(&format!("::{method}("))
                || args.contains(&format!(",{method}("));
            if called {
                out.insert((method.to_owned(), path.clone()));
            }
        }
    }
    out
}

fn documented() -> BTreeSet<(String, String)> {
    operations()
        .iter()
        .map(|o| (o.method.to_owned(), o.path.to_owned()))
        .collect()
}

#[test]
fn the_document_and_the_router_name_the_same_operations() {
    let routes = router_routes();
    assert!(
        routes.len() > 30,
        "parsed {} routes: {routes:?}",
        routes.len()
    );
    let docs = documented();
    let missing: Vec<_> = routes.difference(&docs).collect();
    let extra: Vec<_> = docs.difference(&routes).collect();
    assert!(
        missing.is_empty(),
        "routes without documentation: {missing:?}"
    );
    assert!(extra.is_empty(), "documented but not routed: {extra:?}");
}

#[test]
fn operations_are_unique_and_complete() {
    let ops = operations();
    let ids: BTreeSet<_> = ops.iter().map(|o| o.id).collect();
    assert_eq!(ids.len(), ops.len(), "operation ids are unique");
    let doc = document();
    assert_eq!(doc["openapi"], "3.1.0");
    for op in &ops {
        // Every path parameter of the path is declared, and no other.
        let declared: BTreeSet<String> = op
            .params
            .iter()
            .filter(|p| p["in"] == "path")
            .map(|p| p["name"].as_str().unwrap().to_owned())
            .collect();
        let in_path: BTreeSet<String> = op
            .path
            .split('{')
            .skip(1)
            .map(|s| s.split('}').next().unwrap().to_owned())
            .collect();
        assert_eq!(declared, in_path, "{} {}", op.method, op.path);
        assert!(!op.responses.is_empty(), "{}", op.id);
    }
}
