//! The operator's secrets (a model key, an http tool's token, an upstream
//! server's token) sent back by what they were sent to: a model endpoint
//! that echoes its request in a successful reply and in an error, an http
//! tool that echoes its headers, upstream MCP servers that show their
//! environment, their request headers and their log. Each echo carries the
//! secret whole, in part, and encoded (base64 at each alignment, URL, hex),
//! with errors long enough that a cut made before redaction would leave a
//! run of the secret.
//!
//! Control: the outside world is shown to have received the secret and to
//! have sent it back (what the echo endpoint answered, the host's view of
//! the upstream's environment), and the echo's marker to have reached the
//! client (the path carries text end to end).
//! Defence: what the client gets holds no run of a secret, in any of those
//! forms, that carries 128 bits of its chance (or 64 while leaving fewer
//! than 64 unseen: see `harness::tenant_leak`); the events file and the
//! server's log no run of 8 bytes.

use super::harness::{
    completion, environ, fake_upstream, marker, python, tenant_leak, AgentServe, Echo,
    HttpUpstream, RUN,
};
use super::{Env, Outcome};
use base64::Engine as _;
use std::sync::Arc;

/// A fresh secret with characters that URL encoding changes.
fn secret(prefix: &str) -> String {
    format!("{}+{}/x", marker(prefix), marker(""))
}

fn b64(b: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(b)
}

