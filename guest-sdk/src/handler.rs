use crate::bindings::marmot::actor::types as wit;
use crate::{Message, Reply, Result};

/// Who is running and why; passed to every handler.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Context {
    /// The actor type.
    pub actor_type: String,
    /// The actor id.
    pub id: String,
    /// The version of the code running this turn.
    pub version: u32,
    /// Unique id of the delivery that started this turn.
    pub turn_id: String,
}

/// A durable wake-up that became due.
#[derive(Debug, Clone)]
pub struct Alarm {
    /// The alarm's name.
    pub name: String,
    /// The payload given when it was set.
    pub payload: Vec<u8>,
    /// When it was due, in milliseconds since the Unix epoch.
    pub due_at: u64,
}

/// A verified inbound webhook.
#[derive(Debug, Clone)]
pub struct Webhook {
    /// The hook name from the URL.
    pub name: String,
    /// Request headers with lowercase names.
    pub headers: Vec<(String, String)>,
    /// The raw body.
    pub body: Vec<u8>,
}

/// An answered (or expired) input request.
#[derive(Debug, Clone)]
pub struct InputAnswer {
    /// The input id returned when it was requested.
    pub id: String,
    /// The kind given when it was requested.
    pub kind: String,
    /// The answer, usually JSON; empty when expired.
    pub response: Vec<u8>,
    /// Whether the request expired unanswered.
    pub expired: bool,
}

impl InputAnswer {
    /// The answer parsed from JSON (answers are always JSON).
    pub fn json<T: serde::de::DeserializeOwned>(&self) -> Result<T> {
        Ok(serde_json::from_slice(&self.response)?)
    }
}

/// An actor: one handler per kind of turn.
///
/// Only [`on_message`](Actor::on_message) is required. The other handlers
/// default to failing the turn (for deliveries the actor did not expect) or,
/// for [`on_upgrade`](Actor::on_upgrade), to doing nothing.
pub trait Actor {
    /// Handle a message and produce the reply.
    fn on_message(ctx: &Context, msg: Message) -> Result<Reply>;

    /// Handle an alarm that became due.
    fn on_alarm(ctx: &Context, alarm: Alarm) -> Result<()> {
        let _ = ctx;
        Err(format!("actor has no alarm handler (alarm `{}`)", alarm.name).into())
    }

    /// Handle a verified webhook.
    fn on_webhook(ctx: &Context, req: Webhook) -> Result<()> {
        let _ = ctx;
        Err(format!("actor has no webhook handler (hook `{}`)", req.name).into())
    }

    /// Handle an answered or expired input request.
    fn on_input(ctx: &Context, input: InputAnswer) -> Result<()> {
        let _ = ctx;
        Err(format!("actor has no input handler (input `{}`)", input.id).into())
    }

    /// Migrate state written by `from_version` of this type. Runs once per
    /// actor per upgrade, before the first turn on the new version.
    fn on_upgrade(ctx: &Context, from_version: u32) -> Result<()> {
        let _ = (ctx, from_version);
        Ok(())
    }
}

/// Glue between the generated exports and [`Actor`]; used by [`export_actor!`](crate::export_actor).
#[doc(hidden)]
pub mod dispatch {
    use super::*;

    fn ctx(c: wit::Context) -> Context {
        Context {
            actor_type: c.actor_type,
            id: c.id,
            version: c.version,
            turn_id: c.turn_id,
        }
    }

    fn err(e: crate::Error) -> String {
        e.message().to_owned()
    }

    pub fn on_message<A: Actor>(c: wit::Context, m: wit::Message) -> Result<wit::Reply, String> {
        A::on_message(&ctx(c), m.into())
            .map(Into::into)
            .map_err(err)
    }

    pub fn on_alarm<A: Actor>(c: wit::Context, a: wit::Alarm) -> Result<(), String> {
        let alarm = Alarm {
            name: a.name,
            payload: a.payload,
            due_at: a.due_at,
        };
        A::on_alarm(&ctx(c), alarm).map_err(err)
    }

    pub fn on_webhook<A: Actor>(c: wit::Context, w: wit::Webhook) -> Result<(), String> {
        let hook = Webhook {
            name: w.name,
            headers: w.headers,
            body: w.body,
        };
        A::on_webhook(&ctx(c), hook).map_err(err)
    }

    pub fn on_input<A: Actor>(c: wit::Context, i: wit::InputAnswer) -> Result<(), String> {
        let input = InputAnswer {
            id: i.id,
            kind: i.kind,
            response: i.response,
            expired: i.expired,
        };
        A::on_input(&ctx(c), input).map_err(err)
    }

    pub fn on_upgrade<A: Actor>(c: wit::Context, from: u32) -> Result<(), String> {
        A::on_upgrade(&ctx(c), from).map_err(err)
    }
}
