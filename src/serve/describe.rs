//! Tool descriptions, generated from what this server actually enforces:
//! the configured languages, profiles, limits, capability policy and session
//! settings, plus the sandbox a probe cell of each language really got (the
//! layers and namespaces in its result's `sandbox` report). Nothing here is
//! a fixed claim about isolation: if a host cannot give a cell its own
//! network namespace, the description says the network is not isolated.

use super::config::Settings;
use crate::profiles::{PathAccess, Profile};
use crate::sandbox::{Layer, SandboxReport};
use crate::{CellRequest, Language, PythonInfo, Status, Supervisor};
use serde_json::Value;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

/// What a probe cell of one language reported.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Observed {
    /// The sandbox the probe got, if the worker got that far.
    pub sandbox: Option<SandboxReport>,
    /// Why the probe did not end `ok`, if it did not.
    pub failure: Option<String>,
}

/// Probe results for every enabled language.
pub type Observations = BTreeMap<Language, Observed>;

/// The smallest cell of each language.
fn probe_code(language: Language) -> &'static str {
    match language {
        Language::Rhai => "()",
        Language::Python => "None",
        Language::Shell | Language::Bash => "true",
    }
}

/// Run one trivial cell per enabled language, all at once, and keep each
/// one's sandbox report. The first `tools/list` waits for this, and the
/// Python probe waits for a zygote to start: run one after another, the
/// other languages' cells added their time to it.
pub async fn probe(sup: &Supervisor, settings: &Settings) -> Observations {
    let mut probes = tokio::task::JoinSet::new();
    for &language in &settings.languages {
        let sup = sup.clone();
        let session = settings.session.clone();
        probes.spawn(async move { (language, probe_one(&sup, language, session).await) });
    }
    let mut out = BTreeMap::new();
    while let Some(joined) = probes.join_next().await {
        match joined {
            Ok((language, observed)) => {
                out.insert(language, observed);
            }
            Err(e) => tracing::warn!("a probe cell's task ended early: {e}"),
        }
    }
    // A probe whose task ended early (it panicked) says so like a failed cell.
    for &language in &settings.languages {
        out.entry(language).or_insert_with(|| Observed {
            sandbox: None,
            failure: Some("its test cell did not finish".to_owned()),
        });
    }
    out
}

async fn probe_one(
    sup: &Supervisor,
    language: Language,
    session: crate::SessionConfig,
) -> Observed {
    let req = CellRequest::new(language, probe_code(language)).timeout(Duration::from_secs(20));
    // A probe is no sign of calls to come: nothing is prepared after it.
    let r = sup.run_unprepared(req, session).await;
    let failure = (r.status != Status::Ok).then(|| {
        let msg = r
            .error
            .as_ref()
            .map(|e| format!("{}: {}", e.kind, e.message))
            .unwrap_or_default();
        format!("a test cell ended with status {}: {msg}", r.status)
    });
    if let Some(f) = &failure {
        tracing::warn!("{language} cells may not work on this host: {f}");
    }
    Observed {
        sandbox: r.sandbox,
        failure,
    }
}

/// A capability's description without the call signature it may start
/// with (`name(a, b=None): does this`), which the list shows already.
fn without_signature<'a>(name: &str, desc: &'a str) -> &'a str {
    match desc.strip_prefix(name) {
        Some(rest) if rest.starts_with('(') => rest.split_once("): ").map_or(desc, |(_, d)| d),
        _ => desc,
    }
}

/// A description's first sentence (up to the first ". " or the end).
pub fn first_sentence(text: &str) -> &str {
    match text.find(". ") {
        Some(i) => &text[..=i],
        None => text,
    }
}

fn bytes(n: u64) -> String {
    const KIB: u64 = 1024;
    const MIB: u64 = 1024 * KIB;
    const GIB: u64 = 1024 * MIB;
    if n >= GIB && n.is_multiple_of(GIB) {
        format!("{} GiB", n / GIB)
    } else if n >= MIB && n.is_multiple_of(MIB) {
        format!("{} MiB", n / MIB)
    } else if n >= KIB && n.is_multiple_of(KIB) {
        format!("{} KiB", n / KIB)
    } else {
        format!("{n} bytes")
    }
}

