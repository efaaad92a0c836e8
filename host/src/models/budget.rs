//! Model budgets: reserve before a call, settle after it, commit with the
//! turn.
//!
//! Each type (and each actor of it) has an account: what committed turns
//! spent (read from storage once, then kept in step by every commit), and
//! what is *held*: reservations of calls in flight plus what finished calls
//! spent in turns not committed yet. A call is admitted only if the
//! committed spend, everything held and its own reservation fit every
//! limit, under one lock, so concurrent calls of many actors can never
//! overspend together. The reservation is an upper bound of the call
//! (every prompt byte as a token, plus `max_output_tokens`); when the call
//! returns it is replaced by what the call used, and that moves from held
//! to committed when the turn's commit (which records the usage) is
//! durable. A failed turn's usage is committed on its own: the calls were
//! made and paid for.
//!
//! Lost on a crash: what turns in flight had spent but not committed, at
//! most one turn per actor.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::config::{Budget, Usd};
use crate::ids::ActorKey;
use crate::storage::schema::UsageRecord;
use crate::storage::{Storage, StorageError};

/// Tokens and dollars.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Spend {
    /// Prompt plus generated tokens.
    pub tokens: u64,
    /// Billionths of a dollar.
    pub nano_usd: u64,
}

impl Spend {
    /// `self + o`, saturating.
    pub fn plus(self, o: Spend) -> Spend {
        Spend {
            tokens: self.tokens.saturating_add(o.tokens),
            nano_usd: self.nano_usd.saturating_add(o.nano_usd),
        }
    }

    fn minus(self, o: Spend) -> Spend {
        Spend {
            tokens: self.tokens.saturating_sub(o.tokens),
            nano_usd: self.nano_usd.saturating_sub(o.nano_usd),
        }
    }

    /// What a usage record counts against budgets.
    pub fn of(u: &UsageRecord) -> Spend {
        Spend {
            tokens: u.input_tokens.saturating_add(u.output_tokens),
            nano_usd: u.cost_nano_usd,
        }
    }
}

#[derive(Debug, Default, Clone, Copy)]
struct Account {
    committed: Spend,
    held: Spend,
}

#[derive(Default)]
struct Accounts {
    types: HashMap<String, Account>,
    /// Only actors with something held: the rest are read from storage.
    actors: HashMap<ActorKey, Account>,
}

/// The node's budget ledger.
pub struct Ledger {
    storage: Arc<Storage>,
    accounts: Mutex<Accounts>,
}

/// A call admitted against a budget; give it back with [`Ledger::settle`]
/// or [`Ledger::release`]. Dropped unsettled (the call's future was
/// dropped: a turn timed out or trapped mid-call), it releases itself, so
/// no path leaves an amount held.
#[must_use]
pub struct Reservation {
    ledger: Arc<Ledger>,
    key: ActorKey,
    amount: Spend,
    settled: bool,
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if !self.settled {
            let amount = self.amount;
            self.ledger
                .adjust(&self.key, |acct| acct.held = acct.held.minus(amount));
        }
    }
}

/// A call that could exceed a limit.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("budget_exceeded: {0}")]
pub struct BudgetExceeded(pub String);

impl Ledger {
    /// A ledger over `storage`'s usage tables.
    pub fn new(storage: Arc<Storage>) -> Self {
        Self {
            storage,
            accounts: Mutex::new(Accounts::default()),
        }
    }

    /// Admit a call of `key` that may spend `amount`, or say which limit
    /// it could exceed.
    pub fn reserve(
        self: &Arc<Self>,
        key: &ActorKey,
        num: u64,
        budget: &Budget,
        amount: Spend,
    ) -> Result<Result<Reservation, BudgetExceeded>, StorageError> {
        // Read what storage holds under the lock: a commit that becomes
        // durable meanwhile moves its spend from `held` to storage and may
        // drop the actor's account, so a row read before locking could
        // miss it. Used only for accounts not in memory.
        let mut a = self.accounts.lock().expect("ledger lock");
        let (type_disk, actor_disk) = {
            let r = self.storage.reader()?;
            (r.type_usage(key.ty())?, r.actor_usage(num)?)
        };
        let ty = *a.types.entry(key.ty().to_owned()).or_insert(Account {
            committed: Spend::of(&type_disk),
            held: Spend::default(),
        });
        let actor = a.actors.get(key).copied().unwrap_or(Account {
            committed: Spend::of(&actor_disk),
            held: Spend::default(),
        });
        let checks = [
            ("the type", ty, budget.max_tokens, budget.max_cost_usd),
            (
                "this actor",
                actor,
                budget.actor_max_tokens,
                budget.actor_max_cost_usd,
            ),
        ];
        for (whose, acct, max_tokens, max_cost) in checks {
            let after = acct.committed.plus(acct.held).plus(amount);
            if let Some(max) = max_tokens
                && after.tokens > max
            {
                return Ok(Err(BudgetExceeded(format!(
                    "{whose} may use {max} tokens; {} are used or reserved and this call may use up to {}",
                    acct.committed.plus(acct.held).tokens,
                    amount.tokens
                ))));
            }
            if let Some(max) = max_cost
                && after.nano_usd > max.nano
            {
                return Ok(Err(BudgetExceeded(format!(
                    "{whose} may spend ${:.4}; ${:.4} is spent or reserved and this call may cost up to ${:.4}",
                    max.dollars(),
                    Usd::from_nano(acct.committed.plus(acct.held).nano_usd).dollars(),
                    Usd::from_nano(amount.nano_usd).dollars()
                ))));
            }
        }
        let ty_acct = a.types.get_mut(key.ty()).expect("inserted above");
        ty_acct.held = ty_acct.held.plus(amount);
        let actor_acct = a.actors.entry(key.clone()).or_insert(actor);
        actor_acct.held = actor_acct.held.plus(amount);
        Ok(Ok(Reservation {
            ledger: self.clone(),
            key: key.clone(),
            amount,
            settled: false,
        }))
    }

    /// The call returned having spent `actual` (still held until the
    /// turn's commit is durable).
    pub fn settle(&self, mut r: Reservation, actual: Spend) {
        r.settled = true;
        let amount = r.amount;
        self.adjust(&r.key, |acct| {
            acct.held = acct.held.minus(amount).plus(actual);
        });
    }

    /// The call failed before spending anything.
    pub fn release(&self, r: Reservation) {
        drop(r);
    }

    /// A commit recording `usage` of `key` is durable: it counts as
    /// committed, and `held` (the part of it settled in this ledger) is no
    /// longer held.
    pub fn committed(&self, key: &ActorKey, usage: &UsageRecord, held: Spend) {
        let spend = Spend::of(usage);
        self.adjust(key, |acct| {
            acct.held = acct.held.minus(held);
            acct.committed = acct.committed.plus(spend);
        });
    }

    /// Apply `f` to `key`'s account and its type's, forgetting the actor's
    /// once nothing is held (storage has the rest).
    fn adjust(&self, key: &ActorKey, f: impl Fn(&mut Account)) {
        let mut a = self.accounts.lock().expect("ledger lock");
        if let Some(t) = a.types.get_mut(key.ty()) {
            f(t);
        }
        if let Some(acct) = a.actors.get_mut(key) {
            f(acct);
            if acct.held == Spend::default() {
                a.actors.remove(key);
            }
        }
    }

    /// Forget a deleted type's account (its usage rows went with it).
    pub fn forget_type(&self, ty: &str) {
        self.accounts.lock().expect("ledger lock").types.remove(ty);
    }
}