fn url(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

fn hex(s: &str) -> String {
    s.bytes().map(|b| format!("{b:02x}")).collect()
}

/// What a hostile echo makes of a secret: whole, a part of it, base64 at
/// each alignment, URL-encoded, hex.
fn leaky(s: &str) -> String {
    format!(
        "plain={s} part={} b64={} b64+1={} b64+2={} url={} hex={}",
        &s[5..5 + RUN + 4],
        b64(s.as_bytes()),
        b64(format!("a{s}").as_bytes()),
        b64(format!("ab{s}").as_bytes()),
        url(s),
        hex(s)
    )
}

fn verdict(serve: &AgentServe, seen_by_client: &str, secrets: &[&str], ok: &str) -> (bool, String) {
    let all: Vec<String> = secrets.iter().map(|s| (*s).to_owned()).collect();
    let leaks = serve.leaks(seen_by_client, &all);
    if leaks.is_empty() {
        (true, ok.to_owned())
    } else {
        (false, leaks.join("; "))
    }
}

/// The bearer token an echo request carried.
fn bearer(seen: &super::harness::Seen) -> String {
    seen.header("authorization")
        .unwrap_or_default()
        .trim_start_matches("Bearer ")
        .to_owned()
}

fn model_config(endpoint: &str) -> String {
    format!(
        r#"
[server]
languages = ["python"]
[models.m]
endpoint = "{endpoint}/v1"
model = "x"
api_key_env = "CB_MODEL_KEY"
max_attempts = 1
[policy]
allow = ["model_query"]
"#
    )
}

/// Whether the echo got `key` as its bearer token and sent it back.
fn echoed(echo: &Echo, key: &str) -> bool {
    echo.seen()
        .iter()
        .any(|(s, answer)| bearer(s) == key && answer.contains(key))
}

pub fn model_reply(env: &Env) -> Result<Outcome, String> {
    let key = secret("sk-");
    let mark = marker("MARK-");
    let m = mark.clone();
    let echo = Echo::start(Arc::new(move |seen| {
        (200, completion(&format!("{m} {}", leaky(&bearer(seen)))))
    }))?;
    let serve = AgentServe::start(env, &model_config(&echo.url), &[("CB_MODEL_KEY", &key)])?;
    let client = serve.client(env)?;
    let code = "r = model_query('hi')\nprint(r)\nr";
    let a = env.block_on("cell", python(&client, None, code, 60))?;
    let text = a.all_text();
    if !echoed(&echo, &key) || !text.contains(&mark) {
        return Err(format!(
            "the endpoint did not echo the key, or its reply did not reach the client: {text}"
        ));
    }
    let (blocked, evidence) = verdict(
        &serve,
        &text,
        &[&key],
        "the reply reached the cell and the client with the key, its part and its encodings \
         redacted",
    );
    Ok(Outcome {
        control: "the endpoint received the key and sent it back whole, in part, in base64 \
                  at 3 alignments, URL-encoded and in hex in a successful reply, which reached \
                  the client"
            .into(),
        blocked,
        evidence,
    })
}

pub fn model_error(env: &Env) -> Result<Outcome, String> {
    let key = secret("sk-");
    // The quoted body is cut at 300 characters: the key starts 10 before.
    let echo = Echo::start(Arc::new(move |seen| {
        let got = bearer(seen);
        (401, format!("{}{got} {}", "x".repeat(290), leaky(&got)))
    }))?;
    let serve = AgentServe::start(env, &model_config(&echo.url), &[("CB_MODEL_KEY", &key)])?;
    let client = serve.client(env)?;
    let code =
        "try:\n    model_query('hi')\nexcept RuntimeError as e:\n    err = str(e)\nprint(err)\nerr";
    let a = env.block_on("cell", python(&client, None, code, 60))?;
    let text = a.all_text();
    if !echoed(&echo, &key) || !text.contains("HTTP 401") {
        return Err(format!(
            "the endpoint did not echo the key, or its error did not reach the client: {text}"
        ));
    }
    let (blocked, evidence) = verdict(
        &serve,
        &text,
        &[&key],
        "the error reached the client with the key redacted before it was cut",
    );
    Ok(Outcome {
        control: "the endpoint answered HTTP 401 with the key at character 290 of its body \
                  (a cut at 300 would keep 10 of it), and encoded after; the error reached the \
                  client"
            .into(),
        blocked,
        evidence,
    })
}

pub fn http_tool(env: &Env) -> Result<Outcome, String> {
    let token = secret("tok-");
    let mark = marker("MARK-");
    let m = mark.clone();
    let echo = Echo::start(Arc::new(move |seen| {
        let got = bearer(seen);
        let headers = seen.headers.join("\n");
        if seen.path == "/err" {
            (
                500,
                format!("{}{headers}\n{}", "x".repeat(490), leaky(&got)),
            )
        } else {
            let body = serde_json::json!({"mark": m, "headers": headers, "echo": leaky(&got)});
            (200, body.to_string())
        }
    }))?;
    let config = format!(
        r#"
[server]
languages = ["python"]
[tools.hook]
kind = "http"
description = "a web hook"
url = "{url}/ok"
headers = {{ Authorization = {{ env = "CB_TOOL_TOKEN", prefix = "Bearer " }} }}
[tools.hook_err]
kind = "http"
description = "a failing web hook"
url = "{url}/err"
headers = {{ Authorization = {{ env = "CB_TOOL_TOKEN", prefix = "Bearer " }} }}
[policy]
allow = ["hook", "hook_err"]
"#,
        url = echo.url
    );
    let serve = AgentServe::start(env, &config, &[("CB_TOOL_TOKEN", &token)])?;
    let client = serve.client(env)?;
    let code = "ok = tools.hook()\ntry:\n    tools.hook_err()\n    err = None\nexcept Exception as e:\n    err = str(e)\n{'ok': ok, 'err': err}";
    let a = env.block_on("cell", python(&client, None, code, 60))?;
    let text = a.all_text();
    let got = echo
        .seen()
        .iter()
        .filter(|(s, _)| bearer(s) == token)
        .count();
    if got < 2 || !text.contains(&mark) || !text.contains("HTTP 500") {
        return Err(format!(
            "the tool did not get its token twice ({got}), or its answers did not reach the \
             client: {text}"
        ));
    }
    let (blocked, evidence) = verdict(
        &serve,
        &text,
        &[&token],
        "the tool's answer and its error reached the client with the token redacted",
    );
    Ok(Outcome {
        control: "the tool received its token and echoed its headers (and the token encoded) \
                  in a JSON answer and in an HTTP 500 body of 490+ characters; both reached the \
                  client"
            .into(),
        blocked,
        evidence,
    })
}

fn upstream_config(program: &std::path::Path) -> String {
    format!(
        r#"
[server]
languages = ["python"]
[models.m]
endpoint = "http://127.0.0.1:9/v1"
model = "x"
api_key_env = "CB_MODEL_KEY"
[tools.hook]
kind = "http"
description = "a web hook"
url = "http://127.0.0.1:9/hook"
headers = {{ Authorization = {{ env = "CB_TOOL_TOKEN" }} }}
[tools.up]
kind = "mcp"
command = [{program:?}]
env = {{ UP_TOKEN = {{ env = "CB_UPSTREAM_TOKEN" }} }}
timeout_ms = 5000
[policy]
allow = ["up.*"]
"#,
        program = program.to_string_lossy()
    )
}

/// The three secrets of [`upstream_config`], and a server holding them.
fn upstream_server(env: &Env) -> Result<(AgentServe, [String; 3]), String> {
    let program = fake_upstream(&env.cellbox)?;
    let secrets = [secret("sk-"), secret("tok-"), secret("up-")];
    let serve = AgentServe::start(
        env,
        &upstream_config(&program),
        &[
            ("CB_MODEL_KEY", &secrets[0]),
            ("CB_TOOL_TOKEN", &secrets[1]),
            ("CB_UPSTREAM_TOKEN", &secrets[2]),
        ],
    )?;
    let held = environ(serve.pid())?
        .into_iter()
        .filter(|(_, v)| secrets.contains(v))
        .count();
    if held != 3 {
        return Err(format!(
            "the server's environment holds {held} of the 3 secrets: the attack is broken"
        ));
    }
    Ok((serve, secrets))
}

/// The host's view of the process `pid`: its parent and its environment.
fn upstream_process(pid: i32) -> Result<(i32, Vec<(String, String)>), String> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .map_err(|e| format!("/proc/{pid}/status: {e}"))?;
    let ppid = status
        .lines()
        .find_map(|l| l.strip_prefix("PPid:"))
        .and_then(|v| v.trim().parse().ok())
        .ok_or(format!("no PPid in /proc/{pid}/status"))?;
    Ok((ppid, environ(pid)?))
}