fn seconds(ms: u64) -> String {
    if ms.is_multiple_of(1000) {
        format!("{} s", ms / 1000)
    } else {
        format!("{:.3} s", ms as f64 / 1000.0)
    }
}

/// How a language's code is run, and what `value` means for it.
fn language_line(language: Language, python: &Result<PythonInfo, NoPython>) -> String {
    match language {
        Language::Rhai => "rhai: a Rhai script; `value` is its last expression, print() writes to \
                           stdout."
            .to_owned(),
        Language::Python => {
            let interp = match python {
                Ok(p) => format!("interpreter {}", p.executable.display()),
                Err(e) => format!("no interpreter available: {e}"),
            };
            format!(
                "python: Python 3 ({interp}); `value` is the last expression's value, print() \
                 writes to stdout, an exception is returned as `error` with its traceback. \
                 Imports: the standard library only (json, math, statistics, re, datetime, \
                 collections, itertools, ...); no third-party packages (numpy, pandas, requests \
                 and the like are not installed for cells: the interpreter runs isolated, \
                 without site-packages)."
            )
        }
        Language::Shell => "shell: run by /bin/sh -c; stdout and stderr are returned, an exit \
                            status other than 0 is an error."
            .to_owned(),
        Language::Bash => "bash: run by /bin/bash -c under the shell profile, as shell is; shell \
                           variables do not carry over to the next call, files in a session do."
            .to_owned(),
    }
}

/// The host paths a profile shows a cell, grouped by access, skipping
/// optional paths this host does not have.
fn paths_text(profile: &Profile, language: Language) -> String {
    let mut read = Vec::new();
    let mut exec = Vec::new();
    let mut write = Vec::new();
    for rule in &profile.filesystem.paths {
        if rule.optional && std::fs::symlink_metadata(&rule.path).is_err() {
            continue;
        }
        let shown = rule.path.display().to_string();
        match rule.access {
            PathAccess::Read => read.push(shown),
            PathAccess::Exec => exec.push(shown),
            PathAccess::ReadWrite => write.push(shown),
        }
    }
    if language == Language::Python {
        read.push("the interpreter's installation prefix".into());
    }
    let mut parts = vec!["the working directory (read-write)".to_owned()];
    if !read.is_empty() {
        parts.push(format!("read-only: {}", read.join(", ")));
    }
    if !exec.is_empty() {
        parts.push(format!("executable: {}", exec.join(", ")));
    }
    if !write.is_empty() {
        parts.push(format!("read-write: {}", write.join(", ")));
    }
    parts.join("; ")
}

/// What the profile asks for and the sandbox a probe got mean for a cell, in
/// plain words. Claims about isolation come from the probe's report (what
/// was applied on this host), not from the profile alone.
fn sandbox_lines(
    observed: Option<&Observed>,
    profile: Option<&Profile>,
    language: Language,
) -> Vec<String> {
    let mut lines = Vec::new();
    if let Some(p) = profile {
        lines.push(format!("profile {:?}: {}", p.name, p.description));
    }
    let Some(o) = observed else {
        lines.push("sandbox not checked yet".into());
        return lines;
    };
    match &o.sandbox {
        None => lines.push("sandbox report unavailable".into()),
        Some(r) => {
            let applied: Vec<&str> = r
                .layers
                .iter()
                .filter(|l| l.applied)
                .map(|l| l.name.as_str())
                .collect();
            let has = |layer: Layer| applied.contains(&layer.as_str());
            let ns = |name: &str| r.namespaces.iter().any(|n| n == name);
            lines.push(format!(
                "layers applied on this host: {}",
                if applied.is_empty() {
                    "none".to_owned()
                } else {
                    applied.join(", ")
                }
            ));
            if ns("net") {
                lines.push(
                    "network: none (own network namespace without interfaces; nothing outside \
                     the cell can be reached)"
                        .into(),
                );
            } else if has(Layer::Landlock) && r.landlock_abi.unwrap_or(0) >= 4 {
                lines.push("network: TCP connect and bind are denied (Landlock)".into());
            } else {
                lines.push("network: NOT isolated on this host".into());
            }
            match (has(Layer::Landlock), profile) {
                (true, Some(p)) => {
                    lines.push(format!("files: only {}", paths_text(p, language)));
                    if ns("mount") && p.filesystem.tmp_bytes > 0 {
                        lines.push(format!(
                            "/tmp: private to the call, {}",
                            bytes(p.filesystem.tmp_bytes)
                        ));
                    }
                }
                (true, None) => lines.push(
                    "files: only the paths the profile grants are visible; the working \
                     directory is the only writable place"
                        .into(),
                ),
                (false, _) => lines.push(
                    "files: not restricted by Landlock on this host; the working directory is \
                     the cell's scratch directory"
                        .into(),
                ),
            }
            if ns("pid") {
                lines.push(
                    "processes: the cell sees only its own processes, and none outlive the call"
                        .into(),
                );
            }
        }
    }
    if let Some(f) = &o.failure {
        lines.push(format!("WARNING: {f}"));
    }
    lines
}

