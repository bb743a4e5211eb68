//! The supervisor's environment holds the operator's secrets (a model key,
//! a tool's token); a cell, and a command tool it calls, look for them in
//! every environment they can read.
//!
//! Control: the host's `/proc/<serve>/environ` holds both secrets (an
//! environment inherited from the supervisor would carry them).
//! Defence: cells and command tools start with a fixed environment of
//! their own; nothing they print holds a run of either secret.

use super::harness::{environ, marker, python, AgentServe};
use super::{Env, Outcome};

fn config(extra: &str) -> String {
    format!(
        r#"
[server]
languages = ["python", "shell"]
[models.m]
endpoint = "http://127.0.0.1:9/v1"
model = "x"
api_key_env = "CB_MODEL_KEY"
[tools.hook]
kind = "http"
description = "a web hook"
url = "http://127.0.0.1:9/hook"
headers = {{ Authorization = {{ env = "CB_TOOL_TOKEN", prefix = "Bearer " }} }}
{extra}
"#
    )
}

/// A server holding two fresh secrets; the secrets; the control's finding.
fn start(env: &Env, extra: &str) -> Result<(AgentServe, Vec<String>, String), String> {
    let key = marker("sk-");
    let token = marker("tok-");
    let serve = AgentServe::start(
        env,
        &config(extra),
        &[("CB_MODEL_KEY", &key), ("CB_TOOL_TOKEN", &token)],
    )?;
    let held: Vec<String> = environ(serve.pid())?
        .into_iter()
        .filter(|(_, v)| *v == key || *v == token)
        .map(|(k, _)| k)
        .collect();
    if held.len() != 2 {
        return Err(format!(
            "the server's environment holds {held:?}, not both secrets: the attack is broken"
        ));
    }
    let control = format!(
        "the host sees {} in the server's environment",
        held.join(" and ")
    );
    Ok((serve, vec![key, token], control))
}

const READ_ALL: &str = r#"
import os
out = {"environ": dict(os.environ)}
for p in ["/proc/self/environ", "/proc/1/environ", "/proc/%d/environ" % os.getppid()]:
    try:
        out[p] = open(p, "rb").read().decode("latin-1")
    except Exception as e:
        out[p] = repr(e)
out
"#;

pub fn cell(env: &Env) -> Result<Outcome, String> {
    let (serve, secrets, control) = start(env, "")?;
    let client = serve.client(env)?;
    let a = env.block_on("cell", python(&client, None, READ_ALL, 30))?;
    if a.status() != "ok" {
        return Err(format!("the cell failed: {}", a.all_text()));
    }
    let leaks = serve.leaks(&a.all_text(), &secrets);
    Ok(Outcome {
        control,
        blocked: leaks.is_empty(),
        evidence: if leaks.is_empty() {
            "the cell's environ and /proc/*/environ it could read hold neither secret".into()
        } else {
            leaks.join("; ")
        },
    })
}

pub fn command_tool(env: &Env) -> Result<Outcome, String> {
    let extra = r#"
[tools.showenv]
kind = "command"
description = "print the environment"
argv = ["/usr/bin/env"]
[policy]
allow = ["showenv"]
"#;
    let (serve, secrets, control) = start(env, extra)?;
    let client = serve.client(env)?;
    let code = "tool_call('showenv', {})";
    let a = env.block_on("cell", python(&client, None, code, 30))?;
    let out = a
        .structured
        .as_ref()
        .and_then(|v| v.pointer("/value/stdout"))
        .and_then(|v| v.as_str())
        .unwrap_or_default()
        .to_owned();
    if a.status() != "ok" || !out.contains("PATH=") {
        return Err(format!(
            "the command tool did not print an environment: {}",
            a.all_text()
        ));
    }
    let leaks = serve.leaks(&a.all_text(), &secrets);
    // The tool's own view, to show in the report.
    let names: Vec<&str> = out.lines().filter_map(|l| l.split('=').next()).collect();
    Ok(Outcome {
        control,
        blocked: leaks.is_empty(),
        evidence: if leaks.is_empty() {
            format!("the command tool's environment is {names:?}, no secret in it")
        } else {
            leaks.join("; ")
        },
    })
}
