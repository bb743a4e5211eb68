//! The server's named sessions: ids, a cap on how many exist, idle expiry.
//!
//! A session keeps its namespace and scratch directory between calls (that
//! is [`crate::Session`]'s job); this table only decides which sessions
//! exist. Ids are random (128 bits from the kernel), so on a shared HTTP
//! listener one client cannot guess another's session.
//!
//! Every session belongs to the principal that created it. To any other
//! principal it does not exist: every operation on it answers exactly as
//! for an id that never existed, and listings leave it out.

use super::principal::Principal;
use crate::{Session, SessionConfig, Supervisor};
use serde::Serialize;
use std::collections::HashMap;
use std::io::Read;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio_util::sync::CancellationToken;

/// Why a session operation failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SessionError {
    #[error(
        "no session {id:?}: it was closed, expired after {idle_secs} s without a call, or never \
         existed; create one with create_session"
    )]
    Unknown { id: String, idle_secs: u64 },
    #[error(
        "the session limit of {max} is reached; close a session with close_session (idle \
         sessions also expire after {idle_secs} s)"
    )]
    Full { max: usize, idle_secs: u64 },
    #[error(
        "you hold {max} sessions, the most one client may hold at once; close one with \
         close_session (idle sessions also expire after {idle_secs} s)"
    )]
    PrincipalFull { max: usize, idle_secs: u64 },
    #[error("failed to create a session: {0}")]
    Create(String),
}

struct Entry {
    owner: Principal,
    session: Session,
    created_unix_ms: u64,
    last_used: Instant,
    /// Calls holding this session right now; a busy session never expires.
    busy: usize,
    /// Cancelled when the session is closed, ending any cell running in it.
    closed: CancellationToken,
    /// Calls on one session run one at a time, in arrival order.
    lane: Arc<tokio::sync::Mutex<()>>,
}

/// What `list_sessions` reports about one session.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SessionInfo {
    pub session_id: String,
    pub created_unix_ms: u64,
    pub idle_seconds: u64,
    pub expires_in_seconds: u64,
    pub busy: bool,
    pub execution_count: u64,
    pub variables: Vec<String>,
    /// Its Python namespace is alive in a state process (every object).
    pub live: bool,
    /// Its checkpoints (see `checkpoint_session`).
    pub checkpoints: Vec<String>,
    /// Memory it holds now: its processes, live namespace, checkpoints
    /// and files (absent where sessions have no cgroup).
    pub memory_bytes: Option<u64>,
    /// Bytes the server holds for it in its own memory, and the most it
    /// may (see `crate::supervisor::tenant`).
    pub held_bytes: u64,
    pub max_held_bytes: u64,
}

/// A session handed to one call. Dropping it marks the session idle again.
pub struct Lease {
    table: Arc<TableInner>,
    id: String,
    pub session: Session,
    pub closed: CancellationToken,
    pub lane: Arc<tokio::sync::Mutex<()>>,
}

impl Drop for Lease {
    fn drop(&mut self) {
        let mut map = self.table.lock();
        if let Some(e) = map.get_mut(&self.id) {
            e.busy = e.busy.saturating_sub(1);
            e.last_used = Instant::now();
        }
    }
}

struct TableInner {
    map: Mutex<HashMap<String, Entry>>,
    max: usize,
    max_per_principal: usize,
    idle: Duration,
}

impl TableInner {
    fn lock(&self) -> MutexGuard<'_, HashMap<String, Entry>> {
        crate::util::lock(&self.map)
    }
}

/// All named sessions of one server.
#[derive(Clone)]
pub struct SessionTable {
    inner: Arc<TableInner>,
    sup: Supervisor,
    config: SessionConfig,
}

impl std::fmt::Debug for SessionTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionTable")
            .field("max", &self.inner.max)
            .field("max_per_principal", &self.inner.max_per_principal)
            .field("idle", &self.inner.idle)
            .finish_non_exhaustive()
    }
}

fn now_unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// A new unguessable session id.
fn new_id() -> Result<String, String> {
    let mut bytes = [0u8; 16];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .map_err(|e| format!("failed to read /dev/urandom for a session id: {e}"))?;
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    Ok(format!("s-{hex}"))
}

