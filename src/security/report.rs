//! The suite's report: a table for people, JSON for machines.

use super::attack::{Category, Lang};
use super::verdict::Verdict;
use serde::Serialize;
use serde_json::{json, Value};
use std::time::Duration;

/// One attack's outcome.
#[derive(Debug, Clone, Serialize)]
pub struct AttackOutcome {
    pub name: String,
    pub file: String,
    pub lang: Lang,
    pub category: Category,
    pub verdict: Verdict,
    /// The denial seen (blocked), the evidence (escaped) or what went wrong.
    pub evidence: String,
    /// The cell's result status, when there was a result.
    pub status: Option<String>,
    /// The positive control: `not run`, `escaped: ...` or `failed: ...`.
    pub control: String,
    #[serde(serialize_with = "ms")]
    pub time: Duration,
}

fn ms<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_u64(d.as_millis() as u64)
}

#[derive(Debug, Clone)]
pub struct SuiteReport {
    pub outcomes: Vec<AttackOutcome>,
    /// How the harness ran (survivor check, privileges, ...).
    pub notes: Vec<String>,
    pub profile: Option<String>,
    pub wall: Duration,
}

impl SuiteReport {
    pub fn count(&self, v: Verdict) -> usize {
        self.outcomes.iter().filter(|o| o.verdict == v).count()
    }

    pub fn passed(&self) -> usize {
        self.count(Verdict::Blocked)
    }

    pub fn failed(&self) -> usize {
        self.outcomes.len() - self.passed()
    }

    /// The closing line, alone on its line in every rendering.
    pub fn summary_line(&self) -> String {
        format!("{} passed, {} failed", self.passed(), self.failed())
    }

    /// The table: attack, verdict, evidence, time; then notes and totals.
    /// `width` bounds the evidence column.
    pub fn table(&self, width: usize) -> String {
        let mut rows: Vec<&AttackOutcome> = self.outcomes.iter().collect();
        rows.sort_by(|a, b| a.file.cmp(&b.file));
        let name_w = rows.iter().map(|o| o.file.len()).max().unwrap_or(6).max(6);
        let mut out = format!(
            "{:<name_w$}  {:<7}  {:>6}  evidence\n",
            "attack", "verdict", "time"
        );
        for o in rows {
            let ev: String = o.evidence.replace('\n', " ");
            let ev = if ev.chars().count() > width {
                let mut t: String = ev.chars().take(width.saturating_sub(1)).collect();
                t.push('…');
                t
            } else {
                ev
            };
            out.push_str(&format!(
                "{:<name_w$}  {:<7}  {:>5.1}s  {}\n",
                o.file,
                o.verdict.as_str(),
                o.time.as_secs_f64(),
                ev
            ));
        }
        for n in &self.notes {
            out.push_str(&format!("note: {n}\n"));
        }
        out.push_str(&format!(
            "{} attacks in {:.1} s: {} blocked, {} escaped, {} errors\n",
            self.outcomes.len(),
            self.wall.as_secs_f64(),
            self.count(Verdict::Blocked),
            self.count(Verdict::Escaped),
            self.count(Verdict::Error)
        ));
        out.push_str(&self.summary_line());
        out.push('\n');
        out
    }

    /// A Markdown table (for the README), with the totals line under it.
    pub fn markdown(&self) -> String {
        let mut rows: Vec<&AttackOutcome> = self.outcomes.iter().collect();
        rows.sort_by(|a, b| a.file.cmp(&b.file));
        let mut out =
            String::from("| attack | category | verdict | evidence |\n| --- | --- | --- | --- |\n");
        for o in rows {
            let mut ev: String = o.evidence.replace('\n', " ").replace('|', "\\|");
            if ev.chars().count() > 140 {
                ev = ev.chars().take(139).collect::<String>() + "…";
            }
            out.push_str(&format!(
                "| `{}` | {} | {} | {} |\n",
                o.file,
                o.category.as_str(),
                o.verdict.as_str(),
                ev
            ));
        }
        out.push_str(&format!(
            "\n{} attacks: {} blocked, {} escaped, {} errors ({}).\n",
            self.outcomes.len(),
            self.count(Verdict::Blocked),
            self.count(Verdict::Escaped),
            self.count(Verdict::Error),
            self.summary_line()
        ));
        out
    }

    pub fn to_json(&self) -> Value {
        let mut rows: Vec<&AttackOutcome> = self.outcomes.iter().collect();
        rows.sort_by(|a, b| a.file.cmp(&b.file));
        json!({
            "summary": {
                "total": self.outcomes.len(),
                "passed": self.passed(),
                "failed": self.failed(),
                "blocked": self.count(Verdict::Blocked),
                "escaped": self.count(Verdict::Escaped),
                "errors": self.count(Verdict::Error),
                "wall_ms": self.wall.as_millis() as u64,
            },
            "profile": self.profile,
            "notes": self.notes,
            "results": rows,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outcome(file: &str, v: Verdict) -> AttackOutcome {
        AttackOutcome {
            name: file.rsplit('/').next().unwrap_or(file).into(),
            file: file.into(),
            lang: Lang::Python,
            category: Category::Process,
            verdict: v,
            evidence: "EPERM ".repeat(40),
            status: Some("ok".into()),
            control: "not run".into(),
            time: Duration::from_millis(1234),
        }
    }

    #[test]
    fn table_ends_with_the_summary_line_alone() {
        let r = SuiteReport {
            outcomes: vec![
                outcome("python/b.py", Verdict::Blocked),
                outcome("python/a.py", Verdict::Escaped),
                outcome("rhai/c.rhai", Verdict::Error),
            ],
            notes: vec!["n".into()],
            profile: None,
            wall: Duration::from_secs(3),
        };
        let t = r.table(30);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.last().copied(), Some("1 passed, 2 failed"));
        assert!(lines[1].starts_with("python/a.py"), "{t}");
        assert!(lines[1].chars().count() < 80, "evidence not clipped: {t}");
        let md = r.markdown();
        assert!(md.contains("| `python/a.py` | process | escaped |"), "{md}");
        let j = r.to_json();
        assert_eq!(j["summary"]["escaped"], 1);
        assert_eq!(j["results"][0]["verdict"], "escaped");
        assert_eq!(j["results"][0]["time"], 1234);
    }
}