pub fn upstream_environment(env: &Env) -> Result<Outcome, String> {
    let (serve, secrets) = upstream_server(env)?;
    let client = serve.client(env)?;
    let code = "{'env': tools.up.env(), 'pid': tools.up.pid()['pid']}";
    let a = env.block_on("cell", python(&client, None, code, 60))?;
    let text = a.all_text();
    let pid = a
        .structured
        .as_ref()
        .and_then(|v| v.pointer("/value/pid"))
        .and_then(|v| v.as_i64())
        .ok_or(format!("the cell did not get the upstream's pid: {text}"))?;
    let (ppid, up_env) = upstream_process(pid as i32)?;
    if ppid != serve.pid() {
        return Err(format!(
            "process {pid} is not the server's child (its parent is {ppid})"
        ));
    }
    let names: Vec<&str> = up_env.iter().map(|(k, _)| k.as_str()).collect();
    let holds_own = up_env
        .iter()
        .any(|(k, v)| k == "UP_TOKEN" && *v == secrets[2]);
    // Its env tool sent the token: it shows, or its redaction does.
    let shown = text.contains(&secrets[2]) || text.contains("[REDACTED:CB_UPSTREAM_TOKEN]");
    if !holds_own || !shown {
        return Err(format!(
            "the upstream was not given its token, or its env tool did not show it: {names:?} \
             {text}"
        ));
    }
    let extra: Vec<&str> = names.iter().copied().filter(|n| *n != "UP_TOKEN").collect();
    let others = up_env
        .iter()
        .any(|(_, v)| *v == secrets[0] || *v == secrets[1]);
    let (mut blocked, mut evidence) =
        verdict(&serve, &text, &[&secrets[0], &secrets[1], &secrets[2]], "");
    if !extra.is_empty() || others {
        blocked = false;
        evidence = format!(
            "the upstream's environment (the host's /proc/{pid}/environ) holds {names:?}; {evidence}"
        );
    } else if blocked {
        evidence = format!(
            "the host sees only {names:?} in the upstream's environment; its own token, which \
             its env tool returned, reached the client redacted"
        );
    }
    Ok(Outcome {
        control: "the server's environment holds the model key, the tool token and the \
                  upstream token; the upstream holds its token (the host's /proc) and its env \
                  tool sent it back"
            .into(),
        blocked,
        evidence,
    })
}

