//! Model queries with their budget held before they are sent (the cells'
//! `model_query` and `model_query_batched`, and an agent loop's own turns).
//!
//! A query holds its reply's `max_tokens` plus its prompt's estimated
//! tokens (counted with the tokenizer `aggregate_context` uses), priced,
//! on every ledger it is charged to, before it is sent; one that does not
//! fit is never sent. The `max_tokens` sent is the one held. When the
//! reply comes, the usage it reports is charged within the hold, except a
//! prompt billed for more tokens than estimated (another tokenizer): that
//! is charged as reported, past the hold, so a tenant cannot spend past
//! its budget with text the estimate counts low; a usage
//! that is missing or not a sane count, or a query whose use cannot be
//! known (no answer in time, a reply too large or unreadable), is charged
//! the whole hold, and the call record says so.

use super::ledger::{Ask, Chain, Charged, Hold};
use super::policy::{BudgetError, Metered};
use crate::models::client::{estimate_prompt_tokens, ModelError, Query};
use crate::models::{ModelClient, ModelConfig, ModelReply};
use serde_json::{json, Value};

/// Reply tokens a query asks for when neither it nor its model's
/// `max_tokens` says: what is held for it before it is sent.
pub const DEFAULT_REPLY_TOKENS: u32 = 4096;

/// Bytes of prompts counted on the runtime's own thread; larger ones are
/// counted on a blocking thread.
const INLINE_ESTIMATE_BYTES: usize = 64 * 1024;

/// Why queries were not sent.
#[derive(Debug, thiserror::Error)]
pub(crate) enum PlanError {
    /// A budget does not have room for them.
    #[error(transparent)]
    Budget(#[from] BudgetError),
    /// The model is not configured (the caller's mistake: nothing charged).
    #[error(transparent)]
    Model(#[from] ModelError),
}

/// One query, ready to send, with what it holds.
#[derive(Debug)]
pub(crate) struct Planned {
    pub query: Query,
    pub hold: Hold,
    /// Its prompt's estimated tokens.
    pub estimate: u64,
}

/// The reply tokens a query of `config` asks for: `asked`, else the
/// model's `max_tokens`, else [`DEFAULT_REPLY_TOKENS`]; never more than
/// the model's `max_tokens`.
pub(crate) fn reply_tokens(config: &ModelConfig, asked: Option<u32>) -> u32 {
    let want = asked.or(config.max_tokens).unwrap_or(DEFAULT_REPLY_TOKENS);
    config.max_tokens.map_or(want, |m| want.min(m)).max(1)
}

fn price(config: &ModelConfig, input: u64, output: u64) -> f64 {
    ModelClient::cost(
        config,
        crate::models::TokenUsage {
            input_tokens: input,
            output_tokens: output,
        },
    )
    .unwrap_or(0.0)
}

async fn estimates(prompts: Vec<Vec<Value>>) -> (Vec<Vec<Value>>, Vec<u64>) {
    let bytes: usize = prompts
        .iter()
        .flatten()
        .map(|m| {
            m.get("content")
                .and_then(Value::as_str)
                .map_or(64, str::len)
        })
        .sum();
    let count = |prompts: Vec<Vec<Value>>| {
        let e = prompts.iter().map(|m| estimate_prompt_tokens(m)).collect();
        (prompts, e)
    };
    if bytes <= INLINE_ESTIMATE_BYTES {
        return count(prompts);
    }
    match tokio::task::spawn_blocking(move || count(prompts)).await {
        Ok(done) => done,
        // The counting thread failed: every byte counted as a token, more
        // than any tokenizer makes of it.
        Err(_) => (Vec::new(), vec![bytes as u64]),
    }
}

/// Hold the budget of one query per prompt on `chain`, all or none, and
/// build the queries. A single query (`fit`) asks for no more reply tokens
/// than are left (and no more than the cost left pays for); queries of a
/// batch ask for what they asked, and a batch that does not fit whole is
/// refused whole.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn plan(
    chain: &Chain,
    client: &ModelClient,
    model: Option<&str>,
    prompts: Vec<Vec<Value>>,
    asked: Option<u32>,
    temperature: Option<f64>,
    kind: Metered,
    fit: bool,
) -> Result<Vec<Planned>, PlanError> {
    let (_, config) = client.config(model)?;
    let config = config.clone();
    let n = prompts.len();
    let (prompts, estimates) = estimates(prompts).await;
    if prompts.len() != n {
        return Err(PlanError::Budget(BudgetError::Exhausted {
            budget: "max_total_tokens",
            detail: "the prompts could not be counted".into(),
        }));
    }
    let mut reply = reply_tokens(&config, asked);
    if fit {
        let est = estimates.first().copied().unwrap_or(0);
        let left = chain.tokens_left();
        if est >= left {
            return Err(PlanError::Budget(BudgetError::Exhausted {
                budget: "max_total_tokens",
                detail: format!(
                    "the prompt is estimated at {est} tokens and {left} are left, none for a reply"
                ),
            }));
        }
        reply = reply.min(u32::try_from(left - est).unwrap_or(u32::MAX));
        let per_output = price(&config, 0, 1);
        if let (Some(cost_left), true) = (chain.cost_left(), per_output > 0.0) {
            let for_reply = cost_left - price(&config, est, 0);
            let affordable = (for_reply / per_output).floor();
            if affordable < 1.0 {
                return Err(PlanError::Budget(BudgetError::Exhausted {
                    budget: "max_cost",
                    detail: format!(
                        "{cost_left:.6} is left; the prompt alone costs {:.6}, leaving nothing \
                         for a reply",
                        price(&config, est, 0)
                    ),
                }));
            }
            if affordable < f64::from(reply) {
                reply = affordable as u32;
            }
        }
    }
    let calls = u32::try_from(n).unwrap_or(u32::MAX);
    let asks: Vec<Ask> = estimates
        .iter()
        .enumerate()
        .map(|(i, est)| Ask {
            // The batch's calls are counted with its first item.
            calls: (i == 0).then_some((kind, calls)),
            tokens: est.saturating_add(reply.into()),
            cost: price(&config, *est, reply.into()),
        })
        .collect();
    let holds = chain.hold_all(&asks)?;
    Ok(prompts
        .into_iter()
        .zip(holds)
        .zip(estimates)
        .map(|((messages, hold), estimate)| Planned {
            query: Query {
                model: model.map(str::to_owned),
                messages,
                max_tokens: Some(reply),
                temperature,
                shared_bytes: None,
            },
            hold,
            estimate,
        })
        .collect())
}

/// What a query was charged, and why, for its record.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Settled {
    pub charged: Charged,
    pub held_tokens: u64,
    /// Set when the whole hold was charged, or less than reported.
    pub note: Option<String>,
}

