//! What the process has done, as Prometheus metrics (`serve --metrics`,
//! docs/service.md lists each one with its meaning).
//!
//! One registry per process: the supervisor counts cells, capability and
//! model calls and pool restarts where they happen; `serve` counts its tool
//! calls, sessions and admission refusals, and sets the gauges (cells
//! running and waiting, sessions open, pool sizes, the process's memory,
//! descriptors and threads) when it is scraped. Every label takes values
//! from a set the operator bounds: languages, statuses, error types,
//! capability, model, tool and principal names the configuration declares.
//! A name a cell or client made up is counted as `unknown`: no session id,
//! code, argument or free text is ever a label, and nothing secret is one.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;
use std::sync::LazyLock;

/// The `Content-Type` of [`Metrics::encode`]'s text.
pub const CONTENT_TYPE: &str = prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

/// The label value of a name the configuration does not declare.
pub const UNKNOWN: &str = "unknown";

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CellLabels {
    pub language: String,
    pub status: String,
    /// `fresh` (a worker of its own), `warm` (forked from the fork server
    /// or a zygote), `live` (a live Python session's namespace), `none`
    /// (refused before any worker ran it).
    pub path: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LanguageLabel {
    language: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PrincipalLabel {
    principal: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PoolLabel {
    pool: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RestartLabels {
    pool: &'static str,
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CapabilityLabels {
    capability: String,
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ModelLabels {
    model: String,
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TokenLabels {
    model: String,
    direction: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ModelLabel {
    model: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ToolLabels {
    tool: String,
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutputLabels {
    stream: &'static str,
    fate: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabel {
    kind: &'static str,
}

type SecondsHistograms = Family<LanguageLabel, Histogram, fn() -> Histogram>;

/// Cell and queue times: 5 ms to about 80 s, doubling.
fn seconds_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.005, 2.0, 15))
}

/// Every metric of the process (see the module documentation).
pub struct Metrics {
    registry: Registry,
    cells: Family<CellLabels, Counter>,
    cell_seconds: SecondsHistograms,
    queue_seconds: Histogram,
    cells_running: Gauge,
    calls_waiting: Gauge,
    sessions_open: Family<PrincipalLabel, Gauge>,
    sessions_created: Counter,
    sessions_expired: Counter,
    sessions_closed: Counter,
    pool_workers: Family<PoolLabel, Gauge>,
    pool_restarts: Family<RestartLabels, Counter>,
    capability_calls: Family<CapabilityLabels, Counter>,
    model_calls: Family<ModelLabels, Counter>,
    model_tokens: Family<TokenLabels, Counter>,
    model_cost: Family<ModelLabel, Counter<f64, AtomicU64>>,
    tool_calls: Family<ToolLabels, Counter>,
    output_bytes: Family<OutputLabels, Counter>,
    refusals: Family<KindLabel, Counter>,
    resident_bytes: Gauge,
    open_fds: Gauge,
    threads: Gauge,
    cells_memory_bytes: Gauge,
}

static METRICS: LazyLock<Metrics> = LazyLock::new(Metrics::new);

/// The process's metrics.
pub fn get() -> &'static Metrics {
    &METRICS
}

/// How a pool worker came to be replaced.
#[derive(Debug, Clone, Copy)]
pub enum Restart {
    /// Found dead.
    Dead,
    /// It stopped answering in time.
    Stalled,
    /// Its cell count or age was reached.
    Retired,
}

/// Which warm pool.
#[derive(Debug, Clone, Copy)]
pub enum Pool {
    RhaiForkServer,
    PythonZygote,
}

impl Pool {
    fn as_str(self) -> &'static str {
        match self {
            Pool::RhaiForkServer => "rhai_fork_server",
            Pool::PythonZygote => "python_zygote",
        }
    }
}

/// What the warm pools hold, for the gauges.
#[derive(Debug, Clone, Copy, Default)]
pub struct PoolSizes {
    pub rhai_fork_servers: usize,
    pub rhai_spares: usize,
    pub python_zygotes: usize,
    pub prepared_sessions: usize,
}

/// A capability call's outcome as a label: one of a fixed set.
fn call_outcome(outcome: &str) -> &'static str {
    match outcome {
        "ok" => "ok",
        "budget" => "budget",
        "unknown" => "unknown",
        "denied" => "denied",
        "invalid_args" => "invalid_args",
        "limit" => "limit",
        "failed" => "failed",
        _ => "other",
    }
}

impl Metrics {
    fn new() -> Metrics {
        let mut registry = Registry::default();
        let m = Metrics {
            cells: Family::default(),
            cell_seconds: Family::new_with_constructor(seconds_histogram),
            queue_seconds: seconds_histogram(),
            cells_running: Gauge::default(),
            calls_waiting: Gauge::default(),
            sessions_open: Family::default(),
            sessions_created: Counter::default(),
            sessions_expired: Counter::default(),
            sessions_closed: Counter::default(),
            pool_workers: Family::default(),
            pool_restarts: Family::default(),
            capability_calls: Family::default(),
            model_calls: Family::default(),
            model_tokens: Family::default(),
            model_cost: Family::default(),
            tool_calls: Family::default(),
            output_bytes: Family::default(),
            refusals: Family::default(),
            resident_bytes: Gauge::default(),
            open_fds: Gauge::default(),
            threads: Gauge::default(),
            cells_memory_bytes: Gauge::default(),
            registry: Registry::default(),
        };
        registry.register(
            "cellbox_cells",
            "Cells ended, by language, status and path (fresh, warm, live, none)",
            m.cells.clone(),
        );
        registry.register(
            "cellbox_cell_duration_seconds",
            "Wall time of each cell, by language",
            m.cell_seconds.clone(),
        );
        registry.register(
            "cellbox_queue_wait_seconds",
            "Time each execute_code call waited for a free slot",
            m.queue_seconds.clone(),
        );
        registry.register(
            "cellbox_cells_running",
            "Cells running now (sub-cells included)",
            m.cells_running.clone(),
        );
        registry.register(
            "cellbox_calls_waiting",
            "Calls admitted and waiting for a free slot",
            m.calls_waiting.clone(),
        );
        registry.register(
            "cellbox_sessions_open",
            "Named sessions open, by principal",
            m.sessions_open.clone(),
        );
        registry.register(
            "cellbox_sessions_created",
            "Named sessions created",
            m.sessions_created.clone(),
        );
        registry.register(
            "cellbox_sessions_expired",
            "Named sessions closed after idling past the expiry",
            m.sessions_expired.clone(),
        );
        registry.register(
            "cellbox_sessions_closed",
            "Named sessions closed by their client or at shutdown",
            m.sessions_closed.clone(),
        );
        registry.register(
            "cellbox_pool_workers",
            "Warm workers: rhai_fork_server, rhai_spares, python_zygotes, prepared_sessions",
            m.pool_workers.clone(),
        );
        registry.register(
            "cellbox_pool_restarts",
            "Warm workers replaced, by pool and reason (dead, stalled, retired)",
            m.pool_restarts.clone(),
        );
        registry.register(
            "cellbox_capability_calls",
            "Capability calls made by cells, by capability and outcome",
            m.capability_calls.clone(),
        );
        registry.register(
            "cellbox_model_calls",
            "Model queries made by cells, by configured model and outcome",
            m.model_calls.clone(),
        );
        registry.register(
            "cellbox_model_tokens",
            "Model tokens charged, by configured model and direction (input, output)",
            m.model_tokens.clone(),
        );
        registry.register(
            "cellbox_model_cost",
            "Model cost charged, in the configured price unit, by configured model",
            m.model_cost.clone(),
        );
        registry.register(
            "cellbox_tool_calls",
            "MCP tool calls answered, by tool and outcome (ok, error, refused, cancelled)",
            m.tool_calls.clone(),
        );
        registry.register(
            "cellbox_output_bytes",
            "Bytes cells wrote to stdout and stderr, by stream and fate (kept, dropped)",
            m.output_bytes.clone(),
        );
        registry.register(
            "cellbox_refusals",
            "Calls and cells refused or stopped by a limit or the policy, by kind",
            m.refusals.clone(),
        );
        registry.register(
            "process_resident_memory_bytes",
            "Resident memory of the server process",
            m.resident_bytes.clone(),
        );
        registry.register(
            "process_open_fds",
            "Open file descriptors of the server process",
            m.open_fds.clone(),
        );
        registry.register(
            "process_threads",
            "Threads of the server process",
            m.threads.clone(),
        );
        registry.register(
            "cellbox_cells_memory_bytes",
            "Memory in use by cells and sessions (their memory cgroup), warm workers included",
            m.cells_memory_bytes.clone(),
        );
        Metrics { registry, ..m }
    }

    /// The registry in the Prometheus text exposition format.
    pub fn encode(&self) -> String {
        let mut text = String::new();
        if let Err(e) =
            prometheus_client::encoding::prometheus_text::encode(&mut text, &self.registry)
        {
            tracing::warn!("failed to encode the metrics: {e}");
        }
        text
    }

    /// A cell ended (or was refused before it ran: `path` `none`).
    pub fn cell(&self, labels: CellLabels, wall_ms: u64) {
        let language = labels.language.clone();
        self.cells.get_or_create(&labels).inc();
        if labels.path != "none" {
            self.cell_seconds
                .get_or_create(&LanguageLabel { language })
                .observe(wall_ms as f64 / 1000.0);
        }
    }

    /// What a cell wrote to `stream`: `total` bytes, `kept` of them kept.
    pub fn output(&self, stream: &'static str, total: u64, kept: u64) {
        let kept = kept.min(total);
        for (fate, n) in [("kept", kept), ("dropped", total - kept)] {
            if n > 0 {
                self.output_bytes
                    .get_or_create(&OutputLabels { stream, fate })
                    .inc_by(n);
            }
        }
    }

    /// A call or cell refused, or stopped by a limit or the policy.
    pub fn refusal(&self, kind: &'static str) {
        self.refusals.get_or_create(&KindLabel { kind }).inc();
    }

    /// An `execute_code` call waited `secs` for its slot.
    pub fn queued(&self, secs: f64) {
        self.queue_seconds.observe(secs);
    }

    pub fn session_created(&self) {
        self.sessions_created.inc();
    }

    pub fn sessions_expired(&self, n: u64) {
        self.sessions_expired.inc_by(n);
    }

    pub fn sessions_closed(&self, n: u64) {
        self.sessions_closed.inc_by(n);
    }

    /// A pool worker was replaced.
    pub fn pool_restart(&self, pool: Pool, why: Restart) {
        let reason = match why {
            Restart::Dead => "dead",
            Restart::Stalled => "stalled",
            Restart::Retired => "retired",
        };
        self.pool_restarts
            .get_or_create(&RestartLabels {
                pool: pool.as_str(),
                reason,
            })
            .inc();
    }

    /// A capability call answered. `capability`: a registered name (or
    /// `SERVER.*` of a declared tool server), else [`UNKNOWN`].
    pub fn capability_call(&self, capability: String, outcome: &str) {
        let outcome = call_outcome(outcome);
        self.capability_calls
            .get_or_create(&CapabilityLabels {
                capability,
                outcome,
            })
            .inc();
        match outcome {
            "denied" => self.refusal("call_denied"),
            "budget" => self.refusal("call_budget"),
            "limit" => self.refusal("call_limit"),
            _ => {}
        }
    }

    /// A model query ended; what was charged for it.
    pub fn model_call(&self, model: &str, ok: bool, input: u64, output: u64, cost: f64) {
        let model = model.to_owned();
        let outcome = if ok { "ok" } else { "failed" };
        self.model_calls
            .get_or_create(&ModelLabels {
                model: model.clone(),
                outcome,
            })
            .inc();
        for (direction, n) in [("input", input), ("output", output)] {
            self.model_tokens
                .get_or_create(&TokenLabels {
                    model: model.clone(),
                    direction,
                })
                .inc_by(n);
        }
        if cost.is_finite() && cost > 0.0 {
            self.model_cost
                .get_or_create(&ModelLabel { model })
                .inc_by(cost);
        }
    }

    /// An MCP tool call answered. `tool`: a listed tool, else [`UNKNOWN`].
    pub fn tool_call(&self, tool: String, outcome: &'static str) {
        self.tool_calls
            .get_or_create(&ToolLabels { tool, outcome })
            .inc();
    }

    /// The gauges `serve` sets when it is scraped.
    pub fn set_load(&self, running: usize, waiting: usize) {
        self.cells_running.set(running as i64);
        self.calls_waiting.set(waiting as i64);
    }

    /// Sessions open now, by principal (a principal with none is dropped).
    pub fn set_sessions_open(&self, by_principal: impl IntoIterator<Item = (String, usize)>) {
        self.sessions_open.clear();
        for (principal, n) in by_principal {
            self.sessions_open
                .get_or_create(&PrincipalLabel { principal })
                .set(n as i64);
        }
    }

    pub fn set_pools(&self, p: PoolSizes) {
        for (pool, n) in [
            ("rhai_fork_server", p.rhai_fork_servers),
            ("rhai_spares", p.rhai_spares),
            ("python_zygotes", p.python_zygotes),
            ("prepared_sessions", p.prepared_sessions),
        ] {
            self.pool_workers
                .get_or_create(&PoolLabel { pool })
                .set(n as i64);
        }
    }

    /// The process's own use, from `/proc/self`, and what the cells' memory
    /// cgroup holds (when there is one).
    pub fn set_process(&self, cells_memory: Option<u64>) {
        let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        let field = |name: &str| -> Option<i64> {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))?
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        };
        if let Some(kb) = field("VmRSS:") {
            self.resident_bytes.set(kb.saturating_mul(1024));
        }
        if let Some(n) = field("Threads:") {
            self.threads.set(n);
        }
        if let Ok(dir) = std::fs::read_dir("/proc/self/fd") {
            // The listing's own descriptor is one of them.
            self.open_fds
                .set((dir.count() as i64).saturating_sub(1).max(0));
        }
        if let Some(b) = cells_memory {
            self.cells_memory_bytes
                .set(i64::try_from(b).unwrap_or(i64::MAX));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_text_names_every_family_and_counts_what_was_recorded() {
        let m = Metrics::new();
        m.cell(
            CellLabels {
                language: "rhai".into(),
                status: "ok".into(),
                path: "warm",
            },
            12,
        );
        m.capability_call("emit".into(), "denied");
        m.capability_call(UNKNOWN.into(), "something a cell said");
        m.output("stdout", 10, 4);
        let text = m.encode();
        assert!(
            text.contains(r#"cellbox_cells_total{language="rhai",status="ok",path="warm"} 1"#),
            "{text}"
        );
        assert!(text.contains(r#"cellbox_refusals_total{kind="call_denied"} 1"#));
        assert!(text
            .contains(r#"cellbox_capability_calls_total{capability="unknown",outcome="other"} 1"#));
        assert!(text.contains(r#"cellbox_output_bytes_total{stream="stdout",fate="dropped"} 6"#));
        assert!(text.contains("# TYPE cellbox_cell_duration_seconds histogram"));
    }
}