pub fn upstream_log(env: &Env) -> Result<Outcome, String> {
    let (serve, secrets) = upstream_server(env)?;
    let client = serve.client(env)?;
    let mark = marker("MARK-");
    // Its log gets its token; its stdout gets a line that is not JSON-RPC,
    // the token 10 characters before the 200 an error quotes of it.
    let code = format!(
        "tools.up.log(text='{mark} ${{UP_TOKEN}}')\n\
         try:\n    tools.up.garbage(text='{pad}${{UP_TOKEN}}')\n    err = None\n\
         except Exception as e:\n    err = str(e)\nerr",
        pad = "x".repeat(190)
    );
    let a = env.block_on("cell", python(&client, None, &code, 60))?;
    let text = a.all_text();
    // The log line is relayed on its own time: wait for it.
    let t0 = std::time::Instant::now();
    while !serve.log().contains(&mark) && t0.elapsed() < std::time::Duration::from_secs(10) {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    if !serve.log().contains(&mark) || !text.contains("not JSON") {
        return Err(format!(
            "the upstream's log line or its fault did not come through: {text}"
        ));
    }
    let (blocked, evidence) = verdict(
        &serve,
        &text,
        &[&secrets[2]],
        "the upstream's log line reached the server's log, and its stray stdout line the \
         client, with its token redacted",
    );
    Ok(Outcome {
        control: "the upstream wrote its token on stderr (the line reached the server's log) \
                  and 10 characters before the end of what an error quotes of a stray stdout \
                  line (the error reached the client)"
            .into(),
        blocked,
        evidence,
    })
}

pub fn upstream_http_token(env: &Env) -> Result<Outcome, String> {
    let up = HttpUpstream::start()?;
    let token = secret("tok-");
    let config = format!(
        r#"
[server]
languages = ["python"]
[tools.remote]
kind = "mcp"
url = "{url}"
token_env = "CB_REMOTE_TOKEN"
timeout_ms = 5000
[policy]
allow = ["remote.*"]
"#,
        url = up.url
    );
    let serve = AgentServe::start(env, &config, &[("CB_REMOTE_TOKEN", &token)])?;
    let client = serve.client(env)?;
    let a = env.block_on("cell", python(&client, None, "tools.remote.headers()", 60))?;
    let text = a.all_text();
    let sent = up.authorizations().iter().any(|h| h.ends_with(&token));
    let shown = text.contains(&token) || text.contains("[REDACTED:CB_REMOTE_TOKEN]");
    if !sent || !shown {
        return Err(format!(
            "the upstream did not get its token, or its headers tool did not show it: {text}"
        ));
    }
    let (blocked, evidence) = verdict(
        &serve,
        &text,
        &[&token],
        "the upstream's headers reached the client with its token redacted",
    );
    Ok(Outcome {
        control: "the HTTP upstream received its bearer token and its headers tool sent it \
                  back"
            .into(),
        blocked,
        evidence,
    })
}

pub fn upstream_tool_list(env: &Env) -> Result<Outcome, String> {
    let program = fake_upstream(&env.cellbox)?;
    let token = secret("up-");
    let mark = marker("MARK-");
    // The upstream lists a tool made from its configuration: its token is
    // the tool's description, its parameter's name and the one value that
    // parameter takes.
    let config = format!(
        r#"
[server]
languages = ["python"]
[tools.up]
kind = "mcp"
command = [{program:?}]
env = {{ UP_TOKEN = {{ env = "CB_UPSTREAM_TOKEN" }}, FAKE_LISTED = "{mark} ${{UP_TOKEN}}" }}
timeout_ms = 5000
[policy]
allow = ["up.*"]
"#,
        program = program.to_string_lossy()
    );
    let serve = AgentServe::start(env, &config, &[("CB_UPSTREAM_TOKEN", &token)])?;
    let client = serve.client(env)?;
    // The error of a call without its required parameter names it (as the
    // schema's validation words it); once the cell has that name, the error
    // of a call with the wrong value quotes the one value it takes.
    let code = "import re\n\
                def err(f):\n    try:\n        f()\n        return None\n    \
                except Exception as e:\n        return str(e)\n\
                missing = err(lambda: tools.up.listed())\n\
                m = re.search(r'\"(MARK-[^\"]*)\"', missing or '')\n\
                wrong = err(lambda: tools.up.listed(**{m.group(1): 'nope'})) if m else None\n\
                {'missing': missing, 'wrong': wrong}";
    let a = env.block_on("cell", python(&client, None, code, 60))?;
    let text = a.all_text();
    // The marker is followed by the token (redacted, or not): what the
    // upstream listed reached the cell, and held the token.
    let with_token = format!("{mark} [REDACTED:CB_UPSTREAM_TOKEN]");
    let with_token_raw = format!("{mark} {}", &token[..8]);
    if !text.contains(&with_token) && !text.contains(&with_token_raw) {
        return Err(format!(
            "the upstream's listed tool did not reach the cell with its marker and token: {text}"
        ));
    }
    let (blocked, evidence) = verdict(
        &serve,
        &text,
        &[&token],
        "the tool's parameter name and the value it takes reached the cell with the token redacted",
    );
    Ok(Outcome {
        control: "the upstream listed a tool whose description, required parameter's name and \
                  enum hold its token after a marker; the marker, and the token after it \
                  (redacted), reached the cell through the errors of two calls"
            .into(),
        blocked,
        evidence,
    })
}

/// A tool that sends its secrets back in forms a byte-for-byte match
/// misses: its token upper-cased and with every letter's case swapped, and
/// a secret account number as a JSON number (not a string).
pub fn http_tool_other_forms(env: &Env) -> Result<Outcome, String> {
    let token = secret("tok-");
    // 18 digits, the first not 0: a JSON number that fits an integer.
    let account: String = marker("")
        .bytes()
        .enumerate()
        .map(|(i, b)| {
            let d = (b as char).to_digit(16).unwrap_or(0) % 10;
            char::from_digit(if i == 0 { d.max(1) } else { d }, 10).unwrap_or('1')
        })
        .take(18)
        .collect();
    let mark = marker("MARK-");
    let m = mark.clone();
    let echo = Echo::start(Arc::new(move |seen| {
        let got = bearer(seen);
        let acct = seen.header("x-account").unwrap_or("0").to_owned();
        let swapped: String = got
            .chars()
            .map(|c| {
                if c.is_ascii_lowercase() {
                    c.to_ascii_uppercase()
                } else {
                    c.to_ascii_lowercase()
                }
            })
            .collect();
        let body = format!(
            r#"{{"mark": {m:?}, "upper": {:?}, "swapped": {swapped:?}, "account": {acct}}}"#,
            got.to_uppercase()
        );
        (200, body)
    }))?;
    let config = format!(
        r#"
[server]
languages = ["python"]
[tools.hook]
kind = "http"
description = "a web hook"
url = "{url}/ok"
headers = {{ Authorization = {{ env = "CB_TOOL_TOKEN", prefix = "Bearer " }}, X-Account = {{ env = "CB_ACCOUNT" }} }}
[policy]
allow = ["hook"]
"#,
        url = echo.url
    );
    let serve = AgentServe::start(
        env,
        &config,
        &[("CB_TOOL_TOKEN", &token), ("CB_ACCOUNT", &account)],
    )?;
    let client = serve.client(env)?;
    let a = env.block_on("cell", python(&client, None, "tools.hook()", 60))?;
    let text = a.all_text();
    let got = echo.seen().iter().any(|(s, answer)| {
        bearer(s) == token
            && s.header("x-account") == Some(account.as_str())
            && answer.contains(&token.to_uppercase())
            && answer.contains(&format!(": {account}}}"))
    });
    if !got || !text.contains(&mark) {
        return Err(format!(
            "the tool did not get its token and account number and send them back ({got}), \
             or its answer did not reach the client: {text}"
        ));
    }
    let mut found = serve.leaks(&text, &[token.clone(), account.clone()]);
    // Any case of the token.
    if let Some(run) = tenant_leak(&text.to_lowercase(), &token.to_lowercase()) {
        found.push(format!(
            "the client's result holds the token in another case: {run}"
        ));
    }
    Ok(Outcome {
        control: "the tool received its token and an account number in headers and sent back \
                  the token upper-cased and case-swapped and the number as a JSON number; the \
                  answer reached the client"
            .into(),
        blocked: found.is_empty(),
        evidence: if found.is_empty() {
            "the answer reached the client with the token in every case and the number redacted"
                .into()
        } else {
            found.join("; ")
        },
    })
}
