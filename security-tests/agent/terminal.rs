//! A hostile model endpoint writes for `cellbox agent`'s terminal: a reply
//! whose code answers with escape sequences (clear the screen, write the
//! clipboard) and the key it was sent, and an error body with the same.
//!
//! Control: the endpoint is shown to have sent the escapes and the key, and
//! the answer's marker (and the error) to reach the agent's stdout (stderr).
//! Defence: no ESC or other control byte but newline on either stream, and
//! no run of the key.

use super::harness::{completion, marker, record_leak, Echo};
use super::{Env, Outcome};
use std::sync::Arc;

fn agent(env: &Env, endpoint: &str, key: &str) -> Result<std::process::Output, String> {
    let dir = tempfile::tempdir().map_err(|e| format!("temp dir: {e}"))?;
    let config = dir.path().join("cellbox.toml");
    std::fs::write(
        &config,
        format!(
            "[models.m]\nendpoint = \"{endpoint}/v1\"\nmodel = \"x\"\napi_key_env = \"CB_MODEL_KEY\"\nmax_attempts = 1\n"
        ),
    )
    .map_err(|e| format!("config: {e}"))?;
    std::process::Command::new(&env.cellbox)
        .arg("agent")
        .arg("--config")
        .arg(&config)
        .args(["--max-steps", "2", "--timeout", "60", "say hello"])
        .env("CB_MODEL_KEY", key)
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|e| format!("failed to run cellbox agent: {e}"))
}

/// Control bytes other than newline and tab.
fn controls(b: &[u8]) -> usize {
    b.iter()
        .filter(|c| (**c < 0x20 && **c != b'\n' && **c != b'\t') || **c == 0x7f)
        .count()
}

pub fn run(env: &Env) -> Result<Outcome, String> {
    let key = format!("sk-{}", marker(""));
    let mark = marker("MARK-");
    let hostile = "\\x1b[2J\\x1b]52;c;aGk=\\x07\\x9b31m";
    let m = mark.clone();
    let h = hostile.to_owned();
    let echo = Echo::start(Arc::new(move |seen| {
        let got = seen
            .header("authorization")
            .unwrap_or_default()
            .trim_start_matches("Bearer ")
            .to_owned();
        if seen.body.contains("say hello") && !seen.path.contains("err") {
            let code = format!("```python\nanswer('{m}{h}' + '{got}')\n```");
            (200, completion(&code))
        } else {
            (500, format!("boom {m}\x1b[2J\x07 {got}"))
        }
    }))?;
    let ok = agent(env, &echo.url, &key)?;
    let bad = agent(env, &format!("{}/err", echo.url), &key)?;
    let sent = echo
        .seen()
        .iter()
        .filter(|(_, answer)| answer.contains(&key))
        .count();
    let (out, err) = (
        String::from_utf8_lossy(&ok.stdout),
        String::from_utf8_lossy(&bad.stderr),
    );
    if sent < 2 || !out.contains(&mark) || !err.contains(&mark) {
        return Err(format!(
            "the endpoint did not send the key twice ({sent}), or the answer and the error did \
             not come through: stdout {out:?}, stderr {err:?}"
        ));
    }
    let mut found = Vec::new();
    for (what, bytes) in [
        ("the answer's stdout", &ok.stdout),
        ("the answer's stderr", &ok.stderr),
        ("the error's stderr", &bad.stderr),
    ] {
        let n = controls(bytes);
        if n > 0 {
            found.push(format!("{what} holds {n} control bytes"));
        }
        if let Some(run) = record_leak(&String::from_utf8_lossy(bytes), std::slice::from_ref(&key))
        {
            found.push(format!("{what} holds {run:?} of the key"));
        }
    }
    Ok(Outcome {
        control: "the endpoint's answer (code answering with screen-clearing, clipboard and C1 \
                  escapes and the key) reached the agent's stdout, and its HTTP 500 body (the \
                  same) its stderr"
            .into(),
        blocked: found.is_empty(),
        evidence: if found.is_empty() {
            "both streams show the escapes written out and the key redacted".into()
        } else {
            found.join("; ")
        },
    })
}
