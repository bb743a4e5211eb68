//! Cells whose worker is started before their code is known: its cell
//! cgroup made, its worker forked (from the Rhai fork server or a Python
//! zygote, or started fresh where there is none) and joined to its session's
//! and cell's groups, sandboxed, and waiting for its `start` frame. A
//! session that knows its next cell's language ahead (a session prepared
//! for a call that names none) keeps one, so that the call only sends the
//! code.
//!
//! A prepared worker has run nothing and holds nothing of a cell: only its
//! session's groups and scratch directory, and for a Rhai cell the
//! session's variables (sent ahead, see [`preload`]), which are its
//! session's alone,
//! so it is used by a cell of that session or ended with it (killed, its
//! cell group emptied), never handed to another session.

use super::launch::{Launch, Launched};
use super::{cell_group, settle_limits, CellSpec};
use crate::protocol::{encode_frame, Backend, Preload, ToWorker, DEFAULT_MAX_FRAME_BYTES};
use crate::supervisor::result::CellResult;
use crate::supervisor::tenancy::CellGroup;
use crate::supervisor::warm::ForkFor;
use crate::supervisor::{Inner, Language, Limits};
use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A cell's worker started ahead (see the module docs). Dropping it kills
/// the worker and empties its cell group, which may wait for the worker to
/// be gone: drop it off the runtime.
pub(crate) struct Prepared {
    language: Language,
    /// The limits it was prepared for, before the profile's ceiling: a cell
    /// that asks for others does not use it.
    asked: Limits,
    // Fields drop in order: the worker is killed (its guard) before the
    // last handle on its group empties it.
    launched: Launched,
    group: Option<Arc<CellGroup>>,
}

impl Prepared {
    /// Whether a `language` cell with `limits` (the session's and the
    /// call's, before the profile's ceiling) can run in it.
    pub(crate) fn fits(&self, language: Language, limits: &Limits) -> bool {
        self.language == language && self.asked == *limits
    }

    /// The language of the cell it was started for.
    pub(crate) fn language(&self) -> Language {
        self.language
    }

    /// Whether its worker is still there, waiting (it may have been killed
    /// from outside, or its parent may have gone).
    pub(crate) fn waiting(&self) -> bool {
        matches!(&self.launched.started.exit, Ok(w) if !w.has_exited())
    }

    /// Whether it was sent `vars` ahead (the same namespace, not an equal
    /// one: a namespace shared this way is never changed in place).
    pub(crate) fn holds(&self, vars: &Arc<crate::supervisor::Namespace>) -> bool {
        self.launched
            .preloaded
            .as_ref()
            .is_some_and(|p| same_namespace(p, vars))
    }

    /// Whether it was sent variables ahead, and not `vars`: a cell of its
    /// session would have to send them whole after all.
    pub(crate) fn holds_other(&self, vars: &Arc<crate::supervisor::Namespace>) -> bool {
        self.launched.preloaded.is_some() && !self.holds(vars)
    }

    pub(super) fn into_parts(self) -> (Option<Arc<CellGroup>>, Launched) {
        (self.group, self.launched)
    }
}

/// Whether `sent`, the variables a worker was sent ahead, are `vars`: the
/// same namespace, not an equal one. A session never changes a namespace
/// in place while it is shared, and a weak reference alone makes it move
/// (not copy) the namespace to change it, so the one it changes is
/// another; and the weak reference keeps the allocation, so no other
/// namespace is ever made at the same address.
pub(super) fn same_namespace(
    sent: &std::sync::Weak<crate::supervisor::Namespace>,
    vars: &Arc<crate::supervisor::Namespace>,
) -> bool {
    std::ptr::eq(sent.as_ptr(), Arc::as_ptr(vars))
}