/// [`sandbox_lines`] in a few words each, for the short descriptions: the
/// same claims from the same report, without the list of paths.
fn sandbox_lines_short(
    observed: Option<&Observed>,
    profile: Option<&Profile>,
    language: Language,
) -> Vec<String> {
    let mut lines = Vec::new();
    if let Some(p) = profile {
        lines.push(format!("profile {:?}: {}", p.name, p.description));
    }
    let Some(o) = observed else {
        lines.push("sandbox not checked yet".into());
        return lines;
    };
    match &o.sandbox {
        None => lines.push("sandbox report unavailable".into()),
        Some(r) => {
            let applied: Vec<&str> = r
                .layers
                .iter()
                .filter(|l| l.applied)
                .map(|l| l.name.as_str())
                .collect();
            let has = |layer: Layer| applied.contains(&layer.as_str());
            let ns = |name: &str| r.namespaces.iter().any(|n| n == name);
            lines.push(format!(
                "layers applied on this host: {}",
                if applied.is_empty() {
                    "none".to_owned()
                } else {
                    applied.join(", ")
                }
            ));
            lines.push(
                if ns("net") {
                    "network: none"
                } else if has(Layer::Landlock) && r.landlock_abi.unwrap_or(0) >= 4 {
                    "network: TCP connect and bind denied"
                } else {
                    "network: NOT isolated on this host"
                }
                .into(),
            );
            match (has(Layer::Landlock), profile) {
                (true, Some(p)) => {
                    lines.push("files: only the working directory (read-write)".to_owned());
                    let more = language == Language::Python
                        || p.filesystem
                            .paths
                            .iter()
                            .any(|r| !r.optional || std::fs::symlink_metadata(&r.path).is_ok());
                    let mut f = Vec::new();
                    if more {
                        f.push("system paths (read-only)".to_owned());
                    }
                    if ns("mount") && p.filesystem.tmp_bytes > 0 {
                        f.push(format!(
                            "a private /tmp of {}",
                            bytes(p.filesystem.tmp_bytes)
                        ));
                    }
                    if !f.is_empty() {
                        lines.push(format!("files also: {}", f.join(", ")));
                    }
                }
                (true, None) => lines.push("files: only the working directory is writable".into()),
                (false, _) => lines.push("files: not restricted by Landlock on this host".into()),
            }
            if ns("pid") {
                lines.push("processes: only its own processes, none outlive the call".into());
            }
        }
    }
    if let Some(f) = &o.failure {
        lines.push(format!("WARNING: {f}"));
    }
    lines
}

/// How a language's code is run, in a line.
fn language_line_short(language: Language) -> &'static str {
    match language {
        Language::Rhai => "rhai: a Rhai script; print() writes to stdout.",
        Language::Python => {
            "python: Python 3, the standard library only (no third-party packages)."
        }
        Language::Shell => "shell: /bin/sh -c; an exit status other than 0 is an error.",
        Language::Bash => "bash: /bin/bash -c; an exit status other than 0 is an error.",
    }
}

