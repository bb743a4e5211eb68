//! `cellbox run --warm --live-session`: a script run as the middle cell of a
//! live Python session, the way the escape suite attacks state processes.
//!
//! A first cell fills the session's state process with objects of several
//! kinds (so the script's cell is forked from a grown interpreter, as in a
//! notebook), the script runs in a cell forked from it, and a last cell runs
//! after it: whatever the script left in the state process (at-fork hooks,
//! finalizers, threads, patched modules) runs there, and its output is
//! appended to the script's so nothing it prints is hidden from the judge.

use crate::{CellRequest, CellResult, Language, Session, SessionConfig, Status, Supervisor};

/// The first cell: a namespace with objects JSON cannot hold.
const SETUP: &str = "\
import collections, re, threading
_cbx_counter = collections.Counter('abracadabra')
_cbx_pattern = re.compile(r'[a-z]+')
_cbx_lock = threading.Lock()
_cbx_gen = (i * i for i in range(10))
class _CbxThing:
    def __init__(self, n):
        self.n = n
_cbx_thing = _CbxThing(42)
";

/// The last cell: it reads the namespace back (so a state process the
/// script broke shows up as an error here, in the appended output).
const AFTER: &str = "print('cbx-after', _cbx_thing.n if '_cbx_thing' in globals() else None)\n";

/// A live session whose first cell has run.
pub struct Staged {
    session: Session,
    forward: crate::Forward,
}

impl Staged {
    /// Open the session and run its first cell. Fails (loudly) when the
    /// session is not live: the suite would otherwise attack the replay path
    /// and call it the state process.
    pub async fn open(sup: &Supervisor, config: SessionConfig) -> Result<Staged, String> {
        let session = sup
            .session(config)
            .map_err(|e| format!("--live-session: {e}"))?;
        let first = session.run(CellRequest::new(Language::Python, SETUP)).await;
        if first.status != Status::Ok {
            return Err(format!(
                "--live-session: the session's first cell failed ({}): {}",
                first.status.as_str(),
                first
                    .error
                    .as_ref()
                    .map(|e| e.message.as_str())
                    .unwrap_or("")
            ));
        }
        if !session.is_live().await {
            return Err(
                "--live-session: the session is not live (live sessions need warm zygotes and cgroups)"
                    .into(),
            );
        }
        Ok(Staged {
            session,
            forward: crate::Forward::No,
        })
    }

    /// Run the script's cell.
    pub async fn run(&mut self, request: CellRequest) -> CellResult {
        self.forward = request.forward;
        self.session.run(request).await
    }

    /// Run the last cell and append its output to the script's result.
    pub async fn finish(self, mut result: CellResult) -> CellResult {
        let mut request = CellRequest::new(Language::Python, AFTER);
        // Printed as it runs when the script's output was (the appended
        // text is then in the result for --json only).
        request.forward = self.forward;
        let after = self.session.run(request).await;
        for (into, from) in [
            (&mut result.stdout, &after.stdout),
            (&mut result.stderr, &after.stderr),
        ] {
            if !from.is_empty() {
                if !into.is_empty() && !into.ends_with('\n') {
                    into.push('\n');
                }
                into.push_str(from);
            }
        }
        result
            .notes
            .extend(after.notes.iter().map(|n| format!("the cell after: {n}")));
        if let Some(e) = &after.error {
            result.stderr.push_str(&format!(
                "cbx-after: {} {}: {}\n",
                after.status.as_str(),
                e.kind,
                e.message
            ));
        }
        result
    }
}
