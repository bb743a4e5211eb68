//! Budgets held before they are spent: a batch holds every item's tokens
//! before any is sent, a reply's usage is believed only when it is a sane
//! count (else the whole hold is charged, and the record says so), a huge
//! prompt is counted before it is sent, and queries running at once on a
//! shared budget (sub-agents of two sessions of one account) never
//! together pass it. Each attack has its control: the same call where the
//! budget has room, or without the shared ledger.

use super::common::fake_model::{FakeModel, Reply};
use super::common::*;
use cellbox::models::{ModelClient, ModelConfig, ModelsSection};
use cellbox::{Account, Caps, Chain, Ledger, Owner, SessionConfig, Status, Supervisor};
use serde_json::Value;
use std::sync::Arc;
use std::time::Duration;

fn models(url: &str) -> ModelsSection {
    let mut s = ModelsSection::new();
    s.insert(
        "fake".into(),
        ModelConfig {
            endpoint: url.to_owned(),
            model: "fake-1".into(),
            api_key_env: None,
            timeout_seconds: 30,
            max_attempts: 1,
            backoff_ms: 10,
            max_tokens: None,
            input_price: None,
            output_price: None,
            default: false,
        },
    );
    s
}

fn sup(url: &str) -> Supervisor {
    Supervisor::builder()
        .worker_exe(bin())
        .models(ModelClient::new(&models(url)).unwrap())
        .unwrap()
        .build()
        .unwrap()
}

fn with_models(tweak: impl FnOnce(&mut SessionConfig)) -> SessionConfig {
    let mut c = config(&[
        "model_query",
        "model_query_batched",
        "agent_query",
        "answer",
    ]);
    tweak(&mut c);
    c
}

