//! Turning what was observed into a verdict. Pure: no I/O, unit-tested.
//!
//! Order of precedence:
//! 1. any canary evidence, or the script's own `escaped`, is `escaped`;
//! 2. a positive control that did not escape makes the attack `error` (a
//!    broken attack must not pass as blocked);
//! 3. a missing or unreadable result is `error` — or `escaped` for protocol
//!    attacks, whose target is the supervisor itself;
//! 4. the script's `blocked`/`attempted` line, or a denial the harness can see
//!    (SIGSYS, an expected status with the expected error), is `blocked`;
//! 5. anything else is `error`, with what was seen.

use super::attack::{Attack, Category};
use serde::Serialize;
use serde_json::Value;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    Blocked,
    Escaped,
    Error,
}

impl Verdict {
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Blocked => "blocked",
            Verdict::Escaped => "escaped",
            Verdict::Error => "error",
        }
    }
}

/// An attack's own account of its attempt (the last `ATTACK-RESULT:` line).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum SelfReport {
    Escaped(String),
    Blocked(String),
    /// The script cannot tell; the canaries decide.
    Attempted(String),
}

pub(crate) fn self_report(texts: &[&str]) -> Option<SelfReport> {
    for text in texts {
        let line = text
            .lines()
            .rev()
            .find_map(|l| l.trim().strip_prefix("ATTACK-RESULT:"));
        if let Some(rest) = line {
            let rest = rest.trim();
            let (kind, detail) = rest.split_once(' ').unwrap_or((rest, ""));
            let detail = detail.trim().to_owned();
            return Some(match kind {
                "escaped" => SelfReport::Escaped(detail),
                "blocked" => SelfReport::Blocked(detail),
                "attempted" => SelfReport::Attempted(detail),
                other => SelfReport::Attempted(format!("unrecognised result {other:?} {detail}")),
            });
        }
    }
    None
}

/// What the positive control showed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ControlObs {
    NotRun,
    Escaped(String),
    Failed(String),
}

/// What the sandboxed run showed.
#[derive(Debug, Clone)]
pub(crate) struct RunObs {
    /// Canary evidence (listeners, files, victims, leaks, survivors, ...).
    pub(crate) evidence: Vec<String>,
    /// The parsed result, or why there is none.
    pub(crate) result: Result<Value, String>,
}

const SIGSYS: i64 = 31;

fn str_field<'a>(v: &'a Value, path: &[&str]) -> &'a str {
    let mut cur = v;
    for p in path {
        match cur.get(p) {
            Some(n) => cur = n,
            None => return "",
        }
    }
    cur.as_str().unwrap_or("")
}

fn clip(s: &str, n: usize) -> String {
    let s = s.trim().replace('\n', " ");
    if s.chars().count() <= n {
        s
    } else {
        let mut t: String = s.chars().take(n).collect();
        t.push('…');
        t
    }
}

/// How the cell ended, in one line: status, signal, error.
fn ending(r: &Value) -> String {
    let status = str_field(r, &["status"]);
    let mut s = status.to_owned();
    if let Some(sig) = r
        .get("exit")
        .and_then(|e| e.get("signal"))
        .and_then(Value::as_i64)
    {
        s.push_str(&format!(", signal {sig}"));
    }
    let kind = str_field(r, &["error", "type"]);
    let msg = str_field(r, &["error", "message"]);
    if !kind.is_empty() || !msg.is_empty() {
        s.push_str(&format!(", {kind}: {}", clip(msg, 120)));
    }
    s
}