impl SessionTable {
    pub fn new(
        sup: Supervisor,
        config: SessionConfig,
        max: usize,
        max_per_principal: usize,
        idle: Duration,
    ) -> Self {
        SessionTable {
            inner: Arc::new(TableInner {
                map: Mutex::new(HashMap::new()),
                max,
                max_per_principal,
                idle,
            }),
            sup,
            // A named session runs one cell after another: each next
            // cell's worker is started once the last is over.
            config: SessionConfig {
                prepare_next: true,
                ..config
            },
        }
    }

    pub fn max(&self) -> usize {
        self.inner.max
    }

    /// Sessions one principal may hold at once.
    pub fn max_per_principal(&self) -> usize {
        self.inner.max_per_principal
    }

    fn unknown(&self, id: &str) -> SessionError {
        SessionError::Unknown {
            id: id.to_owned(),
            idle_secs: self.idle_secs(),
        }
    }

    pub fn idle_expiry(&self) -> Duration {
        self.inner.idle
    }

    fn idle_secs(&self) -> u64 {
        self.inner.idle.as_secs()
    }

    /// Create a session for `owner` (its cells run under `account`), after
    /// dropping expired ones.
    pub fn create(
        &self,
        owner: &Principal,
        account: crate::Account,
    ) -> Result<String, SessionError> {
        self.sweep();
        let mut map = self.inner.lock();
        // The server-wide cap first: with one principal it is the one hit.
        if map.len() >= self.inner.max {
            return Err(SessionError::Full {
                max: self.inner.max,
                idle_secs: self.idle_secs(),
            });
        }
        let held = map.values().filter(|e| e.owner == *owner).count();
        if held >= self.inner.max_per_principal {
            return Err(SessionError::PrincipalFull {
                max: self.inner.max_per_principal,
                idle_secs: self.idle_secs(),
            });
        }
        let session = self
            .sup
            .session(SessionConfig {
                account,
                ..self.config.clone()
            })
            .map_err(|e| SessionError::Create(e.to_string()))?;
        let id = new_id().map_err(SessionError::Create)?;
        crate::metrics::get().session_created();
        map.insert(
            id.clone(),
            Entry {
                owner: owner.clone(),
                session,
                created_unix_ms: now_unix_ms(),
                last_used: Instant::now(),
                busy: 0,
                closed: CancellationToken::new(),
                lane: Arc::new(tokio::sync::Mutex::new(())),
            },
        );
        Ok(id)
    }

    /// Take one of `owner`'s sessions for one call.
    pub fn lease(&self, owner: &Principal, id: &str) -> Result<Lease, SessionError> {
        self.sweep();
        let mut map = self.inner.lock();
        let e = map
            .get_mut(id)
            .filter(|e| e.owner == *owner)
            .ok_or_else(|| self.unknown(id))?;
        e.busy += 1;
        e.last_used = Instant::now();
        Ok(Lease {
            table: self.inner.clone(),
            id: id.to_owned(),
            session: e.session.clone(),
            closed: e.closed.clone(),
            lane: e.lane.clone(),
        })
    }

    /// Forget a session's variables and definitions (its files stay).
    pub async fn reset(&self, owner: &Principal, id: &str) -> Result<(), SessionError> {
        let lease = self.lease(owner, id)?;
        lease.session.reset().await;
        Ok(())
    }

    /// Keep a checkpoint of a session's live Python namespace.
    pub async fn checkpoint(
        &self,
        owner: &Principal,
        id: &str,
        name: &str,
    ) -> Result<Result<(), crate::Error>, SessionError> {
        let lease = self.lease(owner, id)?;
        let _turn = lease.lane.clone().lock_owned().await;
        Ok(lease.session.checkpoint(name).await)
    }

    /// Return a session's live Python namespace to one of its checkpoints.
    pub async fn restore(
        &self,
        owner: &Principal,
        id: &str,
        name: &str,
    ) -> Result<Result<(), crate::Error>, SessionError> {
        let lease = self.lease(owner, id)?;
        let _turn = lease.lane.clone().lock_owned().await;
        Ok(lease.session.restore(name).await)
    }

