//! A cell's result printed for a person (`cellbox run` without `--json`,
//! the REPL): its output, its value, its answer on stdout; truncation
//! notes, the error and dropped variables on stderr. Every text is
//! escaped for the terminal (see [`crate::terminal`]).

use crate::terminal::escape;
use crate::{CellResult, Truncation};
use std::io::Write;

/// Print a result for a person: output, the value (Python's repr for a
/// Python cell), the answer, the error. `in_session`: the cell ran in a
/// session that goes on (the REPL), so values it could not keep are worth
/// a warning; a one-shot run keeps nothing anyway. `streamed`: the cell ran
/// with [`Forward::Head`](crate::Forward::Head), so the head of its output is on the terminal
/// already and only the rest (omitted count, tail) is printed.
pub fn print_result(r: &CellResult, in_session: bool, streamed: bool) {
    let mut out = std::io::stdout().lock();
    let stdout = if streamed {
        unshown(&r.stdout, r.truncated.stdout.as_ref())
    } else {
        &r.stdout
    };
    let _ = out.write_all(escape(stdout).as_bytes());
    if !r.stdout.is_empty() && !r.stdout.ends_with('\n') {
        let _ = out.write_all(b"\n");
    }
    print_value_and_answer(&mut out, r);
    let _ = out.flush();
    let mut err = std::io::stderr().lock();
    let stderr = if streamed {
        unshown(&r.stderr, r.truncated.stderr.as_ref())
    } else {
        &r.stderr
    };
    let _ = err.write_all(escape(stderr).as_bytes());
    print_notes(&mut err, r, in_session);
}

/// What of a captured stream was not shown as it came: nothing when all of
/// it was kept; else the omission mark and the tail after the head.
fn unshown<'a>(text: &'a str, truncated: Option<&Truncation>) -> &'a str {
    let Some(t) = truncated else { return "" };
    let omitted = t.total_bytes - t.kept_head - t.kept_tail;
    let mark = format!("\n[... {omitted} bytes omitted ...]\n");
    let head = usize::try_from(t.kept_head).unwrap_or(usize::MAX);
    match text.get(head..) {
        Some(rest) if rest.starts_with(&mark) => rest,
        // The head was not valid UTF-8 (its text is longer than its bytes).
        _ => text.find(&mark).map_or("", |i| &text[i..]),
    }
}

/// The value (Python's repr when the cell gave one) and the answer.
fn print_value_and_answer(out: &mut impl Write, r: &CellResult) {
    match &r.value_repr {
        Some(repr) => {
            let _ = writeln!(out, "{}", escape(repr));
        }
        None if !r.value.is_null() => {
            let _ = writeln!(out, "{}", escape(&r.value.to_string()));
        }
        None => {}
    }
    if let Some(a) = &r.final_answer {
        let _ = writeln!(out, "answer: {}", escape(&a.to_string()));
    }
}

/// Truncation notes, the error and, in a session, dropped variables.
fn print_notes(err: &mut impl Write, r: &CellResult, in_session: bool) {
    if let Some(t) = &r.truncated.stdout {
        let _ = writeln!(
            err,
            "cellbox: stdout truncated: {} bytes in total, kept the first {} and the last {}",
            t.total_bytes, t.kept_head, t.kept_tail
        );
    }
    if let Some(t) = &r.truncated.stderr {
        let _ = writeln!(
            err,
            "cellbox: stderr truncated: {} bytes in total, kept the first {} and the last {}",
            t.total_bytes, t.kept_head, t.kept_tail
        );
    }
    if let Some(e) = &r.error {
        if let Some(tb) = &e.traceback {
            let _ = writeln!(err, "{}", escape(tb.trim_end()));
        }
        let pos = match (e.line, e.column) {
            (Some(l), Some(c)) => format!(" (line {l}, column {c})"),
            (Some(l), None) => format!(" (line {l})"),
            _ => String::new(),
        };
        let _ = writeln!(
            err,
            "{}: {}{} [{}]",
            escape(&e.kind),
            escape(&e.message),
            pos,
            r.status
        );
    }
    if in_session {
        for d in &r.vars.dropped {
            let _ = writeln!(
                err,
                "cellbox: variable {} ({}) was not kept: {}",
                escape(&d.name),
                escape(&d.type_name),
                escape(&d.reason)
            );
        }
    }
}