impl Settled {
    /// The record's fields about the charge.
    pub(crate) fn detail(&self) -> Value {
        let mut v = json!({"charged": self.charged, "held_tokens": self.held_tokens});
        if let Some(n) = &self.note {
            v["usage_note"] = json!(n);
        }
        v
    }
}

/// Settle what `planned` held by how its query went.
pub(crate) fn settle<E>(
    hold: Hold,
    estimate: u64,
    config: &ModelConfig,
    outcome: &Result<ModelReply, E>,
    whole: impl Fn(&E) -> Option<String>,
) -> Settled {
    let held = hold.tokens();
    let whole_note = |why: &str| format!("{why}: the {held} tokens held were charged");
    match outcome {
        Ok(r) => match &r.usage_problem {
            None => {
                let (input, output) = (r.usage.input_tokens, r.usage.output_tokens);
                // An endpoint whose tokenizer is not the estimate's bills
                // a prompt the estimate counted low for more than was
                // held: that was spent, and is charged as reported (the
                // reply itself never past the `max_tokens` it asked).
                let reply = output.min(held.saturating_sub(estimate));
                if input.saturating_add(reply) > held {
                    let cost = price(config, input, reply);
                    return Settled {
                        charged: hold.settle_past(input, reply, cost),
                        held_tokens: held,
                        note: Some(format!(
                            "the prompt was billed {input} tokens, more than the {estimate} \
                             estimated: the {} reported were charged, past the {held} held",
                            input.saturating_add(reply)
                        )),
                    };
                }
                let cost = price(config, input, output);
                let note = if r.usage.total() > held {
                    Some(format!(
                        "the reply reported {} tokens, more than the {held} held: the {held} \
                         held were charged",
                        r.usage.total()
                    ))
                } else if cost > hold.cost() {
                    Some(format!(
                        "the reply's usage costs {cost:.6}, more than the {:.6} held: that \
                         was charged",
                        hold.cost()
                    ))
                } else {
                    None
                };
                let charged = hold.settle(input, output, cost);
                Settled {
                    charged,
                    held_tokens: held,
                    note,
                }
            }
            Some(p) => Settled {
                charged: hold.settle_whole(estimate),
                held_tokens: held,
                note: Some(whole_note(p)),
            },
        },
        Err(e) => match whole(e) {
            Some(why) => Settled {
                charged: hold.settle_whole(estimate),
                held_tokens: held,
                note: Some(whole_note(&why)),
            },
            None => {
                drop(hold);
                Settled {
                    charged: Charged::default(),
                    held_tokens: held,
                    note: None,
                }
            }
        },
    }
}

/// Whether a failed query may have been answered (and billed) all the
/// same: then its whole hold is charged. A refused request (an HTTP error
/// status, no connection) was not.
pub(crate) fn maybe_billed(e: &ModelError) -> Option<String> {
    match e {
        ModelError::Timeout { .. } => Some("no answer came in time, so its use is unknown".into()),
        ModelError::TooLarge { .. } => Some("the reply was too large to read".into()),
        ModelError::Malformed { .. } => Some("the reply could not be read".into()),
        ModelError::Status { .. }
        | ModelError::Connect { .. }
        | ModelError::UnknownModel { .. }
        | ModelError::NoModels => None,
    }
}