fn error_text(r: &cellbox::CellResult) -> String {
    r.error
        .as_ref()
        .map(|e| format!("{}: {}", e.kind, e.message))
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_holds_every_item_first_and_is_refused_whole_when_they_do_not_fit() {
    let fake = FakeModel::start(vec![]);
    let sup = sup(&fake.url);
    // Each item holds its prompt (9 tokens) and its 3000 reply tokens:
    // four need 12036 of 10000. Nothing is sent; the cell ends there.
    let s = sup
        .session(with_models(|c| c.policy.max_total_tokens = 10_000))
        .unwrap();
    let r = py_in(
        &s,
        "llm_query_batched(['a', 'b', 'c', 'd'], max_tokens=3000)",
    )
    .await;
    assert_eq!(r.status, Status::LimitExceeded, "{r:?}");
    assert!(
        error_text(&r)
            .contains("max_total_tokens exhausted: 0 tokens used, 12036 more asked, of 10000"),
        "{r:?}"
    );
    assert_eq!(fake.seen().len(), 0, "an item of a refused batch was sent");
    let used = s.model_usage();
    assert_eq!((used.model_calls, used.total_tokens()), (0, 0));
    // Control: three fit (9027), are sent with the max_tokens they hold,
    // and are charged what they report (15 each), not what they held.
    let r = py_in(&s, "llm_query_batched(['a', 'b', 'c'], max_tokens=3000)").await;
    assert_eq!(r.status, Status::Ok, "{r:?}");
    let seen = fake.seen();
    assert_eq!(seen.len(), 3);
    assert!(
        seen.iter().all(|s| s.body["max_tokens"] == 3000),
        "{seen:?}"
    );
    assert_eq!(s.model_usage().total_tokens(), 45);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_huge_prompt_is_counted_before_it_is_sent() {
    let fake = FakeModel::start(vec![]);
    let sup = sup(&fake.url);
    // About 40000 tokens of prompt against 20000: refused unsent.
    let code = "model_query('word ' * 40000, max_tokens=10)";
    let s = sup
        .session(with_models(|c| c.policy.max_total_tokens = 20_000))
        .unwrap();
    let r = py_in(&s, code).await;
    assert_eq!(r.status, Status::LimitExceeded, "{r:?}");
    assert!(
        error_text(&r).contains("the prompt is estimated at 4000"),
        "{r:?}"
    );
    assert!(fake.seen().is_empty());
    // Control: with room for it, it is sent.
    let s = sup
        .session(with_models(|c| c.policy.max_total_tokens = 100_000))
        .unwrap();
    let r = py_in(&s, code).await;
    assert_eq!(r.status, Status::Ok, "{r:?}");
    assert_eq!(fake.seen().len(), 1);
}

/// A completion whose usage is `usage` (JSON text, or "" for none).
fn completion(usage: &str) -> String {
    let usage = if usage.is_empty() {
        String::new()
    } else {
        format!(",\"usage\":{usage}")
    };
    format!(r#"{{"choices":[{{"message":{{"role":"assistant","content":"ok"}}}}]{usage}}}"#)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_whose_usage_is_not_a_sane_count_is_charged_what_it_held() {
    let bad = [
        ("", "the reply reported no usage"),
        (
            r#"{"prompt_tokens":-50,"completion_tokens":-50}"#,
            "usage.prompt_tokens is -50, not a non-negative integer",
        ),
        (
            r#"{"prompt_tokens":0.5,"completion_tokens":0.5}"#,
            "usage.prompt_tokens is 0.5, not a non-negative integer",
        ),
        (
            r#"{"prompt_tokens":1,"completion_tokens":1e30}"#,
            "usage.completion_tokens is 1e+30, not a non-negative integer",
        ),
        (
            r#"{"prompt_tokens":1,"completion_tokens":999999999999}"#,
            "usage.completion_tokens is 999999999999, more than any one query uses",
        ),
        (
            r#"{"prompt_tokens":"0","completion_tokens":"0"}"#,
            "usage.prompt_tokens is \"0\", not a number",
        ),
        (r#"{"total_tokens":0}"#, "usage.prompt_tokens is missing"),
    ];
    let fake = FakeModel::start(
        bad.iter()
            .map(|(u, _)| Reply::Raw(completion(u)))
            .chain([Reply::Raw(completion(
                r#"{"prompt_tokens":3,"completion_tokens":4}"#,
            ))])
            .collect(),
    );
    let sup = sup(&fake.url);
    for (usage, problem) in bad {
        let s = sup.session(with_models(|_| {})).unwrap();
        let r = py_in(&s, "llm_query('q', max_tokens=100)").await;
        assert_eq!(r.status, Status::Ok, "{usage}: {r:?}");
        // The prompt's 9 estimated tokens and the 100 it asked for.
        assert_eq!(s.model_usage().total_tokens(), 109, "{usage}");
        let detail = r.calls[0].detail.clone().unwrap_or(Value::Null);
        let note = detail["usage_note"].as_str().unwrap_or_default();
        assert!(
            note.contains(problem) && note.contains("the 109 tokens held were charged"),
            "{usage}: {detail}"
        );
    }
    // Control: a sane usage is charged as reported, with no note.
    let s = sup.session(with_models(|_| {})).unwrap();
    let r = py_in(&s, "llm_query('q', max_tokens=100)").await;
    assert_eq!(r.status, Status::Ok, "{r:?}");
    assert_eq!(s.model_usage().total_tokens(), 7);
    let detail = r.calls[0].detail.clone().unwrap_or(Value::Null);
    assert!(detail.get("usage_note").is_none(), "{detail}");
    assert_eq!(detail["charged"]["output_tokens"], 4, "{detail}");
}

/// Two sessions whose cells each start a sub-agent at the same moment;
/// each sub-agent's one turn reports 100 + 3000 tokens. Returns the
/// tokens both sessions' ledgers were charged, and the most queries the
/// endpoint had in flight at once.
async fn two_sub_agents_at_once(account: impl Fn() -> cellbox::Account) -> (u64, usize) {
    let fake = FakeModel::start(vec![]);
    fake.otherwise(Reply::Delayed(
        Box::new(Reply::Text(
            "```python\nanswer('done')\n```".into(),
            100,
            3000,
        )),
        Duration::from_millis(500),
    ));
    let sup = sup(&fake.url);
    let mk = || sup.session(with_models(|c| c.account = account())).unwrap();
    let (a, b) = (mk(), mk());
    let code = "try:\n    r = agent_query('t')\nexcept RuntimeError as e:\n    r = str(e)\nr";
    let (ra, rb) = tokio::join!(py_in(&a, code), py_in(&b, code));
    for r in [&ra, &rb] {
        assert!(
            matches!(r.status, Status::Ok | Status::LimitExceeded),
            "{r:?}"
        );
    }
    let spent = a.model_usage().total_tokens() + b.model_usage().total_tokens();
    (spent, fake.max_in_flight())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sub_agents_running_at_once_never_pass_a_budget_they_share() {
    // One account of 6000 tokens for both sessions: the first sub-agent's
    // turn holds its prompt and 4096 reply tokens before it is sent, the
    // second only what is left, so what both are charged stays within it.
    let shared = Arc::new(Ledger::new(
        Owner::Principal("tenant".into()),
        Caps {
            total_tokens: Some(6000),
            ..Caps::default()
        },
        None,
    ));
    let (spent, in_flight) = two_sub_agents_at_once(|| Account {
        chain: Chain::new(vec![shared.clone()]),
        tenant: Some(cellbox::Tenant::new(
            "tenant",
            false,
            cellbox::DEFAULT_MAX_HELD_BYTES_PER_TENANT,
        )),
    })
    .await;
    assert!(spent <= 6000, "the sub-agents spent {spent} of 6000");
    assert_eq!(shared.used().total_tokens(), spent);
    assert_eq!(in_flight, 2, "the two sub-agents did not run at once");
    // Control: each session on its own budget only, the same two
    // sub-agents spend what they report, past 6000.
    let (spent, _) = two_sub_agents_at_once(cellbox::Account::default).await;
    assert_eq!(spent, 6200);
}