/// Why a description names no Python interpreter.
#[derive(Debug, Clone, thiserror::Error)]
pub enum NoPython {
    #[error(transparent)]
    Missing(#[from] crate::PythonError),
    #[error("python is not enabled")]
    Disabled,
}

/// Inputs every description is built from.
pub struct Facts<'a> {
    pub settings: &'a Settings,
    /// The long descriptions (`tool_descriptions = "long"`).
    pub long: bool,
    /// Allowed capabilities: (name, description, parameter names).
    pub capabilities: Vec<(String, String, Vec<String>)>,
    pub python: Result<PythonInfo, NoPython>,
    /// The sandbox profile of each enabled language.
    pub profiles: BTreeMap<Language, Profile>,
    pub observed: Option<&'a Observations>,
    /// Bytes all scratch directories may hold together, when enforced.
    pub scratch_quota: Option<u64>,
    /// The bounds of each session's own scratch, when enforced.
    pub session_scratch: Option<crate::supervisor::ScratchQuota>,
    /// Bytes of memory all cells may hold together, when enforced.
    pub cells_memory: Option<u64>,
}

/// The allowed tools of upstream MCP servers, as the policy names them
/// (`SERVER.*` or `SERVER.TOOL`; the servers are not started to list them).
fn upstream_entries(
    sup: &Supervisor,
    policy: &crate::Policy,
) -> Vec<(String, String, Vec<String>)> {
    let mut out = Vec::new();
    for source in sup.tool_sources() {
        let server = source.name();
        for name in &policy.allow {
            if name.split_once('.').is_some_and(|(s, _)| s == server) {
                out.push((
                    name.clone(),
                    format!(
                        "{} (call tools.{server}.TOOL(name=value) or tool_call(\"{server}.TOOL\", {{...}}))",
                        source.description()
                    ),
                    Vec::new(),
                ));
            }
        }
    }
    out
}

