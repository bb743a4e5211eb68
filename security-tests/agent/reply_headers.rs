//! A hostile model endpoint answering around its body: the request's key
//! reflected in response headers (`Set-Cookie`, `WWW-Authenticate`, a
//! header of its own) of a success and of a 401, a redirect to another
//! host carrying the key in its `Location`, a streamed (`text/event-stream`)
//! reply whose chunks hold the key; and replies too large or too slow to
//! read, which must be bounded and still charged.
//!
//! `model_reply_headers`. Control: the endpoint is shown to have received
//! the key as its bearer token in every request and to have sent it back
//! in each of those places; the other host of the redirect is shown to
//! record what reaches it (a request the test makes itself); the reply's
//! marker reached the client. Defence: the client's result, the events
//! file and the log hold no run of the key (see `harness::leaks`), and
//! the other host got no request from the supervisor.
//!
//! `model_reply_flood`. Control: the endpoint writes up to 256 MiB per
//! reply (a batch of six such replies, and an http tool's answer), and a
//! 10-byte-a-second one; a
//! plain query passes before them. Defence: the supervisor stops reading
//! each (its peak memory grows by less than 64 MiB while the endpoint's
//! replies would have held 1.5 GiB), the errors name the limit and the
//! timeout, and what the unread replies held is charged: the cell's usage
//! counts at least the 700 tokens the seven queries asked for.

use super::harness::{completion, marker, python, AgentServe, Seen};
use super::wire::{bearer, peak_rss, Reply, Wire};
use super::{Env, Outcome};
use std::sync::Arc;
use std::time::Duration;

fn config(endpoint: &str, extra: &str) -> String {
    format!(
        r#"
[server]
languages = ["python"]
[models.m]
endpoint = "{endpoint}/v1"
model = "x"
api_key_env = "CB_MODEL_KEY"
max_attempts = 1
{extra}
[policy]
allow = ["model_query", "model_query_batched"]
"#
    )
}

/// A prompt's mode: the text after `mode=` in the request body.
fn mode(seen: &Seen) -> String {
    seen.body
        .split("mode=")
        .nth(1)
        .map(|r| {
            r.chars()
                .take_while(|c| c.is_ascii_alphanumeric())
                .collect()
        })
        .unwrap_or_default()
}

