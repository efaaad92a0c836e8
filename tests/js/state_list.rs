//! Listing a JavaScript actor's state: a page at a time, bounded in bytes,
//! and the same whatever mix of disk rows, cached reads and this turn's
//! writes and deletes it walks.

use serde_json::json;

use crate::common::js::{COUNTER_JS, eval, node};

/// `state.list(prefix, {after, limit})` reads a page at a time: a state
/// larger than the sandbox's memory could not be listed at all (the whole
/// list trapped on memory).
#[tokio::test]
async fn state_is_listed_a_page_at_a_time() {
    let (_dir, _m, api) = node(None).await;
    assert_eq!(api.deploy_js("paged", COUNTER_JS).await.status, 201);
    let fill =
        "for (let i = 0; i < 600; i++) marmot.state.set('k/' + String(i).padStart(3, '0'), i); 1";
    assert_eq!(eval(&api, "paged", "p", fill).await.json["result"], 1);
    let read = "const s = marmot.state;
        const a = s.list('k/', {limit: 300});
        const b = s.list('k/', {after: a[a.length - 1][0], limit: 1000});
        [a.length, a[0][0], b.length, b[0][0], b[b.length - 1][1], s.list('k/').length,
         s.list('k/', {after: 'k/100', limit: 2}), s.list('k/', {after: 'k/599'}).length]";
    let r = eval(&api, "paged", "p", read).await;
    assert_eq!(
        r.json["result"],
        json!([
            300,
            "k/000",
            300,
            "k/300",
            599,
            600,
            [["k/101", 101], ["k/102", 102]],
            0
        ]),
        "{}",
        r.json
    );
    for bad in ["{limit: 0}", "{limit: 1.5}", "7"] {
        let r = eval(
            &api,
            "paged",
            "p",
            &format!("marmot.state.list('k/', {bad})"),
        )
        .await;
        let error = r.json["error"].as_str().unwrap_or_default();
        assert!(
            error.starts_with("TypeError: state.list"),
            "{bad}: {}",
            r.json
        );
    }
}

/// `GET …/state` pages are bounded in bytes too (at least one entry
/// each), and `next_after` leads through every key: a page of a thousand
/// 1 MiB values was one answer of a gigabyte.
#[tokio::test]
async fn state_pages_are_bounded_in_bytes() {
    let (_dir, _m, api) = node(None).await;
    assert_eq!(api.deploy_js("big", COUNTER_JS).await.status, 201);
    let fill = "for (let i = 0; i < 20; i++) \
                marmot.state.set('b' + String(i).padStart(2, '0'), 'v'.repeat(1000000)); 1";
    assert_eq!(eval(&api, "big", "p", fill).await.json["result"], 1);
    let mut keys = Vec::new();
    let mut pages = 0;
    let mut path = "/v1/actors/big/p/state?limit=1000".to_owned();
    loop {
        let r = api.get(&path).await;
        assert_eq!(r.status, 200, "{}", r.json);
        assert!(r.body.len() < 10 << 20, "a page of {} bytes", r.body.len());
        let entries = r.json["entries"].as_array().unwrap();
        assert!(!entries.is_empty());
        keys.extend(
            entries
                .iter()
                .map(|e| e["key"].as_str().unwrap().to_owned()),
        );
        pages += 1;
        match r.json["next_after"].as_str() {
            Some(next) => path = format!("/v1/actors/big/p/state?limit=1000&after={next}"),
            None => break,
        }
    }
    let want: Vec<String> = (0..20).map(|i| format!("b{i:02}")).collect();
    assert_eq!(keys, want);
    assert!(pages >= 3, "{pages} pages");
}

/// A listing is the same, page by page, whatever part of the state is on
/// disk, cached by the activation, or written or deleted by the turn:
/// random reads, writes and deletes over committed keys, then every page
/// size against a model kept by the script, in a fresh activation and
/// again in the same one (its cache then holds the deletes).
#[tokio::test]
async fn listings_merge_disk_cache_and_the_turns_writes() {
    let (_dir, _m, api) = node(None).await;
    let manifest = json!({"kind": "js", "code": COUNTER_JS, "config": {"idle_timeout_ms": 200}});
    assert_eq!(api.deploy_manifest("mix", &manifest).await.status, 201);
    let fill =
        "for (let i = 0; i < 300; i++) marmot.state.set('k' + String(i).padStart(3, '0'), i);
                marmot.state.set('j', 'before'); marmot.state.set('l', 'after'); 1";
    assert_eq!(eval(&api, "mix", "m", fill).await.json["result"], 1);
    // Hibernated: the next activation starts with nothing cached.
    api.wait_info("mix", "m", "hibernation", |i| i["status"] == "hibernated")
        .await;
    let mut model = json!(
        (0..300)
            .map(|i| (format!("k{i:03}"), json!(i)))
            .collect::<serde_json::Map<_, _>>()
    );
    for seed in [12345, 777] {
        let script = format!(
            "const s = marmot.state;
            const model = new Map(Object.entries({model}));
            let x = {seed};
            const rnd = () => (x = (x * 1103515245 + 12345) % 2147483648) / 2147483648;
            const key = (i) => 'k' + String(i).padStart(3, '0');
            for (let n = 0; n < 500; n++) {{
              const k = key(Math.floor(rnd() * 400));
              const r = rnd();
              if (r < 0.3) s.get(k);
              else if (r < 0.65) {{ s.delete(k); model.delete(k); }}
              else {{ s.set(k, n); model.set(k, n); }}
            }}
            const want = JSON.stringify([...model.entries()].sort((a, b) => (a[0] < b[0] ? -1 : 1)));
            const wrong = [];
            for (const limit of [1, 2, 3, 7, 64, 1000]) {{
              const got = [];
              let after;
              for (;;) {{
                const page = s.list('k', after === undefined ? {{ limit }} : {{ after, limit }});
                if (page.length === 0) break;
                if (page.length > limit) wrong.push('a page of ' + page.length);
                got.push(...page);
                after = page[page.length - 1][0];
              }}
              if (JSON.stringify(got) !== want) wrong.push(limit);
            }}
            if (JSON.stringify(s.list('k')) !== want) wrong.push('whole');
            ({{ wrong, model: Object.fromEntries(model) }})"
        );
        let r = eval(&api, "mix", "m", &script).await;
        assert_eq!(
            r.json["result"]["wrong"],
            json!([]),
            "seed {seed}: {}",
            r.json
        );
        model = r.json["result"]["model"].clone();
    }
}