/// Start the worker of a cell of `spec` (its code is not needed, and not
/// sent: the cell that uses it sends its own) in a cell group of its
/// session. `None` when it cannot be started now; the cell then starts its
/// worker itself, and says why if it cannot either.
pub(crate) async fn prepare(sup: Arc<Inner>, mut spec: CellSpec) -> Option<Prepared> {
    if sup.language_refusal(spec.language).is_some() {
        return None;
    }
    let asked = spec.limits.clone();
    settle_limits(&sup, &mut spec);
    let group = cell_group(&sup, &spec).ok()?;
    // Where the launch fails it says so here, in a result nobody reads.
    let mut scratch = CellResult::new(spec.language.as_str(), spec.run.clone());
    let launch = Launch::pick(&sup, &spec).await;
    let idle = sup.cells_running.load(std::sync::atomic::Ordering::Relaxed) == 0;
    let launched = launch
        .start(
            &sup,
            &spec,
            &mut scratch,
            Instant::now(),
            if idle {
                ForkFor::AheadIdle
            } else {
                ForkFor::Ahead
            },
            group.clone(),
        )
        .await;
    let mut launched = launched.ok().flatten();
    if let Some(l) = launched.as_mut() {
        if !preload(&spec, l).await {
            // Of no use now: ended with what it left in its group, below.
            launched = None;
        }
    }
    match launched {
        Some(launched) => Some(Prepared {
            language: spec.language,
            asked,
            launched,
            group,
        }),
        None => {
            // What a failed start left in the group is ended off the
            // runtime (emptying it may wait).
            if let Some(g) = group.filter(|g| !g.is_empty()) {
                let _ = tokio::task::spawn_blocking(move || drop(g)).await;
            }
            None
        }
    }
}

/// How long a worker started ahead may take to read its `preload` frame.
const PRELOAD_WITHIN: Duration = Duration::from_secs(5);

/// Send a forked Rhai worker the session's variables (`spec.vars`) in a
/// `preload` frame, which it makes into its cell's scope while it waits:
/// a cell of a session that holds large values then sends only its code.
/// Nothing is sent when there are none, to a worker that needs its
/// `setup` first, or when they do not fit a frame (the cell's `start`
/// carries them then). False when the worker did not take them: it is no
/// use then.
async fn preload(spec: &CellSpec, launched: &mut Launched) -> bool {
    let fits = spec.language == Language::Rhai
        && matches!(launched.backend, Backend::Rhai)
        && launched.plan.is_none()
        && !spec.vars.is_empty();
    if !fits {
        return true;
    }
    let vars = spec.vars.clone();
    let Ok(mut sock) = launched.sock.try_clone() else {
        return false;
    };
    // Encoded off the runtime too: a session holding megabytes would hold
    // up every other session's cells on this thread meanwhile.
    let frame = ToWorker::Preload(Preload { vars: vars.clone() });
    let sent = tokio::task::spawn_blocking(move || {
        let Ok(frame) = encode_frame(&frame, DEFAULT_MAX_FRAME_BYTES) else {
            return Ok(false);
        };
        sock.set_write_timeout(Some(PRELOAD_WITHIN))?;
        sock.write_all(&frame)?;
        sock.set_write_timeout(None).map(|()| true)
    })
    .await;
    match sent {
        Ok(Ok(true)) => {
            launched.preloaded = Some(Arc::downgrade(&vars));
            true
        }
        // Too large for a frame: the cell's `start` carries them.
        Ok(Ok(false)) => true,
        Ok(Err(e)) => {
            tracing::debug!("a worker started ahead did not take its session's variables: {e}");
            false
        }
        Err(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::same_namespace;
    use crate::supervisor::Namespace;
    use serde_json::{json, Value};
    use std::sync::Arc;

    #[test]
    fn a_namespace_sent_ahead_is_moved_not_copied_when_the_session_changes_it() {
        let mut vars: Arc<Namespace> = Arc::new(Namespace::new());
        Arc::make_mut(&mut vars).insert("big".into(), Value::String("x".repeat(1 << 20)));
        let text = |v: &Arc<Namespace>| v["big"].as_str().map(str::as_ptr);
        let before = text(&vars);
        let sent = Arc::downgrade(&vars);
        assert!(same_namespace(&sent, &vars));
        // A clone shares it; the session's copy-on-write change of a shared
        // one is a copy, and another namespace.
        let shared = vars.clone();
        assert!(same_namespace(&sent, &shared));
        Arc::make_mut(&mut vars).insert("n".into(), json!(1));
        assert!(!same_namespace(&sent, &vars));
        assert_ne!(text(&vars), before, "shared: copied");
        drop(shared);
        // Known weakly only, as a worker's preload is: changed without a
        // copy (the megabyte is moved, not cloned), and stale all the same.
        let mut vars: Arc<Namespace> = Arc::new((*vars).clone());
        let before = text(&vars);
        let sent = Arc::downgrade(&vars);
        Arc::make_mut(&mut vars).insert("n".into(), json!(2));
        assert_eq!(text(&vars), before, "held weakly: copied anyway");
        assert!(!same_namespace(&sent, &vars));
        assert_eq!(vars["n"], json!(2));
        // An unchanged one stays the same.
        let sent = Arc::downgrade(&vars);
        assert!(same_namespace(&sent, &vars.clone()));
    }
}