pub fn model_reply_headers(env: &Env) -> Result<Outcome, String> {
    let key = format!("sk-{}+{}/x", marker(""), marker(""));
    let mark = marker("MARK-");
    let other = Wire::start(Arc::new(|_| Reply::Whole {
        status: "200 OK",
        headers: vec!["Content-Type: application/json".into()],
        body: completion("other host"),
    }))?;
    let other_url = other.url.clone();
    let m = mark.clone();
    let wire = Wire::start(Arc::new(move |seen| {
        let k = bearer(seen);
        match mode(seen).as_str() {
            "headers" => Reply::Whole {
                status: "200 OK",
                headers: vec![
                    "Content-Type: application/json".into(),
                    format!("X-Echo-Authorization: Bearer {k}"),
                    format!("Set-Cookie: key={k}"),
                    format!("WWW-Authenticate: Bearer realm=\"{k}\""),
                ],
                body: completion(&format!("{m} headers")),
            },
            "unauthorized" => Reply::Whole {
                status: "401 Unauthorized",
                headers: vec![
                    "Content-Type: application/json".into(),
                    format!("WWW-Authenticate: Bearer error=\"invalid_token\", key=\"{k}\""),
                    format!("X-Echo-Authorization: Bearer {k}"),
                ],
                body: "{\"error\": \"bad key\"}".into(),
            },
            "redirect" => Reply::Whole {
                status: "307 Temporary Redirect",
                headers: vec![
                    format!("Location: {other_url}/v1/chat/completions?key={k}"),
                    "Content-Type: text/plain".into(),
                ],
                body: "moved".into(),
            },
            "moved" => Reply::Whole {
                status: "301 Moved Permanently",
                headers: vec![format!("Location: {other_url}/steal?k={k}")],
                body: String::new(),
            },
            "stream" => {
                let chunk = |t: &str| {
                    format!(
                        "data: {}\n\n",
                        serde_json::json!({"choices": [{"index": 0, "delta": {"content": t}}]})
                    )
                };
                Reply::Whole {
                    status: "200 OK",
                    headers: vec!["Content-Type: text/event-stream".into()],
                    body: format!(
                        "{}{}{}data: [DONE]\n\n",
                        chunk(&m),
                        chunk(&k[..10]),
                        chunk(&k[10..])
                    ),
                }
            }
            _ => Reply::Whole {
                status: "200 OK",
                headers: vec!["Content-Type: application/json".into()],
                body: completion("?"),
            },
        }
    }))?;
    let serve = AgentServe::start(env, &config(&wire.url, ""), &[("CB_MODEL_KEY", &key)])?;
    let client = serve.client(env)?;
    let code = "for m in ['headers', 'unauthorized', 'redirect', 'moved', 'stream']:\n    \
                try:\n        print(m, 'ok', model_query('mode=' + m))\n    \
                except Exception as e:\n        print(m, 'error', e)\n";
    let a = env.block_on("cell", python(&client, None, code, 60))?;
    let text = a.all_text();
    let seen = wire.seen();
    let keyed = seen.iter().filter(|s| bearer(s) == key).count();
    if keyed < 5 || !text.contains(&mark) || !text.contains("401") || !text.contains("307") {
        return Err(format!(
            "the endpoint got the key in {keyed} of 5 requests, or its answers did not reach \
             the client: {text}"
        ));
    }
    // The other host records what reaches it.
    {
        use std::io::Write;
        let addr = other.url.trim_start_matches("http://");
        let mut s = std::net::TcpStream::connect(addr).map_err(|e| e.to_string())?;
        s.write_all(b"GET /probe HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
            .map_err(|e| e.to_string())?;
        let t0 = std::time::Instant::now();
        while !other.seen().iter().any(|r| r.path == "/probe") {
            if t0.elapsed() > Duration::from_secs(10) {
                return Err("the other host records nothing".into());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    let followed: Vec<String> = other
        .seen()
        .iter()
        .filter(|r| r.path != "/probe")
        .map(|r| format!("{} (bearer {:?})", r.path, bearer(r)))
        .collect();
    let mut problems = serve.leaks(&text, &[key]);
    if !followed.is_empty() {
        problems.push(format!("a redirect was followed: {followed:?}"));
    }
    Ok(Outcome {
        control: "the endpoint received the key in all five requests and sent it back in \
                  response headers of a 200 and a 401, in the Location of a 307 and a 301 to \
                  another host (which records what reaches it), and in the chunks of a streamed \
                  reply; the 200's marker reached the client"
            .into(),
        blocked: problems.is_empty(),
        evidence: if problems.is_empty() {
            "no header, Location or streamed chunk brought the key to the client, the events \
             or the log, and no redirect was followed"
                .into()
        } else {
            problems.join("; ")
        },
    })
}

pub fn model_reply_flood(env: &Env) -> Result<Outcome, String> {
    const TOTAL: u64 = 256 << 20;
    let wire = Wire::start(Arc::new(|seen| match mode(seen).as_str() {
        _ if seen.path == "/tool" => Reply::Flood {
            piece: "y".repeat(64 << 10),
            total: TOTAL,
            pause: Duration::ZERO,
        },
        "big" => Reply::Flood {
            piece: "x".repeat(64 << 10),
            total: TOTAL,
            pause: Duration::ZERO,
        },
        "slow" => Reply::Flood {
            piece: "x".into(),
            total: 1 << 20,
            pause: Duration::from_millis(100),
        },
        _ => Reply::Whole {
            status: "200 OK",
            headers: vec!["Content-Type: application/json".into()],
            body: completion("fine"),
        },
    }))?;
    let serve = AgentServe::start(
        env,
        &config(
            &wire.url,
            &format!(
                "timeout_seconds = 3\n[tools.big]\nkind = \"http\"\ndescription = \"a flood\"\n\
                 url = \"{}/tool\"\n[policy]\nmax_total_tokens = 100000\nmax_model_calls = 100",
                wire.url
            ),
        )
        .replace("\n[policy]\nallow = [", "\nallow = [\"big\", "),
        &[("CB_MODEL_KEY", "sk-unused-key-0123456789")],
    )?;
    let client = serve.client(env)?;
    let go =
        "def go(f):\n    try:\n        return ('ok', f())\n    except Exception as e:\n        \
              return ('error', str(e))\n";
    // A first query (the prompt tokenizer loads with it), then the floods
    // in a cell of their own, the peak memory taken between.
    let warm = env.block_on(
        "first",
        python(
            &client,
            None,
            &format!("{go}print('first', go(lambda: model_query('mode=fine', max_tokens=300)))"),
            50,
        ),
    )?;
    let before = peak_rss(serve.pid())?;
    let code = format!(
        "{go}print('batch', go(lambda: model_query_batched(['mode=big'] * 6, max_tokens=100)))\n\
         print('slow', go(lambda: model_query('mode=slow', max_tokens=100)))\n\
         print('tool', go(lambda: tools.big()))\n"
    );
    let a = env.block_on("cell", python(&client, None, &code, 50))?;
    let after = peak_rss(serve.pid())?;
    let out = a.all_text();
    let line = |name: &str| {
        a.stdout()
            .lines()
            .find(|l| l.starts_with(name))
            .unwrap_or_default()
            .to_owned()
    };
    let (batch, slow, tool) = (line("batch"), line("slow"), line("tool"));
    let big_asked = wire.seen().iter().filter(|s| mode(s) == "big").count();
    if !warm.stdout().contains("'ok'")
        || big_asked != 6
        || wire.seen().iter().all(|s| mode(s) != "slow")
    {
        return Err(format!(
            "the first query failed or the floods were not asked for ({big_asked} of 6): {} {out}",
            warm.all_text()
        ));
    }
    // What the cell's unread replies were charged: 7 queries of 100
    // tokens and their prompts.
    let used = a
        .structured
        .as_ref()
        .map(|v| &v["models"]["cell"])
        .map(|c| c["input_tokens"].as_u64().unwrap_or(0) + c["output_tokens"].as_u64().unwrap_or(0))
        .unwrap_or(0);
    let grown = after.saturating_sub(before);
    let mut problems = Vec::new();
    if grown >= 64 << 20 {
        problems.push(format!(
            "the supervisor's peak memory grew by {grown} bytes"
        ));
    }
    if !batch.contains("'error'") || !batch.contains("bytes") {
        problems.push(format!("the flooded batch: {batch}"));
    }
    if !slow.contains("'error'") {
        problems.push(format!("the slow reply: {slow}"));
    }
    if !tool.contains("'error'") {
        problems.push(format!("the flooding http tool: {tool}"));
    }
    if used < 700 {
        problems.push(format!(
            "the seven unread replies were charged {used} tokens, not their 700 asked"
        ));
    }
    Ok(Outcome {
        control: format!(
            "a query passed first; the endpoint was asked for six replies of up to {} MiB \
             each and one at 10 bytes a second, and an http tool for as much",
            TOTAL >> 20
        ),
        blocked: problems.is_empty(),
        evidence: if problems.is_empty() {
            format!(
                "the endpoint got {} MiB of the floods out before the supervisor stopped reading; \
                 its peak memory grew by {} MiB; the unread replies were charged {used} tokens; \
                 batch: {batch}; slow: {slow}; http tool: {tool}",
                wire.written() >> 20,
                grown >> 20
            )
        } else {
            format!("{}: {out}", problems.join("; "))
        },
    })
}
