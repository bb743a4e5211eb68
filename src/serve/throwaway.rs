//! Sessions for calls that name none. Each such call runs in a session of
//! its own that no other call sees; making one (its scratch tmpfs mounted)
//! and tearing it down (unmounted, its cgroup emptied and given back) is
//! done off the call's path: one session is prepared ahead (see
//! [`Session::prepare`]), and a call's
//! session is dropped on a blocking thread after its result is handed
//! back, which then prepares the next. A prepared session has run nothing:
//! its scratch is a new, empty tmpfs, so one call's files are never seen
//! by the next.

use crate::supervisor::{PythonState, Session, SessionConfig};
use crate::{CellRequest, CellResult, ErrorKind, RunInfo, Supervisor};
use std::sync::{Arc, Mutex};

/// The prepared session and what new ones are made from.
pub(crate) struct Throwaway {
    sup: Supervisor,
    config: SessionConfig,
    ready: Mutex<Option<Session>>,
}

impl Throwaway {
    pub(crate) fn new(sup: Supervisor, config: SessionConfig) -> Arc<Throwaway> {
        Arc::new(Throwaway {
            sup,
            // One cell has no next one to keep a live namespace for.
            config: SessionConfig {
                python_state: PythonState::Replay,
                ..config
            },
            ready: Mutex::new(None),
        })
    }

    /// Run one cell in a session of its own.
    pub(crate) async fn run(self: &Arc<Self>, request: CellRequest) -> CellResult {
        let session = match self.take() {
            Some(s) => s,
            None => match self.sup.session(self.config.clone()) {
                Ok(s) => s,
                Err(e) => {
                    return CellResult::refused_with(
                        request.language.as_str(),
                        RunInfo::root(),
                        ErrorKind::SandboxError,
                        e.to_string(),
                    )
                }
            },
        };
        let result = session.run(request).await;
        let me = self.clone();
        // The handle is dropped off this task: the last one tears the
        // session down (waiting for a cell's leftover processes to go).
        tokio::task::spawn_blocking(move || {
            drop(session);
            me.prepare();
        });
        result
    }

    fn take(&self) -> Option<Session> {
        self.ready.lock().ok()?.take()
    }

    /// Make the next call's session, its scratch mounted and its cgroup
    /// taken, unless one is ready.
    pub(crate) fn prepare(&self) {
        if self.ready.lock().map_or(true, |r| r.is_some()) {
            return;
        }
        let Ok(session) = self.sup.session(self.config.clone()) else {
            return;
        };
        session.prepare();
        if let Ok(mut r) = self.ready.lock() {
            if r.is_none() {
                *r = Some(session);
            }
        }
    }
}

impl Drop for Throwaway {
    fn drop(&mut self) {
        // The prepared session goes while `self.sup` still holds the
        // supervisor: its cgroup must be given back before the
        // supervisor's own groups are removed.
        if let Ok(mut r) = self.ready.lock() {
            drop(r.take());
        }
    }
}
