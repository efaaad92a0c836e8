//! Guarantee 6 with real processes: alarms fire never early, at least once,
//! with their effect once; re-setting replaces; missed periodic ticks
//! collapse; wake-ups after a restart are bounded; failures are retried and
//! then recorded. Plus the API, the CLI-facing listing and bad input.

mod common;

use std::time::{Duration, Instant};

use common::{
    Api, Marmot, NOTES, TESTKIT, all_pages, cli_ok, event_kinds, kit_node, metric, tempdir,
};
use serde_json::{Value, json};

/// Wait until the actor's `fired` list has at least `n` entries; return it.
async fn wait_fired(api: &Api, id: &str, n: usize) -> Vec<Value> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let r = api
            .op("kit", id, json!({"op": "get", "key": "fired"}))
            .await;
        let fired = r.json["value"].as_array().cloned().unwrap_or_default();
        if fired.len() >= n {
            return fired;
        }
        assert!(
            Instant::now() < deadline,
            "actor {id}: {} of {n} alarms fired in 30 s: {fired:?}",
            fired.len()
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

async fn fired(api: &Api, id: &str) -> Vec<Value> {
    let r = api
        .op("kit", id, json!({"op": "get", "key": "fired"}))
        .await;
    r.json["value"].as_array().cloned().unwrap_or_default()
}

async fn alarms(api: &Api, id: &str) -> Vec<Value> {
    let r = api.get(&format!("/v1/actors/kit/{id}/alarms")).await;
    assert_eq!(r.status, 200, "{}", r.json);
    r.json["alarms"].as_array().unwrap().clone()
}

async fn set(api: &Api, id: &str, alarm: Value) -> common::Resp {
    let mut op = json!({"op": "alarm_set"});
    op.as_object_mut()
        .unwrap()
        .extend(alarm.as_object().unwrap().clone());
    api.op("kit", id, op).await
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

#[tokio::test]
async fn alarms_fire_never_early_and_exactly_once() {
    let (_dir, _m, api) = kit_node(json!({})).await;
    let r = set(
        &api,
        "a",
        json!({"name": "remind", "after": 400, "payload": {"n": 1}}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.json);
    // A time in the past fires at once; a cancelled alarm never fires.
    set(
        &api,
        "a",
        json!({"name": "late", "at": 1000, "payload": "x"}),
    )
    .await;
    set(&api, "a", json!({"name": "never", "after": 200})).await;
    let r = api
        .op("kit", "a", json!({"op": "alarm_cancel", "name": "never"}))
        .await;
    assert_eq!(r.json["existed"], true);

    let listed = alarms(&api, "a").await;
    let names: Vec<&str> = listed.iter().map(|a| a["name"].as_str().unwrap()).collect();
    assert!(names.contains(&"remind"), "{listed:?}");
    let remind = listed.iter().find(|a| a["name"] == "remind").unwrap();
    assert_eq!(remind["schedule"], json!({"after": 400}));
    assert_eq!(remind["payload"], json!({"n": 1}));
    let due = remind["next_due_ms"].as_u64().unwrap();

    let fired = wait_fired(&api, "a", 2).await;
    let late = &fired[0];
    assert_eq!(late["name"], "late");
    assert_eq!(late["payload"], "x");
    let remind = &fired[1];
    assert_eq!(remind["name"], "remind");
    assert_eq!(remind["due_at"], due);
    assert!(
        remind["now"].as_u64().unwrap() >= due,
        "fired before its due time: {remind}"
    );
    // Nothing more fires: one-shot alarms are gone once their turn commits.
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(self::fired(&api, "a").await.len(), 2);
    assert!(alarms(&api, "a").await.is_empty());
    assert_eq!(api.get("/v1/actors/kit/a").await.json["pending_alarms"], 0);
    let ev = api.get("/v1/actors/kit/a/events").await.json;
    assert_eq!(event_kinds(&ev), ["alarm_fired", "alarm_fired"]);
    let text = String::from_utf8(api.get("/metrics").await.body).unwrap();
    assert!(
        metric(&text, "marmot_alarm_lag_seconds_count") >= 2.0,
        "{text}"
    );
}

#[tokio::test]
async fn setting_the_same_alarm_again_replaces_it() {
    let (_dir, _m, api) = kit_node(json!({})).await;
    // The common pattern: re-arm a timeout on every message.
    for i in 0..30 {
        let r = set(
            &api,
            "a",
            json!({"name": "idle", "after": 500, "payload": {"i": i}}),
        )
        .await;
        assert_eq!(r.status, 200, "{}", r.json);
    }
    let listed = alarms(&api, "a").await;
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0]["payload"], json!({"i": 29}));
    assert_eq!(api.get("/v1/actors/kit/a").await.json["pending_alarms"], 1);
    let fired = wait_fired(&api, "a", 1).await;
    assert_eq!(fired[0]["payload"], json!({"i": 29}));
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(
        self::fired(&api, "a").await.len(),
        1,
        "fired more than once"
    );

    // A handler that re-sets its own alarm keeps it (its write wins over
    // the removal of the one-shot that just fired).
    set(
        &api,
        "b",
        json!({"name": "loop", "after": 50, "payload": {"rearm_after": 100}}),
    )
    .await;
    let fired = wait_fired(&api, "b", 3).await;
    assert!(fired.iter().all(|f| f["name"] == "loop"));
    assert_eq!(alarms(&api, "b").await.len(), 1);
    let r = api
        .op("kit", "b", json!({"op": "alarm_cancel", "name": "loop"}))
        .await;
    assert_eq!(r.json["existed"], true);
    let n = self::fired(&api, "b").await.len();
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(
        self::fired(&api, "b").await.len(),
        n,
        "cancelled, yet fired"
    );
}

#[tokio::test]
async fn bad_schedules_are_refused_and_change_nothing() {
    let config = "[alarms]\nmax_per_actor = 3\n";
    let dir = tempdir();
    let m = Marmot::start_opts(&dir.path().join("data"), &[], Some(config)).await;
    let api = m.client();
    api.deploy("kit", TESTKIT, json!({})).await;
    for (alarm, needle) in [
        (json!({"name": "c", "cron": "61 * * * *"}), "invalid cron"),
        (json!({"name": "c", "cron": "every day"}), "invalid cron"),
        (
            json!({"name": "c", "cron": "0 9 * * *", "tz": "Mars/Olympus"}),
            "unknown time zone",
        ),
        (json!({"name": "", "after": 10}), "alarm name"),
        (json!({"name": "a\nb", "after": 10}), "alarm name"),
    ] {
        let r = set(&api, "a", alarm.clone()).await;
        assert_eq!(r.status, 422, "{alarm}: {}", r.json);
        let msg = r.json["error"].as_str().unwrap();
        assert!(
            msg.starts_with("invalid: ") && msg.contains(needle),
            "{alarm}: {msg}"
        );
    }
    let big = "x".repeat(70 << 10);
    let r = set(
        &api,
        "a",
        json!({"name": "big", "after": 10, "payload": big}),
    )
    .await;
    assert_eq!(r.status, 422);
    assert!(r.json["error"].as_str().unwrap().contains("limit exceeded"));
    assert!(alarms(&api, "a").await.is_empty());

    // The per-actor limit counts distinct names; replacing one is fine.
    for name in ["x", "y", "z", "z"] {
        let r = set(&api, "a", json!({"name": name, "after": 60_000})).await;
        assert_eq!(r.status, 200, "{}", r.json);
    }
    let r = set(&api, "a", json!({"name": "w", "after": 60_000})).await;
    assert_eq!(r.status, 422);
    assert!(
        r.json["error"].as_str().unwrap().contains("at most 3"),
        "{}",
        r.json
    );
    assert_eq!(alarms(&api, "a").await.len(), 3);

    // Cron in a time zone is listed as given.
    let r = set(
        &api,
        "b",
        json!({"name": "digest", "cron": "0 9 * * 1-5", "tz": "Europe/Berlin"}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.json);
    let listed = alarms(&api, "b").await;
    assert_eq!(
        listed[0]["schedule"],
        json!({"cron": "0 9 * * 1-5", "tz": "Europe/Berlin"})
    );
    assert!(listed[0]["next_due_ms"].as_u64().unwrap() > now_ms());

    let r = api.get("/v1/actors/kit/nobody/alarms").await;
    assert_eq!(r.status, 404);
    assert_eq!(r.json["error"]["code"], "actor_not_found");
}

#[tokio::test]
async fn failing_alarms_retry_then_record_alarm_failed() {
    let config = "[alarms]\nretry_base_ms = 50\nmax_attempts = 3\n";
    let dir = tempdir();
    let m = Marmot::start_opts(&dir.path().join("data"), &[], Some(config)).await;
    let api = m.client();
    api.deploy("kit", TESTKIT, json!({})).await;
    set(
        &api,
        "a",
        json!({"name": "doomed", "after": 10, "payload": {"fail": true}}),
    )
    .await;
    let deadline = Instant::now() + Duration::from_secs(20);
    let failed = loop {
        let ev = api.get("/v1/actors/kit/a/events").await.json;
        if let Some(e) = ev["events"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["kind"] == "alarm_failed")
        {
            break e.clone();
        }
        assert!(Instant::now() < deadline, "no alarm_failed event: {ev}");
        tokio::time::sleep(Duration::from_millis(25)).await;
    };
    assert_eq!(failed["data"]["alarm"], "doomed");
    assert_eq!(failed["data"]["attempts"], 3);
    assert_eq!(failed["data"]["error"]["code"], "actor_error");
    assert!(
        failed["data"]["error"]["message"]
            .as_str()
            .unwrap()
            .contains("fails, as asked")
    );
    // Failed turns commit nothing; the given-up alarm is gone.
    assert!(fired(&api, "a").await.is_empty());
    assert!(alarms(&api, "a").await.is_empty());
    let text = String::from_utf8(api.get("/metrics").await.body).unwrap();
    assert_eq!(metric(&text, "marmot_alarms_failed_total"), 1.0, "{text}");
    let log = m.log_text();
    assert!(
        log.contains("alarm turn failed; will retry") && log.contains("doomed"),
        "the log names the alarm"
    );
}

#[tokio::test]
async fn an_alarm_due_while_the_node_is_down_fires_once_after_restart() {
    let dir = tempdir();
    let mut m = Marmot::start(&dir.path().join("data")).await;
    let api = m.client();
    api.deploy("kit", TESTKIT, json!({})).await;
    let r = set(&api, "a", json!({"name": "wake", "after": 700})).await;
    assert_eq!(r.status, 200);
    // The set was acknowledged, so it is durable: kill before it is due.
    m.kill9();
    tokio::time::sleep(Duration::from_millis(1000)).await;
    m.restart().await;
    let api = m.client();
    let fired = wait_fired(&api, "a", 1).await;
    assert_eq!(fired[0]["name"], "wake");
    assert!(fired[0]["now"].as_u64().unwrap() >= fired[0]["due_at"].as_u64().unwrap());
    // Once fired and committed it does not fire again, not even after
    // another crash.
    m.restart().await;
    let api = m.client();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(self::fired(&api, "a").await.len(), 1);
    assert!(alarms(&api, "a").await.is_empty());
}

#[tokio::test]
async fn a_crash_inside_an_alarm_turn_reruns_it_with_one_effect() {
    const MARKER: &str = "testkit-alarm-crash-0b3f";
    let dir = tempdir();
    let data = dir.path().join("data");
    let mut m = Marmot::start_with_env(&data, &[("MARMOT_FAULT_ABORT_ON_LOG", MARKER)]).await;
    let api = m.client();
    api.deploy("kit", TESTKIT, json!({})).await;
    set(
        &api,
        "a",
        json!({"name": "boom", "after": 100, "payload": {"log": MARKER}}),
    )
    .await;
    assert!(
        m.wait_exit(Duration::from_secs(20)),
        "the node should abort inside the alarm turn"
    );
    // Without the fault the re-run completes: the turn ran (at least) twice,
    // its effect landed once.
    m.set_env("MARMOT_FAULT_ABORT_ON_LOG", None);
    m.restart().await;
    let api = m.client();
    let fired = wait_fired(&api, "a", 1).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(self::fired(&api, "a").await.len(), 1, "{fired:?}");
    assert!(alarms(&api, "a").await.is_empty());
}

#[tokio::test]
async fn an_alarm_that_keeps_crashing_the_node_is_given_up() {
    const MARKER: &str = "testkit-alarm-poison-77c1";
    let dir = tempdir();
    let data = dir.path().join("data");
    let env = [("MARMOT_FAULT_ABORT_ON_LOG", MARKER)];
    let mut m = Marmot::start_with_env(&data, &env).await;
    let api = m.client();
    api.deploy("kit", TESTKIT, json!({})).await;
    set(
        &api,
        "a",
        json!({"name": "poison", "after": 50, "payload": {"log": MARKER}}),
    )
    .await;
    // The first run and three counted re-runs after restarts abort the
    // node; the fourth restart gives the occurrence up.
    for attempt in 0..4 {
        assert!(
            m.wait_exit(Duration::from_secs(20)),
            "attempt {attempt}: the poison alarm did not crash the node"
        );
        m.respawn();
    }
    m.wait_ready().await;
    let api = m.client();
    // The scheduler takes the overdue occurrence up after readiness, so
    // the give-up is recorded shortly after, not before.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let failed = loop {
        let ev = api.get("/v1/actors/kit/a/events").await.json;
        let found = ev["events"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["kind"] == "alarm_failed")
            .cloned();
        if let Some(f) = found {
            break f;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no alarm_failed event: {ev}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(failed["data"]["error"]["code"], "recovery_exhausted");
    assert!(alarms(&api, "a").await.is_empty());
    assert!(fired(&api, "a").await.is_empty());
}

#[tokio::test]
async fn missed_periodic_ticks_collapse_into_one() {
    let dir = tempdir();
    let mut m = Marmot::start(&dir.path().join("data")).await;
    let api = m.client();
    api.deploy("kit", TESTKIT, json!({})).await;
    let r = set(
        &api,
        "a",
        json!({"name": "minutely", "cron": "* * * * *", "payload": "tick"}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.json);
    let before = alarms(&api, "a").await[0]["next_due_ms"].as_u64().unwrap();
    // The node comes back 1,000 minutes later: a thousand ticks were missed.
    let offset = 1000 * 60_000;
    m.set_env("MARMOT_CLOCK_OFFSET_MS", Some(&offset.to_string()));
    let restarted_at = now_ms() + offset;
    m.restart().await;
    let api = m.client();
    let fired = wait_fired(&api, "a", 1).await;
    assert_eq!(fired[0]["due_at"], before, "the first missed tick runs");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    // Only ticks missed during the downtime count: a minute boundary
    // passing during the wait fires the next tick, as it should.
    let missed = self::fired(&api, "a")
        .await
        .iter()
        .filter(|f| f["due_at"].as_u64().unwrap() < restarted_at)
        .count();
    assert_eq!(missed, 1, "missed ticks must collapse into one run");
    let next = alarms(&api, "a").await[0]["next_due_ms"].as_u64().unwrap();
    let shifted_now = now_ms() + offset;
    assert!(
        next > shifted_now && next <= shifted_now + 60_000,
        "the schedule continues from now: next {next}, now {shifted_now}"
    );
}

#[tokio::test]
async fn a_handler_slower_than_its_period_never_overlaps_or_piles_up() {
    const BUSY_MS: u64 = 1200;
    let (_dir, _m, api) = kit_node(json!({})).await;
    let r = set(
        &api,
        "a",
        json!({"name": "every-second", "cron": "* * * * * *", "payload": {"busy_ms": BUSY_MS}}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.json);
    let fired = wait_fired(&api, "a", 3).await;
    for pair in fired.windows(2) {
        let (prev, next) = (&pair[0], &pair[1]);
        let prev_end = prev["now"].as_u64().unwrap() + BUSY_MS;
        let next_due = next["due_at"].as_u64().unwrap();
        // The next run is the first tick after the previous run ended
        // (give or take the commit): no overlap, and no backlog of the ticks
        // that passed meanwhile.
        assert!(
            next_due >= prev_end && next_due < prev_end + 1000 + 250,
            "prev ended {prev_end}, next due {next_due}: {fired:?}"
        );
        assert_eq!(next_due % 1000, 0, "cron ticks are whole seconds");
    }
    api.op(
        "kit",
        "a",
        json!({"op": "alarm_cancel", "name": "every-second"}),
    )
    .await;
}

#[tokio::test]
async fn overdue_alarms_after_a_restart_all_fire_with_bounded_concurrency() {
    const ACTORS: usize = 150;
    // More overdue alarms than the scheduler reads at once: the backlog is
    // read piece by piece as it drains, not one piece per periodic reload
    // (20 s each, which would outlast `wait_fired`'s 30 s).
    let config = "[alarms]\nconcurrency = 4\nreload_batch = 16\n";
    let dir = tempdir();
    let data = dir.path().join("data");
    let mut m = Marmot::start_opts(&data, &[], Some(config)).await;
    let api = m.client();
    api.deploy("kit", TESTKIT, json!({})).await;
    // The alarms fall due well after the node is killed, even on a slow
    // machine, so every one of them is overdue at the restart. (With a short
    // delay, some fired before the kill and the lag count below came short.)
    const AFTER_MS: u64 = 3000;
    // Each alarm turn stays busy this long, so turns running at once
    // overlap in time.
    const BUSY_MS: u64 = 100;
    let set_from = now_ms();
    let sets = (0..ACTORS).map(|i| {
        let api = api.clone();
        async move {
            set(
                &api,
                &format!("a{i}"),
                json!({"name": "t", "after": AFTER_MS, "payload": {"busy_ms": BUSY_MS}}),
            )
            .await
        }
    });
    for r in futures::future::join_all(sets).await {
        assert_eq!(r.status, 200);
    }
    assert!(
        now_ms() < set_from + AFTER_MS,
        "setting {ACTORS} alarms took longer than their delay"
    );
    m.kill9();
    let all_due = set_from + AFTER_MS + 300;
    tokio::time::sleep(Duration::from_millis(all_due.saturating_sub(now_ms()))).await;
    let restarted_at = now_ms();
    m.restart().await;
    let api = m.client();
    let mut starts = Vec::new();
    for i in 0..ACTORS {
        let fired = wait_fired(&api, &format!("a{i}"), 1).await;
        assert_eq!(fired.len(), 1);
        let start = fired[0]["now"].as_u64().unwrap();
        assert!(
            start >= restarted_at,
            "a{i} fired before the kill: {fired:?}"
        );
        starts.push(start);
    }
    // Spread, not stampeding: a turn holds its permit until its commit is
    // durable, so no more than `concurrency` handlers ever ran at once
    // (their start times are whole milliseconds: a few are allowed for
    // rounding).
    starts.sort_unstable();
    let most_at_once = starts
        .iter()
        .map(|&t| {
            starts
                .iter()
                .filter(|&&s| s <= t && t + 3 < s + BUSY_MS)
                .count()
        })
        .max()
        .unwrap();
    assert!(
        most_at_once <= 4,
        "{most_at_once} alarm turns ran at once with alarms.concurrency = 4"
    );
    let text = String::from_utf8(api.get("/metrics").await.body).unwrap();
    assert!(metric(&text, "marmot_alarm_lag_seconds_count") >= ACTORS as f64);
}

/// Guarantee 2 for alarms: a turn that fails sets, moves and cancels
/// nothing, however its alarm calls went.
#[tokio::test]
async fn a_failed_turn_sets_and_cancels_no_alarm() {
    let (_dir, _m, api) = kit_node(json!({})).await;
    let r = set(&api, "a", json!({"name": "kept", "after": 60_000})).await;
    assert_eq!(r.status, 200, "{}", r.json);
    // A turn that sets an alarm due at once, then fails.
    let r = set(
        &api,
        "a",
        json!({"name": "never", "after": 50, "fail": true}),
    )
    .await;
    assert_eq!(r.status, 500, "{}", r.json);
    // One that moves the pending alarm to now, then fails.
    let r = set(
        &api,
        "a",
        json!({"name": "kept", "after": 50, "fail": true}),
    )
    .await;
    assert_eq!(r.status, 500, "{}", r.json);
    // One that cancels it, then fails.
    let r = api
        .op(
            "kit",
            "a",
            json!({"op": "alarm_cancel", "name": "kept", "fail": true}),
        )
        .await;
    assert_eq!(r.status, 500, "{}", r.json);
    let listed = alarms(&api, "a").await;
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0]["name"], "kept");
    assert_eq!(listed[0]["schedule"], json!({"after": 60_000}));
    assert_eq!(api.get("/v1/actors/kit/a").await.json["pending_alarms"], 1);
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert!(
        fired(&api, "a").await.is_empty(),
        "an alarm of a failed turn fired"
    );
}

#[tokio::test]
async fn deleting_an_actor_removes_its_alarms() {
    let (_dir, _m, api) = kit_node(json!({})).await;
    let r = set(&api, "a", json!({"name": "t", "after": 300})).await;
    assert_eq!(r.status, 200, "{}", r.json);
    assert_eq!(alarms(&api, "a").await.len(), 1, "the alarm is pending");
    assert_eq!(api.delete("/v1/actors/kit/a").await.status, 200);
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert_eq!(
        api.get("/v1/actors/kit/a").await.status,
        404,
        "a deleted actor's alarm must not bring it back"
    );
    // A new actor of the same id starts without it: nothing pending, and
    // nothing fires into it.
    assert!(fired(&api, "a").await.is_empty());
    assert!(alarms(&api, "a").await.is_empty());
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(fired(&api, "a").await.is_empty(), "the old alarm fired");
}

#[tokio::test]
async fn the_notes_example_reminds_once_and_forgets_deleted_notes() {
    let (_dir, _m, api) = kit_node(json!({})).await;
    assert_eq!(api.deploy("notes", NOTES, json!({})).await.status, 201);
    for text in ["buy milk", "call bob"] {
        let r = api
            .post_json(
                "/v1/actors/notes/alice",
                &json!({"op": "add", "text": text}),
            )
            .await;
        assert_eq!(r.status, 200, "{}", r.json);
    }
    for id in [1, 2] {
        let r = api
            .post_json(
                "/v1/actors/notes/alice",
                &json!({"op": "remind", "id": id, "after_ms": 300}),
            )
            .await;
        assert_eq!(r.json["reminder"], format!("remind/{id}"));
    }
    let r = api
        .post_json(
            "/v1/actors/notes/alice",
            &json!({"op": "remind", "id": 9, "after_ms": 1}),
        )
        .await;
    assert_eq!(r.status, 404);
    // Deleting a note cancels its reminder in the same turn.
    api.post_json("/v1/actors/notes/alice", &json!({"op": "delete", "id": 2}))
        .await;
    let listed = api.get("/v1/actors/notes/alice/alarms").await.json;
    assert_eq!(listed["alarms"].as_array().unwrap().len(), 1, "{listed}");
    assert_eq!(listed["alarms"][0]["payload"], json!({"id": 1}));
    let deadline = Instant::now() + Duration::from_secs(20);
    let reminders = loop {
        let ev = api.get("/v1/actors/notes/alice/events").await.json;
        let reminders: Vec<Value> = ev["events"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["kind"] == "reminder")
            .cloned()
            .collect();
        if !reminders.is_empty() {
            break reminders;
        }
        assert!(Instant::now() < deadline, "no reminder: {ev}");
        tokio::time::sleep(Duration::from_millis(25)).await;
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    let ev = api.get("/v1/actors/notes/alice/events").await.json;
    let count = ev["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["kind"] == "reminder")
        .count();
    assert_eq!(count, 1, "{ev}");
    assert_eq!(reminders[0]["data"]["text"], "buy milk");
    assert!(reminders[0]["data"]["late_us"].as_i64().unwrap() >= 0);
}

const TIMER_JS: &str = r#"
import { state, alarms } from "marmot";

export default {
  onMessage(body) {
    if (body.op === "set") {
      alarms.set(body.name, body.spec);
      return { alarms: alarms.list().map((a) => a.name) };
    }
    if (body.op === "date") {
      alarms.set("dated", { at: new Date(Date.now() + 60000) });
      return alarms.list().find((a) => a.name === "dated").schedule;
    }
    return { fired: state.get("fired") ?? [] };
  },
  onAlarm(alarm, ctx) {
    const fired = state.get("fired") ?? [];
    fired.push({ name: alarm.name, payload: alarm.payload, late: Date.now() >= alarm.dueAt });
    state.set("fired", fired);
  },
};
"#;

#[tokio::test]
async fn javascript_actors_set_and_receive_alarms() {
    let (_dir, _m, api) = kit_node(json!({})).await;
    let r = api.deploy_js("timer", TIMER_JS).await;
    assert_eq!(r.status, 201, "{}", r.json);
    let r = api
        .post_json(
            "/v1/actors/timer/t",
            &json!({"op": "set", "name": "soon", "spec": {"after": 100, "payload": {"k": 1}}}),
        )
        .await;
    assert_eq!(r.json, json!({"alarms": ["soon"]}));
    let r = api
        .post_json(
            "/v1/actors/timer/t",
            &json!({"op": "set", "name": "bad", "spec": {"cron": "nope"}}),
        )
        .await;
    assert_eq!(r.status, 500);
    assert!(
        r.json["error"]["message"]
            .as_str()
            .unwrap()
            .contains("invalid cron"),
        "{}",
        r.json
    );
    // A schedule that is not one is refused, and sets nothing: a date
    // string for `at` used to become 0, an alarm that fired at once.
    for (name, spec, says) in [
        (
            json!("iso"),
            json!({"at": "2027-06-01T09:00:00Z"}),
            "`at` must be epoch milliseconds",
        ),
        (json!("neg"), json!({"after": -5}), "not -5"),
        (
            json!("far"),
            json!({"at": 1e20}),
            "not 100000000000000000000",
        ),
        // Now plus the delay must still be a date.
        (
            json!("later"),
            json!({"after": 8.64e15}),
            "`after` must be milliseconds (0 to ",
        ),
        (json!("words"), json!({"after": "1h"}), "not a string"),
        (json!("none"), json!({"after": null}), "not null"),
        (json!("obj"), json!({"after": {"ms": 5}}), "not an object"),
        (
            json!("two"),
            json!({"at": 1, "after": 2}),
            "exactly one of at, after or cron",
        ),
        (
            json!("none"),
            json!({"payload": 1}),
            "exactly one of at, after or cron",
        ),
        (
            json!("zoned"),
            json!({"after": 10, "tz": "UTC"}),
            "tz goes with cron",
        ),
        (json!(null), json!({"after": 10}), "name must be a string"),
        (
            json!("cronless"),
            json!({"cron": null}),
            "`cron` must be a string",
        ),
        (json!("cron5"), json!({"cron": 5}), "not a number"),
        (
            json!("tz5"),
            json!({"cron": "0 9 * * *", "tz": 5}),
            "`tz` must be a time zone name",
        ),
    ] {
        let r = api
            .post_json(
                "/v1/actors/timer/t",
                &json!({"op": "set", "name": name, "spec": spec}),
            )
            .await;
        assert_eq!(r.status, 500, "{spec}: {}", r.json);
        let message = r.json["error"]["message"].as_str().unwrap();
        assert!(message.contains(says), "{spec}: {message}");
    }
    // A module without `onAlarm` cannot set one (each firing failed, long
    // after the turn that set it).
    let no_handler = "import { alarms } from 'marmot';
        export default { onMessage() { alarms.set('x', { after: 100 }); return 'set'; } };";
    assert_eq!(api.deploy_js("deaf", no_handler).await.status, 201);
    let r = api.post_json("/v1/actors/deaf/d", &json!({})).await;
    assert_eq!(r.status, 500, "{}", r.json);
    let message = r.json["error"]["message"].as_str().unwrap();
    assert!(message.contains("no `onAlarm` handler"), "{message}");
    let pending = api.get("/v1/actors/timer/t/alarms").await.json;
    let names: Vec<_> = pending["alarms"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["name"].clone())
        .collect();
    // (`soon` may have fired by now.)
    assert!(names.iter().all(|n| n == "soon"), "{pending}");
    // A Date is an instant.
    let r = api
        .post_json("/v1/actors/timer/t", &json!({"op": "date"}))
        .await;
    let at = r.json["at"].as_u64().unwrap_or_default();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    assert!(at > now + 50_000 && at < now + 70_000, "{}", r.json);

    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let r = api.post_json("/v1/actors/timer/t", &json!({})).await;
        if let Some(f) = r.json["fired"].as_array().filter(|f| !f.is_empty()) {
            assert_eq!(
                f[0],
                json!({"name": "soon", "payload": {"k": 1}, "late": true})
            );
            break;
        }
        assert!(Instant::now() < deadline, "JS alarm never fired");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// The listing comes a page at a time: at most `limit`, and 8 MiB of
/// stored alarms, by name (1,000 alarms with 64 KiB payloads made one
/// 65 MB answer, built whole in memory for each reader: a probe); the CLI
/// follows the pages.
#[tokio::test]
async fn the_alarm_listing_comes_in_pages() {
    let (_dir, m, api) = kit_node(json!({})).await;
    let payload = "p".repeat(60_000);
    let mut names: Vec<String> = (0..150).map(|i| format!("a{i:03}")).collect();
    for name in &names {
        let r = set(
            &api,
            "a",
            json!({"name": name, "after": 3_600_000, "payload": payload}),
        )
        .await;
        assert_eq!(r.status, 200, "{}", r.json);
    }
    names.sort();
    let name = |a: &Value| a["name"].as_str().unwrap().to_owned();
    let (listed, pages) = all_pages(&api, "/v1/actors/kit/a/alarms", "alarms").await;
    let listed: Vec<String> = listed.iter().map(name).collect();
    assert!(pages >= 2, "one page held 9 MB of alarms");
    assert_eq!(listed, names, "each once, by name");
    let r = api.get("/v1/actors/kit/a/alarms?limit=5").await;
    let got: Vec<String> = r.json["alarms"]
        .as_array()
        .unwrap()
        .iter()
        .map(name)
        .collect();
    assert_eq!(got, names[..5]);
    assert_eq!(r.json["next_after"].as_str(), Some(names[4].as_str()));
    for bad in ["?limit=0", "?limit=abc", "?limit=-1", "?cursor=a001"] {
        let r = api.get(&format!("/v1/actors/kit/a/alarms{bad}")).await;
        assert_eq!(r.status, 400, "{bad}: {}", r.json);
    }

    let out = cli_ok(&m.url, None, &["alarms", "kit", "a"]);
    let printed: Value = serde_json::from_str(&out).unwrap();
    let printed: Vec<String> = printed["alarms"]
        .as_array()
        .unwrap()
        .iter()
        .map(name)
        .collect();
    assert_eq!(printed, names, "the CLI shows every page");
}