    /// Close a session: a cell running in it is killed, its scratch
    /// directory is removed once the last call lets go of it.
    pub fn close(&self, owner: &Principal, id: &str) -> Result<(), SessionError> {
        let entry = {
            let mut map = self.inner.lock();
            match map.get(id) {
                Some(e) if e.owner == *owner => map.remove(id),
                _ => None,
            }
        }
        .ok_or_else(|| self.unknown(id))?;
        crate::metrics::get().sessions_closed(1);
        entry.closed.cancel();
        Ok(())
    }

    /// Close every session (server shutdown).
    pub fn close_all(&self) {
        let entries: Vec<Entry> = self.inner.lock().drain().map(|(_, e)| e).collect();
        crate::metrics::get().sessions_closed(entries.len() as u64);
        for e in entries {
            e.closed.cancel();
        }
    }

    /// Drop sessions idle longer than the expiry. Returns how many went.
    pub fn sweep(&self) -> usize {
        let idle = self.inner.idle;
        let expired: Vec<Entry> = {
            let mut map = self.inner.lock();
            let ids: Vec<String> = map
                .iter()
                .filter(|(_, e)| e.busy == 0 && e.last_used.elapsed() >= idle)
                .map(|(k, _)| k.clone())
                .collect();
            ids.iter().filter_map(|k| map.remove(k)).collect()
        };
        crate::metrics::get().sessions_expired(expired.len() as u64);
        for e in &expired {
            tracing::info!(session = e.session.id(), "session expired after idling");
            e.closed.cancel();
        }
        expired.len()
    }

    pub fn len(&self) -> usize {
        self.inner.lock().len()
    }

    /// How many sessions each principal holds (those holding one or more).
    pub fn open_by_principal(&self) -> Vec<(String, usize)> {
        let mut by: std::collections::BTreeMap<String, usize> = Default::default();
        for e in self.inner.lock().values() {
            *by.entry(e.owner.name().to_owned()).or_default() += 1;
        }
        by.into_iter().collect()
    }

    /// Sessions `owner` holds.
    pub fn held_by(&self, owner: &Principal) -> usize {
        self.inner
            .lock()
            .values()
            .filter(|e| e.owner == *owner)
            .count()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// `owner`'s live sessions, oldest first.
    pub async fn list(&self, owner: &Principal) -> Vec<SessionInfo> {
        self.sweep();
        let snapshot: Vec<(String, Session, u64, Duration, bool)> = self
            .inner
            .lock()
            .iter()
            .filter(|(_, e)| e.owner == *owner)
            .map(|(k, e)| {
                (
                    k.clone(),
                    e.session.clone(),
                    e.created_unix_ms,
                    e.last_used.elapsed(),
                    e.busy > 0,
                )
            })
            .collect();
        let mut out = Vec::with_capacity(snapshot.len());
        for (id, session, created, idle_for, busy) in snapshot {
            // A busy session's state lock is held by its running cell; do
            // not wait for it.
            let peek = async {
                let names = session.var_names().await;
                (
                    session.execution_count().await,
                    names,
                    session.is_live().await,
                    session.checkpoints().await,
                    session.held_bytes().await.0,
                )
            };
            let idle_state = || (0, Vec::new(), false, Vec::new(), 0);
            let (busy, (count, variables, live, checkpoints, held)) = if busy {
                (true, idle_state())
            } else {
                match tokio::time::timeout(Duration::from_millis(200), peek).await {
                    Ok(state) => (false, state),
                    Err(_) => (true, idle_state()),
                }
            };
            out.push(SessionInfo {
                session_id: id,
                created_unix_ms: created,
                idle_seconds: if busy { 0 } else { idle_for.as_secs() },
                expires_in_seconds: if busy {
                    self.inner.idle.as_secs()
                } else {
                    self.inner.idle.saturating_sub(idle_for).as_secs()
                },
                busy,
                execution_count: count,
                variables,
                live,
                checkpoints,
                memory_bytes: session.memory_bytes(),
                held_bytes: held,
                max_held_bytes: session.config().max_held_bytes,
            });
        }
        out.sort_by(|a, b| {
            a.created_unix_ms
                .cmp(&b.created_unix_ms)
                .then(a.session_id.cmp(&b.session_id))
        });
        out
    }
}