impl Facts<'_> {
    pub fn new<'a>(
        sup: &Supervisor,
        settings: &'a Settings,
        observed: Option<&'a Observations>,
    ) -> Facts<'a> {
        let capabilities = sup
            .capabilities()
            .filter(|c| settings.session.policy.permits(c.name()))
            .map(|c| {
                let params = c
                    .schema()
                    .get("properties")
                    .and_then(Value::as_object)
                    .map(|p| p.keys().cloned().collect())
                    .unwrap_or_default();
                (c.name().to_owned(), c.description().to_owned(), params)
            })
            .chain(upstream_entries(sup, &settings.session.policy))
            .collect();
        let python = if settings.languages.contains(&Language::Python) {
            sup.python().map_err(NoPython::from)
        } else {
            Err(NoPython::Disabled)
        };
        // Settings validation loaded every profile once already.
        let profiles = settings
            .profiles
            .iter()
            .filter(|(l, _)| settings.languages.contains(l))
            .filter_map(|(l, name)| Some((*l, Profile::load(name).ok()?)))
            .collect();
        Facts {
            settings,
            long: settings.tool_descriptions == super::config::ToolDescriptions::Long,
            capabilities,
            python,
            profiles,
            observed,
            scratch_quota: sup.scratch_quota(),
            session_scratch: sup.session_scratch_quota(),
            cells_memory: sup.cells_memory(),
        }
    }

    fn limits_text_short(&self) -> String {
        let l = &self.settings.session.limits;
        let mut s = format!(
            "Limits per call: wall clock {}, {} of stdout and of stderr kept, memory {}, CPU \
             {} s, files up to {} each",
            seconds(l.timeout_ms),
            bytes(l.max_output_bytes as u64),
            bytes(l.rlimits.memory_bytes),
            l.rlimits.cpu_seconds,
            bytes(l.rlimits.max_file_size_bytes),
        );
        if let Some(q) = self.session_scratch {
            let _ = write!(s, ", a session's files {} in all", bytes(q.bytes));
        }
        s.push_str("; arguments may only lower them.");
        s
    }

    fn limits_text(&self) -> String {
        if !self.long {
            return self.limits_text_short();
        }
        let l = &self.settings.session.limits;
        let mut s = format!(
            "Limits per call: wall clock {} (the cell is killed after it; status timeout), \
             {} of stdout and of stderr kept (the middle of longer output is cut and reported \
             in `truncated`), memory {}{}, CPU {} s, {} processes/threads, files up to {}{}, \
             source up to {}.",
            seconds(l.timeout_ms),
            bytes(l.max_output_bytes as u64),
            bytes(l.rlimits.memory_bytes),
            match self.cells_memory {
                Some(m) => format!(
                    " per process and {} for all running calls together (a process past it is killed)",
                    bytes(m)
                ),
                None => String::new(),
            },
            l.rlimits.cpu_seconds,
            l.rlimits.max_processes,
            bytes(l.rlimits.max_file_size_bytes),
            match (self.session_scratch, self.scratch_quota) {
                (Some(q), _) => format!(
                    " each, and the session's scratch directory (with its run_cell calls') \
                     up to {} and {} files in all (its own space, not shared with other \
                     sessions)",
                    bytes(q.bytes),
                    q.inodes
                ),
                (None, Some(q)) => format!(" each and {} in all (shared by every call)", bytes(q)),
                (None, None) => String::new(),
            },
            bytes(l.max_script_bytes as u64),
        );
        if self.settings.languages.contains(&Language::Rhai) {
            if l.max_operations == 0 {
                s.push_str(" Rhai: no operation limit.");
            } else {
                let _ = write!(s, " Rhai: at most {} operations.", l.max_operations);
            }
        }
        // A language's profile is a ceiling over these.
        let shell = self.profiles.get(&Language::Shell).map(|p| &p.name);
        for (lang, p) in &self.profiles {
            // Bash under shell's profile has shell's ceiling, said once.
            if *lang == Language::Bash && shell == Some(&p.name) {
                continue;
            }
            let e = l.under_profile(&p.limits);
            if e != *l {
                let _ = write!(
                    s,
                    " {lang} cells (their profile's ceiling): memory {}, CPU {} s, {} \
                     processes/threads, {} open files, files up to {}.",
                    bytes(e.rlimits.memory_bytes),
                    e.rlimits.cpu_seconds,
                    e.rlimits.max_processes,
                    e.rlimits.max_open_files,
                    bytes(e.rlimits.max_file_size_bytes)
                );
            }
        }
        s.push_str(
            " timeout_seconds and max_output_bytes may lower these for one call, never raise them.",
        );
        s
    }

    fn capabilities_text(&self) -> String {
        if self.capabilities.is_empty() && !self.long {
            return "Capabilities: none are allowed.".into();
        }
        if self.capabilities.is_empty() {
            return "Capabilities: none are allowed, so the code cannot call anything outside \
                    the sandbox."
                .into();
        }
        let mut s = String::from(if self.long {
            "Capabilities (the only way out of the sandbox; call them as functions, positional \
             arguments in this order; each call is checked by the server):"
        } else {
            "Capabilities (functions; arguments in this order):"
        });
        for (name, desc, params) in &self.capabilities {
            let desc = if self.long {
                desc
            } else {
                first_sentence(without_signature(name, desc))
            };
            let _ = write!(s, "\n- {name}({}): {desc}", params.join(", "));
        }
        let p = &self.settings.session.policy;
        if !self.long {
            let _ = write!(
                s,
                "\nAt most {} calls per call; the rest is denied.",
                p.max_calls
            );
            if self
                .capabilities
                .iter()
                .any(|(n, _, _)| n.starts_with("model_query"))
            {
                let names: Vec<&str> = self.settings.models.keys().map(String::as_str).collect();
                let _ = write!(
                    s,
                    "\nModels (the server makes the request; no key is visible to the code): {}. \
                     Python names them llm_query too. Per session: at most {} model queries and \
                     {} tokens{}.",
                    names.join(", "),
                    p.max_model_calls,
                    p.max_total_tokens,
                    p.max_cost
                        .map(|c| format!(", cost {c}"))
                        .unwrap_or_default(),
                );
            }
            return s;
        }
        let _ = write!(
            s,
            "\nAt most {} capability calls per call of this tool; anything not listed is denied \
             (status policy_denied when the code does not handle the error).",
            p.max_calls
        );
        if self
            .capabilities
            .iter()
            .any(|(n, _, _)| n.starts_with("model_query"))
        {
            let names: Vec<&str> = self.settings.models.keys().map(String::as_str).collect();
            let _ = write!(
                s,
                "\nModels (the server makes the request; no key is visible to the code): {}. \
                 Python also names them llm_query and llm_query_batched; a reply is a str with \
                 .usage. Per session: at most {} model queries and {} tokens{}; the query that \
                 would pass a budget ends the call with status limit_exceeded.",
                names.join(", "),
                p.max_model_calls,
                p.max_total_tokens,
                p.max_cost
                    .map(|c| format!(", cost {c}"))
                    .unwrap_or_default(),
            );
        }
        s
    }

    fn persistence_text(&self) -> String {
        if !self.long {
            return format!(
                "What persists: nothing without session_id. With one (from create_session) \
                 files and variables carry over, Python objects stay alive, a failed call is \
                 rolled back. Sessions close after {} s idle; at most {} sessions at once.",
                self.settings.idle_expiry.as_secs(),
                self.settings.max_sessions_per_principal,
            );
        }
        format!(
            "What persists: without session_id nothing does; every call starts from a fresh, \
             empty sandbox whose files are deleted afterwards. With a session_id (from \
             create_session) files written to the working directory stay there, and the \
             namespace carries over. Python keeps every object alive between calls (data \
             frames, compiled regexes, open files, generators, class instances), like a \
             notebook; a call that fails, times out or is killed is rolled back whole (the \
             result's state says kept or rolled_back), and checkpoint_session / \
             restore_session keep and return to named states. Live objects are lost if the \
             server restarts (JSON-valued variables and definitions are then restored). Other \
             languages carry variables whose values have a JSON form and definitions; values \
             without one are listed in vars.dropped. A session is closed after {} s without a \
             call; you may hold at most {} sessions at once.",
            self.settings.idle_expiry.as_secs(),
            self.settings.max_sessions_per_principal,
        )
    }

    fn concurrency_text(&self) -> String {
        if !self.long {
            return format!(
                "At most {} cells run at once; more wait, or are refused with ServerBusy.",
                self.settings.max_concurrency,
            );
        }
        format!(
            "At most {} cells run at once; further calls wait (up to {} waiting, {} of them \
             yours), past that a call is refused with status limit_exceeded and error type \
             ServerBusy (ClientQueueFull when your share is used up). Calls on one session run \
             one at a time. While the server stops, new calls get the error \"server is \
             draining\" and a cell still running past the drain timeout ends with status \
             killed and error type Draining.",
            self.settings.max_concurrency,
            self.settings.max_queue,
            self.settings.max_queue_per_principal
        )
    }

    /// The short `execute_code` description: each language in a line, the
    /// sandbox lines every language shares once, then each language's own.
    fn execute_code_short(&self) -> String {
        let mut s = String::from(
            "Run code in a sandboxed cell; returns stdout, stderr, the last expression's value \
             and any error.\n\nLanguages:",
        );
        let per: Vec<(Language, Vec<String>)> = self
            .settings
            .languages
            .iter()
            .map(|&lang| {
                let observed = self.observed.and_then(|o| o.get(&lang));
                (
                    lang,
                    sandbox_lines_short(observed, self.profiles.get(&lang), lang),
                )
            })
            .collect();
        let shared: Vec<&String> = per
            .first()
            .map(|(_, lines)| {
                lines
                    .iter()
                    .filter(|l| per.iter().all(|(_, o)| o.contains(l)))
                    .collect()
            })
            .unwrap_or_default();
        let shell_lines = per
            .iter()
            .find(|(l, _)| *l == Language::Shell)
            .map(|(_, lines)| lines);
        for (lang, lines) in &per {
            // Bash under the same profile as shell is said in a few words.
            if *lang == Language::Bash && shell_lines == Some(lines) {
                s.push_str("\n- bash: /bin/bash -c, as shell.");
                continue;
            }
            let _ = write!(s, "\n- {}", language_line_short(*lang));
            for line in lines.iter().filter(|l| !shared.contains(l)) {
                let _ = write!(s, "\n  {line}");
            }
        }
        if !shared.is_empty() {
            s.push_str("\nSandbox:");
            for line in shared {
                let _ = write!(s, "\n- {line}");
            }
        }
        let _ = write!(
            s,
            "\n\n{}\n\n{}\n\n{}\n\n{}",
            self.persistence_text(),
            self.limits_text(),
            self.capabilities_text(),
            self.concurrency_text()
        );
        s
    }

    /// The `execute_code` description.
    pub fn execute_code(&self) -> String {
        if !self.long {
            return self.execute_code_short();
        }
        let mut s = String::from(
            "Run code in a sandboxed cell and return its stdout, stderr, the value of the last \
             expression and any error. The text result shows the output (the head and tail of \
             a long stream), `=> value` and the error; structuredContent is the data (status, \
             stdout, stderr, value, error with type/message/traceback, namespace changes, \
             usage; the sandbox report and run ids with verbose: true); isError is true for \
             every status but ok.\n\nLanguages:",
        );
        for &lang in &self.settings.languages {
            let _ = write!(s, "\n- {}", language_line(lang, &self.python));
            let observed = self.observed.and_then(|o| o.get(&lang));
            for line in sandbox_lines(observed, self.profiles.get(&lang), lang) {
                let _ = write!(s, "\n  {line}");
            }
        }
        let _ = write!(
            s,
            "\n\n{}\n\n{}\n\n{}\n\n{}",
            self.persistence_text(),
            self.limits_text(),
            self.capabilities_text(),
            self.concurrency_text()
        );
        s
    }

    pub fn create_session(&self) -> String {
        if !self.long {
            return "Create a session; pass its session_id to execute_code to keep variables \
                    and files between calls."
                .into();
        }
        format!(
            "Create a session for execute_code: pass its session_id to keep variables, \
             definitions and files between calls. Sessions are closed after {} s without a \
             call; you may hold at most {} at once (close unused ones with close_session).",
            self.settings.idle_expiry.as_secs(),
            self.settings.max_sessions_per_principal
        )
    }

    pub fn reset_session(&self) -> String {
        if !self.long {
            return "Forget a session's variables; its files stay.".into();
        }
        "Forget every variable and definition of a session. Files in its working directory \
         stay; the session id stays valid."
            .into()
    }

    pub fn close_session(&self) -> String {
        if !self.long {
            return "Close a session and delete its variables and files.".into();
        }
        "Close a session: a cell running in it is killed, its variables, definitions and files \
         are deleted, and its id becomes invalid."
            .into()
    }

    pub fn list_sessions(&self) -> String {
        if !self.long {
            return "List your open sessions.".into();
        }
        "List your open sessions: id, idle time, time until expiry, whether a cell is running, \
         cells run so far, variable names, whether its Python namespace is live, its checkpoints \
         and the memory it holds."
            .into()
    }

    pub fn checkpoint_session(&self) -> String {
        if !self.long {
            return "Keep a session's live Python namespace under a name (in memory only), for \
                    restore_session."
                .into();
        }
        "Keep a checkpoint of a session's live Python namespace (every object, as the last \
         successful cell left it) under a name, to return to with restore_session. A session \
         keeps a few at most; the same name replaces the older one. Checkpoints live in the \
         server's memory: they are lost if the server restarts, and freed with the session. \
         Python cells can also call checkpoint(name) and restore(name), done once the cell \
         succeeds."
            .into()
    }

    pub fn restore_session(&self) -> String {
        if !self.long {
            return "Return a session's live Python namespace to a checkpoint.".into();
        }
        "Return a session's live Python namespace to a checkpoint made by checkpoint_session \
         (or checkpoint(name) in a cell). The checkpoint stays, for another restore."
            .into()
    }

    /// The server's `instructions` (shown to the model by many hosts).
    pub fn instructions(&self) -> String {
        let langs: Vec<&str> = self.settings.languages.iter().map(|l| l.as_str()).collect();
        format!(
            "cellbox runs untrusted code in a sandbox. Use execute_code to run {} code; use \
             create_session first when later calls need earlier variables or files. {} {}",
            langs.join(", "),
            self.limits_text(),
            self.capabilities_text()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::serve::config::ServeConfig;

    #[test]
    fn descriptions_follow_the_settings() {
        let mut c = ServeConfig::default();
        c.limits.timeout_ms = 7000;
        c.limits.max_output_bytes = 2048;
        c.sessions.max_sessions = 5;
        c.sessions.idle_expiry_seconds = 90;
        c.server.languages = vec!["rhai".into()];
        c.policy.allow.insert("emit".into());
        let settings = c.validate().unwrap();
        let sup = Supervisor::builder()
            .worker_exe(std::env::current_exe().unwrap())
            .build()
            .unwrap();
        let mut obs = Observations::new();
        obs.insert(
            Language::Rhai,
            Observed {
                sandbox: serde_json::from_value(serde_json::json!({
                    "profile": "rhai",
                    "layers": [{"name": "hygiene", "applied": true, "detail": ""},
                               {"name": "landlock", "applied": true, "detail": ""}],
                    "landlock_abi": 7,
                    "namespaces": ["user", "net", "pid"]
                }))
                .unwrap(),
                failure: None,
            },
        );
        let f = Facts::new(&sup, &settings, Some(&obs));
        let d = f.execute_code();
        for needle in [
            "wall clock 7 s",
            "2 KiB of stdout",
            "after 90 s",
            "at most 5 sessions",
            "emit(event)",
            "network: none",
            "layers applied on this host: hygiene, landlock",
            "profile \"rhai\": Rhai scripts",
            "files: only the working directory (read-write)",
            "only its own processes",
        ] {
            assert!(d.contains(needle), "missing {needle:?} in:\n{d}");
        }
        assert!(!d.contains("python:"), "{d}");
        assert!(!d.contains("answer("), "{d}");

        obs.insert(
            Language::Rhai,
            Observed {
                sandbox: serde_json::from_value(serde_json::json!({
                    "profile": "rhai",
                    "layers": [{"name": "hygiene", "applied": true, "detail": ""}]
                }))
                .unwrap(),
                failure: Some("a test cell ended with status sandbox_error: x".into()),
            },
        );
        let mut c2 = c.clone();
        c2.policy.allow.clear();
        let settings = c2.validate().unwrap();
        let d = Facts::new(&sup, &settings, Some(&obs)).execute_code();
        assert!(d.contains("network: NOT isolated"), "{d}");
        assert!(d.contains("WARNING: a test cell"), "{d}");
        assert!(d.contains("none are allowed"), "{d}");
    }

    #[test]
    fn configured_models_are_offered_and_described() {
        let mut c = ServeConfig::default();
        c.policy.allow.insert("model_query".into());
        c.policy.max_model_calls = 7;
        c.models.insert(
            "local".into(),
            toml::from_str("endpoint = \"http://127.0.0.1:9/v1\"\nmodel = \"m\"").unwrap(),
        );
        let settings = c.validate().unwrap();
        let sup = crate::serve::build_supervisor(&settings).unwrap();
        let d = Facts::new(&sup, &settings, None).execute_code();
        for needle in [
            "model_query(prompt, model, max_tokens, temperature)",
            "Models (the server makes the request; no key is visible to the code): local",
            "at most 7 model queries",
        ] {
            assert!(d.contains(needle), "missing {needle:?} in:\n{d}");
        }
        assert!(!d.contains("model_query_batched("), "{d}");
    }
}