pub(crate) fn judge(attack: &Attack, control: &ControlObs, run: &RunObs) -> (Verdict, String) {
    let parsed = run.result.as_ref().ok();
    let report =
        parsed.and_then(|r| self_report(&[str_field(r, &["stdout"]), str_field(r, &["stderr"])]));
    let mut escapes = run.evidence.clone();
    if let Some(SelfReport::Escaped(d)) = &report {
        escapes.push(format!("the script reports: {}", clip(d, 160)));
    }
    if !escapes.is_empty() {
        return (Verdict::Escaped, escapes.join("; "));
    }
    if let ControlObs::Failed(why) = control {
        return (
            Verdict::Error,
            format!("positive control did not escape: {why}"),
        );
    }
    let r = match &run.result {
        Ok(r) => r,
        Err(why) if attack.category == Category::Protocol => {
            return (
                Verdict::Escaped,
                format!("the supervisor gave no result: {why}"),
            );
        }
        Err(why) => return (Verdict::Error, format!("no result: {why}")),
    };
    let status = str_field(r, &["status"]);
    if status == "sandbox_error" {
        return (
            Verdict::Error,
            format!("the sandbox refused to run the cell ({})", ending(r)),
        );
    }
    let accepted = |s: &str| {
        if attack.statuses.is_empty() {
            s == "ok"
        } else {
            attack.statuses.iter().any(|x| x == s)
        }
    };
    match report {
        Some(SelfReport::Blocked(d)) if accepted(status) => {
            return (
                Verdict::Blocked,
                format!("{} [{}]", clip(&d, 140), ending(r)),
            );
        }
        Some(SelfReport::Attempted(d)) if accepted(status) => {
            return (
                Verdict::Blocked,
                format!("no canary fired ({}) [{}]", clip(&d, 100), ending(r)),
            );
        }
        Some(SelfReport::Blocked(_)) | Some(SelfReport::Attempted(_)) => {
            return (Verdict::Error, format!("unexpected status [{}]", ending(r)));
        }
        _ => {}
    }
    let signal = r
        .get("exit")
        .and_then(|e| e.get("signal"))
        .and_then(Value::as_i64);
    if signal == Some(SIGSYS) {
        return (
            Verdict::Blocked,
            format!("killed by SIGSYS (seccomp) [{}]", ending(r)),
        );
    }
    if !attack.statuses.is_empty() && accepted(status) && status != "ok" {
        let seen = format!(
            "{} {} {} {}",
            status,
            str_field(r, &["error", "type"]),
            str_field(r, &["error", "message"]),
            str_field(r, &["limit"])
        )
        .to_ascii_lowercase();
        let denial_ok = if attack.denial.is_empty() {
            status != "error"
        } else {
            attack.denial.iter().any(|d| seen.contains(d.as_str()))
        };
        if denial_ok {
            return (Verdict::Blocked, format!("stopped [{}]", ending(r)));
        }
        return (
            Verdict::Error,
            format!("not the expected denial [{}]", ending(r)),
        );
    }
    let tail = clip(
        str_field(r, &["stderr"])
            .lines()
            .rev()
            .take(3)
            .collect::<Vec<_>>()
            .join(" | ")
            .as_str(),
        120,
    );
    (
        Verdict::Error,
        format!(
            "no ATTACK-RESULT line and not an expected ending [{}] {}",
            ending(r),
            tail
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn attack(extra: &str, category: &str) -> Attack {
        let src = format!(
            "# attack: a\n# category: {category}\n# attempts: x\n# expect: y\n# control: no\n\
             # canaries: none\n{extra}"
        );
        Attack::parse("python/a.py", &src).unwrap()
    }

    fn obs(result: Value) -> RunObs {
        RunObs {
            evidence: vec![],
            result: Ok(result),
        }
    }

    #[test]
    fn canary_evidence_beats_a_blocked_claim() {
        let a = attack("", "network");
        let mut o = obs(json!({"status": "ok", "stdout": "ATTACK-RESULT: blocked EPERM\n"}));
        o.evidence.push("TCP listener: connection".into());
        let (v, d) = judge(&a, &ControlObs::NotRun, &o);
        assert_eq!(v, Verdict::Escaped);
        assert!(d.contains("TCP listener"), "{d}");
    }

    #[test]
    fn failed_control_is_an_error_even_if_blocked() {
        let a = attack("", "network");
        let o = obs(json!({"status": "ok", "stdout": "ATTACK-RESULT: blocked EPERM\n"}));
        let (v, _) = judge(&a, &ControlObs::Failed("printed blocked".into()), &o);
        assert_eq!(v, Verdict::Error);
    }

    #[test]
    fn an_escape_is_reported_even_when_the_control_failed() {
        let a = attack("", "network");
        let mut o = obs(json!({"status": "ok", "stdout": ""}));
        o.evidence.push("unix socket listener: connection".into());
        let (v, _) = judge(&a, &ControlObs::Failed("x".into()), &o);
        assert_eq!(v, Verdict::Escaped);
    }

    #[test]
    fn self_reported_escape_counts() {
        let a = attack("", "process");
        let o = obs(json!({"status": "ok", "stdout": "x\nATTACK-RESULT: escaped got it\n"}));
        assert_eq!(judge(&a, &ControlObs::NotRun, &o).0, Verdict::Escaped);
    }

    #[test]
    fn blocked_needs_an_accepted_status() {
        let a = attack("", "process");
        let ok = obs(json!({"status": "ok", "stdout": "ATTACK-RESULT: blocked EPERM\n"}));
        let (v, d) = judge(&a, &ControlObs::NotRun, &ok);
        assert_eq!(v, Verdict::Blocked);
        assert!(d.starts_with("EPERM"), "{d}");
        let err = obs(
            json!({"status": "error", "stdout": "ATTACK-RESULT: blocked EPERM\n",
                             "error": {"type": "NameError", "message": "x"}}),
        );
        assert_eq!(judge(&a, &ControlObs::NotRun, &err).0, Verdict::Error);
    }

    #[test]
    fn sigsys_is_a_denial() {
        let a = attack("", "process");
        let o = obs(json!({"status": "killed", "stdout": "", "exit": {"signal": 31}}));
        assert_eq!(judge(&a, &ControlObs::NotRun, &o).0, Verdict::Blocked);
    }

    #[test]
    fn expected_status_needs_the_expected_denial() {
        let a = attack(
            "# status: error,limit_exceeded\n# denial: stack|level\n",
            "rhai",
        );
        let good = obs(json!({"status": "error", "stdout": "",
                              "error": {"type": "ErrorStackOverflow", "message": "Stack overflow"}}));
        assert_eq!(judge(&a, &ControlObs::NotRun, &good).0, Verdict::Blocked);
        let bad = obs(json!({"status": "error", "stdout": "",
                             "error": {"type": "ParseError", "message": "unexpected token"}}));
        assert_eq!(judge(&a, &ControlObs::NotRun, &bad).0, Verdict::Error);
        // A status that is not listed is never a denial.
        let other = obs(json!({"status": "ok", "stdout": ""}));
        assert_eq!(judge(&a, &ControlObs::NotRun, &other).0, Verdict::Error);
    }

    #[test]
    fn expected_timeout_without_denial_list_is_blocked_but_error_is_not() {
        let a = attack("# status: timeout,error\n", "resource");
        let t = obs(json!({"status": "timeout", "stdout": ""}));
        assert_eq!(judge(&a, &ControlObs::NotRun, &t).0, Verdict::Blocked);
        let e = obs(
            json!({"status": "error", "stdout": "", "error": {"type": "SyntaxError", "message": "bad"}}),
        );
        assert_eq!(judge(&a, &ControlObs::NotRun, &e).0, Verdict::Error);
    }

    #[test]
    fn missing_result_is_an_error_except_for_protocol_attacks() {
        let none = RunObs {
            evidence: vec![],
            result: Err("exit status 101".into()),
        };
        assert_eq!(
            judge(&attack("", "process"), &ControlObs::NotRun, &none).0,
            Verdict::Error
        );
        assert_eq!(
            judge(&attack("", "protocol"), &ControlObs::NotRun, &none).0,
            Verdict::Escaped
        );
    }

    #[test]
    fn sandbox_error_is_never_blocked() {
        let a = attack("# status: error\n", "process");
        let o = obs(json!({"status": "sandbox_error", "stdout": "",
                           "error": {"type": "SandboxError", "message": "landlock missing"}}));
        assert_eq!(judge(&a, &ControlObs::NotRun, &o).0, Verdict::Error);
    }

    #[test]
    fn the_last_result_line_wins_and_stdout_before_stderr() {
        let r = self_report(&[
            "ATTACK-RESULT: blocked a\nATTACK-RESULT: escaped b\n",
            "ATTACK-RESULT: blocked c",
        ]);
        assert_eq!(r, Some(SelfReport::Escaped("b".into())));
        let r = self_report(&["", "ATTACK-RESULT: attempted c"]);
        assert_eq!(r, Some(SelfReport::Attempted("c".into())));
        assert_eq!(self_report(&["nothing", ""]), None);
    }
}
