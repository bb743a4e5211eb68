//! Profile → SBPL: the policy `sandbox-exec -p` enforces for one cell.
//!
//! The policy starts closed, `(version 1)` then `(deny default)`, and
//! allows only what the plan grants, each rule with a comment saying why:
//!
//! - `process-exec` of the worker executable (sandbox-exec executes it
//!   under the policy) and of the backend's programs, nothing else;
//! - `process-fork` only when the profile's seccomp allowlist lets the
//!   cell start processes (`fork` or `vfork`);
//! - `signal` only to the cell's own process group;
//! - `file-read*` beneath the profile's paths, the backend's read-only
//!   paths and the system libraries every program loads at exec, with
//!   `file-map-executable` (dyld maps code) for all but the profile's
//!   read-only paths;
//!   `file-read*` and `file-write*` beneath the scratch directory only;
//!   `file-read-metadata` of the directories leading to a granted path (so
//!   paths resolve), never their contents;
//! - `sysctl-read` and `mach-lookup` for a short list of names, each
//!   with the reason the runtime needs it;
//! - nothing for `network*`: the profiles' only network mode is `none`.
//!
//! Paths are SBPL string literals: `"` and `\` are escaped, and a path
//! that cannot be written as one (not absolute, not UTF-8, holding a NUL or
//! any other control character) is an [`SbplError`], never left out.
//! macOS resolves symlinks before it matches a path, and `/etc`, `/tmp`
//! and `/var` are links into `/private`: a profile path beneath them is
//! granted under both names. Paths known only at launch (the scratch
//! directory, the engine, the interpreter) are canonicalized by the
//! launcher before they get here.

use crate::profiles::{ExecMode, PathAccess};
use crate::sandbox::SandboxPlan;
use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// A policy that cannot be written.
#[derive(Debug, thiserror::Error)]
pub enum SbplError {
    /// A path the SBPL string syntax cannot carry faithfully.
    #[error("failed to write {path:?} into the sandbox-exec policy: {problem}")]
    Path {
        path: PathBuf,
        problem: &'static str,
    },
}

/// The system paths every program needs at its exec under sandbox-exec:
/// the dynamic loader, libSystem and the shared cache it maps.
const SYSTEM_READ: &[(&str, &str)] = &[
    ("/usr/lib", "the dynamic loader and libSystem"),
    (
        "/System/Library",
        "system frameworks and the dyld shared cache (macOS 12 and before)",
    ),
    (
        "/System/Volumes/Preboot/Cryptexes/OS",
        "the dyld shared cache (macOS 13 and later)",
    ),
    ("/System/Cryptexes/OS", "the same cache by its firmlink"),
    ("/private/var/db/dyld", "dyld's closure cache"),
];

/// sysctl names every worker reads: the allocator and the CPU count.
const SYSCTL_RUNTIME: &[(&str, &str)] = &[
    ("hw.pagesize", "the allocator's page size"),
    ("hw.pagesize_compat", "the allocator's page size (Rosetta)"),
    ("hw.ncpu", "CPU count (available_parallelism, os.cpu_count)"),
    ("hw.activecpu", "CPU count (sysconf _SC_NPROCESSORS_ONLN)"),
    (
        "hw.logicalcpu_max",
        "CPU count (sysconf _SC_NPROCESSORS_CONF)",
    ),
];

/// sysctl names an interpreter or program reads as well: `uname`.
const SYSCTL_PROGRAM: &[(&str, &str)] = &[
    ("kern.ostype", "uname (os.uname, platform)"),
    ("kern.osrelease", "uname"),
    ("kern.version", "uname"),
    ("kern.hostname", "uname"),
    ("hw.machine", "uname"),
    ("kern.osproductversion", "platform.mac_ver"),
];

/// The user-lookup service, allowed when the profile grants the name
/// service configuration (`/etc/nsswitch.conf`, its Linux equivalent).
const MACH_LIBINFO: &str = "com.apple.system.opendirectoryd.libinfo";

/// Reading, and mapping as code: what dyld needs of a program and of the
/// libraries (and Python extension modules) it loads. Never granted on the
/// scratch directory, so a cell cannot load code it wrote.
const MAP: &str = "file-read* file-map-executable";

/// Roots that are symlinks into `/private` on macOS.
const PRIVATE_LINKS: &[&str] = &["/etc", "/tmp", "/var"];

/// The policy for one cell of `plan`, whose worker is `engine`.
///
/// `plan.scratch`, `engine` and the backend's paths (`plan.read_only`,
/// `plan.exec`) must already be canonical (see
/// [`crate::macos::launch::canonical_plan`]).
pub fn compile(plan: &SandboxPlan, engine: &Path) -> Result<String, SbplError> {
    let mut p = Policy::default();
    p.line(&format!(
        "; cellbox: the sandbox-exec policy of profile {}, generated from it; edit the profile, not this",
        comment(&plan.profile)
    ));
    p.line("(version 1)");
    p.line("(deny default)");

    // Processes.
    p.blank();
    p.line("; The worker: sandbox-exec executes it under this policy.");
    p.rule("process-exec", &[literal(engine)?]);
    p.rule(MAP, &[literal(engine)?]);
    p.ancestors(engine);
    let exec_mode = plan.seccomp.exec;
    let programs: Vec<PathBuf> = match exec_mode {
        ExecMode::None => Vec::new(),
        ExecMode::Once | ExecMode::Any => plan.exec.clone(),
    };
    if !programs.is_empty() {
        p.line("; The backend's programs (the interpreter, the command).");
        let filters = programs
            .iter()
            .map(|x| literal(x))
            .collect::<Result<Vec<_>, _>>()?;
        p.rule("process-exec", &filters);
        p.rule(MAP, &filters);
        for x in &programs {
            p.ancestors(x);
        }
    }
    if exec_mode == ExecMode::Any {
        // Exec-access profile rules below add their own process-exec.
        p.line("; The profile lets the cell execute the programs beneath its exec paths.");
    }
    let forks = plan
        .seccomp
        .allow
        .iter()
        .flat_map(|g| &g.syscalls)
        .any(|s| s == "fork" || s == "vfork");
    if forks {
        p.line("; The profile lets the cell start processes (fork in its allowlist).");
        p.line("(allow process-fork)");
    } else {
        p.line("; No process-fork: the profile lets the cell start no process.");
    }
    p.line("; Signals only to the cell's own process group (the worker leads it).");
    p.line("(allow signal (target pgrp))");
    p.line("(allow process-info* (target self))");

    // Files.
    p.blank();
    p.line("; macOS itself: what every program loads at exec.");
    for (path, why) in SYSTEM_READ {
        p.line(&format!("; {why}"));
        p.rule(MAP, &[subpath(Path::new(path))?]);
        p.ancestors(Path::new(path));
    }
    p.line("; The null device; the random devices; the list of the worker's own descriptors,");
    p.line("; read once to close any it should not have inherited.");
    p.rule(
        "file-read* file-write-data",
        &[literal(Path::new("/dev/null"))?],
    );
    p.rule(
        "file-read*",
        &[
            literal(Path::new("/dev/random"))?,
            literal(Path::new("/dev/urandom"))?,
            literal(Path::new("/dev/fd"))?,
        ],
    );

    if !plan.paths.is_empty() {
        p.blank();
        p.line("; The profile's paths.");
    }
    for rule in &plan.paths {
        let mut names = vec![rule.path.clone()];
        names.extend(private_alias(&rule.path));
        p.line(&format!(
            "; {}: {}",
            access_name(rule.access),
            comment(&rule.why)
        ));
        let filters = names
            .iter()
            .map(|n| subpath(n))
            .collect::<Result<Vec<_>, _>>()?;
        match rule.access {
            PathAccess::Read => p.rule("file-read*", &filters),
            PathAccess::Exec => {
                p.rule(MAP, &filters);
                if exec_mode == ExecMode::Any {
                    p.rule("process-exec", &filters);
                }
            }
            PathAccess::ReadWrite => p.rule("file-read* file-write*", &filters),
        }
        for n in &names {
            p.ancestors(n);
        }
    }
    if !plan.read_only.is_empty() {
        p.blank();
        p.line("; The backend's read-only paths (the interpreter's prefix, the runtime shim).");
        let filters = plan
            .read_only
            .iter()
            .map(|x| subpath(x))
            .collect::<Result<Vec<_>, _>>()?;
        p.rule(MAP, &filters);
        for x in &plan.read_only {
            p.ancestors(x);
        }
    }
    p.blank();
    p.line("; The cell's scratch directory: its working directory, HOME and TMPDIR,");
    p.line("; the only place it may write.");
    p.rule("file-read* file-write*", &[subpath(&plan.scratch)?]);
    p.ancestors(&plan.scratch);

    // Directories on the way to a granted path: their metadata only.
    p.blank();
    p.line("; The directories leading to the paths above: stat only, so paths resolve.");
    let ancestors: Vec<String> = std::mem::take(&mut p.ancestors)
        .into_iter()
        .map(|a| literal(&a))
        .collect::<Result<_, _>>()?;
    p.rule("file-read-metadata", &ancestors);

    // Kernel and system services.
    p.blank();
    p.line("; sysctl names the runtime reads.");
    let mut sysctls: Vec<(&str, &str)> = SYSCTL_RUNTIME.to_vec();
    if exec_mode != ExecMode::None {
        sysctls.extend_from_slice(SYSCTL_PROGRAM);
    }
    p.line("(allow sysctl-read");
    for (name, why) in &sysctls {
        p.line(&format!("  (sysctl-name {}) ; {why}", string(name)));
    }
    p.line(")");
    let lookups_users = plan
        .paths
        .iter()
        .any(|r| r.path == Path::new("/etc/nsswitch.conf"));
    if lookups_users {
        p.line("; User and group lookups (the profile grants the name service configuration).");
        p.line(&format!(
            "(allow mach-lookup (global-name {}))",
            string(MACH_LIBINFO)
        ));
    } else {
        p.line("; No mach-lookup: the cell talks to no system service.");
    }
    // The profiles' only network mode is `none` (the plan carries no
    // other): nothing of network* is allowed.
    p.line("; No network: nothing of network* is allowed.");
    Ok(p.text)
}

/// A policy being written.
#[derive(Default)]
struct Policy {
    text: String,
    ancestors: BTreeSet<PathBuf>,
}

impl Policy {
    fn line(&mut self, s: &str) {
        self.text.push_str(s);
        self.text.push('\n');
    }

    fn blank(&mut self) {
        self.text.push('\n');
    }

    /// `(allow <ops> <filter>...)`, one filter a line when there are
    /// several.
    fn rule(&mut self, ops: &str, filters: &[String]) {
        match filters {
            [] => {}
            [one] => self.line(&format!("(allow {ops} {one})")),
            many => {
                let _ = write!(self.text, "(allow {ops}");
                for f in many {
                    let _ = write!(self.text, "\n  {f}");
                }
                self.text.push_str(")\n");
            }
        }
    }

    /// Remember the directories leading to `path` (not `path` itself).
    fn ancestors(&mut self, path: &Path) {
        let mut cur = path.parent();
        while let Some(dir) = cur {
            self.ancestors.insert(dir.to_path_buf());
            cur = dir.parent();
        }
    }
}

/// An access's name as the profile writes it.
fn access_name(access: PathAccess) -> &'static str {
    match access {
        PathAccess::Read => "read",
        PathAccess::Exec => "exec",
        PathAccess::ReadWrite => "read_write",
    }
}

/// `path` under `/private` when its first component links there on macOS.
fn private_alias(path: &Path) -> Option<PathBuf> {
    PRIVATE_LINKS.iter().find_map(|root| {
        path.strip_prefix(root)
            .ok()
            .map(|rest| {
                Path::new("/private")
                    .join(root.trim_start_matches('/'))
                    .join(rest)
            })
            .map(|p| {
                // `join("")` would add a trailing slash.
                if p.as_os_str().to_string_lossy().ends_with('/') {
                    PathBuf::from(p.to_string_lossy().trim_end_matches('/'))
                } else {
                    p
                }
            })
    })
}

/// `(literal "<path>")`.
fn literal(path: &Path) -> Result<String, SbplError> {
    Ok(format!("(literal {})", path_string(path)?))
}

/// `(subpath "<path>")`.
fn subpath(path: &Path) -> Result<String, SbplError> {
    Ok(format!("(subpath {})", path_string(path)?))
}

/// `path` as an SBPL string literal, or why it cannot be one.
pub fn path_string(path: &Path) -> Result<String, SbplError> {
    let fail = |problem| SbplError::Path {
        path: path.to_path_buf(),
        problem,
    };
    let s = path
        .to_str()
        .ok_or_else(|| fail("the path is not UTF-8, and SBPL strings are"))?;
    if !s.starts_with('/') {
        return Err(fail("the path is not absolute"));
    }
    if s.contains('\0') {
        return Err(fail("the path holds a NUL byte"));
    }
    if s.chars().any(char::is_control) {
        return Err(fail(
            "the path holds a control character (a newline, a tab, ...), \
             which the policy would not match as written",
        ));
    }
    Ok(string(s))
}

/// `s` as an SBPL string literal: quoted, with `"` and `\` escaped. `s`
/// holds no control character (checked by the callers that take outside
/// input; the compiler's own names have none).
fn string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        if c == '"' || c == '\\' {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('"');
    out
}

/// `s` for a comment: one line, whatever it holds.
fn comment(s: &str) -> String {
    s.chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::profiles::{PathRule, Profile};
    use std::ffi::OsStr;
    use std::os::unix::ffi::OsStrExt;

    /// Where the engine and the cell's scratch directory are in the
    /// policies kept in `sandbox-profiles/macos/` (the real ones are those
    /// of the host, known at launch).
    pub(crate) const SAMPLE_ENGINE: &str = "/usr/local/bin/cellbox-engine";
    const SAMPLE_SCRATCH: &str = "/private/var/folders/cellbox/scratch/cell";
    const SAMPLE_PYTHON_PREFIX: &str = "/opt/homebrew/Cellar/python@3.12/3.12.8";
    const SAMPLE_PYTHON: &str = "/opt/homebrew/Cellar/python@3.12/3.12.8/bin/python3.12";

    /// The plan of a sample cell of built-in profile `name`, with every
    /// architecture's rules (so the kept policy is the same on every
    /// host).
    fn sample_plan(name: &str) -> SandboxPlan {
        let profile = Profile::load(name).unwrap();
        let mut plan = SandboxPlan::new(&profile, SAMPLE_SCRATCH.into(), profile.default_limits());
        plan.paths = profile.filesystem.paths.clone();
        match name {
            "python" => {
                plan.read_only.push(SAMPLE_PYTHON_PREFIX.into());
                plan.exec.push(SAMPLE_PYTHON.into());
            }
            "shell" => plan.exec.push("/bin/sh".into()),
            _ => {}
        }
        plan
    }

    fn sample_policy(name: &str) -> String {
        compile(&sample_plan(name), Path::new(SAMPLE_ENGINE)).unwrap()
    }

    /// What is wrong with `text` as a policy: unbalanced parentheses, an
    /// unterminated or badly escaped string, a raw control character in a
    /// string, or a start other than `(version 1)` then `(deny default)`.
    pub(crate) fn well_formed(text: &str) -> Result<(), String> {
        let mut depth = 0usize;
        let mut forms: Vec<String> = Vec::new();
        let mut current = String::new();
        let mut chars = text.chars().peekable();
        let mut line = 1;
        while let Some(c) = chars.next() {
            match c {
                ';' => {
                    // A comment runs to the end of the line.
                    for c in chars.by_ref() {
                        if c == '\n' {
                            line += 1;
                            break;
                        }
                    }
                    continue;
                }
                '"' => {
                    if depth == 0 {
                        return Err(format!("line {line}: a string outside any form"));
                    }
                    current.push('"');
                    loop {
                        match chars.next() {
                            None => return Err(format!("line {line}: unterminated string")),
                            Some('"') => break,
                            Some('\\') => match chars.next() {
                                Some(e @ ('"' | '\\')) => {
                                    current.push('\\');
                                    current.push(e);
                                }
                                other => {
                                    return Err(format!(
                                        "line {line}: bad escape \\{other:?} in a string"
                                    ))
                                }
                            },
                            Some(c) if c.is_control() => {
                                return Err(format!(
                                    "line {line}: raw control character {c:?} in a string"
                                ))
                            }
                            Some(c) => current.push(c),
                        }
                    }
                    current.push('"');
                    continue;
                }
                '(' => depth += 1,
                ')' => {
                    if depth == 0 {
                        return Err(format!("line {line}: ')' closes nothing"));
                    }
                    depth -= 1;
                    if depth == 0 {
                        current.push(')');
                        forms.push(
                            std::mem::take(&mut current)
                                .split_whitespace()
                                .collect::<Vec<_>>()
                                .join(" "),
                        );
                        continue;
                    }
                }
                '\n' => line += 1,
                _ => {}
            }
            if depth > 0 {
                current.push(c);
            } else if !c.is_whitespace() {
                return Err(format!("line {line}: {c:?} outside any form"));
            }
        }
        if depth != 0 {
            return Err(format!("{depth} unclosed '('"));
        }
        match forms.as_slice() {
            [v, d, ..] if v == "(version 1)" && d == "(deny default)" => Ok(()),
            _ => Err(format!(
                "the policy must start with (version 1) (deny default), not {:?}",
                forms.iter().take(2).collect::<Vec<_>>()
            )),
        }
    }

    /// The kept policy of built-in profile `name`.
    fn kept_path(name: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("sandbox-profiles/macos")
            .join(format!("{name}.sb"))
    }

    /// `sandbox-profiles/macos/<name>.sb` is what the compiler makes of
    /// each built-in profile. `CELLBOX_BLESS=1` rewrites them.
    #[test]
    fn kept_policies_match_the_compiler() {
        let bless = std::env::var_os("CELLBOX_BLESS").is_some_and(|v| v == "1");
        let mut stale = Vec::new();
        for name in crate::profiles::BUILTIN_NAMES {
            let policy = sample_policy(name);
            let path = kept_path(name);
            if bless {
                std::fs::create_dir_all(path.parent().unwrap()).unwrap();
                std::fs::write(&path, &policy).unwrap();
            }
            let kept = std::fs::read_to_string(&path).unwrap_or_default();
            if kept != policy {
                stale.push(path.display().to_string());
            }
        }
        assert!(
            stale.is_empty(),
            "the kept policies differ from the compiler's: {stale:?}; \
             run `CELLBOX_BLESS=1 cargo test --profile test-release --lib macos::sbpl` and review the diff"
        );
    }

    #[test]
    fn every_policy_is_well_formed_and_starts_closed() {
        for name in crate::profiles::BUILTIN_NAMES {
            let policy = sample_policy(name);
            well_formed(&policy).unwrap_or_else(|e| panic!("{name}: {e}\n{policy}"));
            let rules: Vec<&str> = policy.lines().filter(|l| !l.starts_with(';')).collect();
            assert_eq!(rules[..2], ["(version 1)", "(deny default)"], "{name}");
            // Nothing of the network, and never a bare allow-all.
            assert!(
                !rules.iter().any(|l| l.contains("network")),
                "{name}: {policy}"
            );
            assert!(!policy.contains("(allow default"), "{name}");
            assert!(!policy.contains("(allow file-read*)"), "{name}");
            assert!(!policy.contains("(allow process-exec)"), "{name}");
            assert!(!policy.contains("(allow mach-lookup)"), "{name}");
            assert!(!policy.contains("(allow sysctl-read)"), "{name}");
        }
        // The checker itself rejects what it should.
        assert!(well_formed("(version 1)\n(deny default)\n(allow x").is_err());
        assert!(well_formed("(version 1)\n(deny default))").is_err());
        assert!(well_formed("(deny default)\n(version 1)").is_err());
        assert!(well_formed("(version 1)\n(deny default)\n(allow f (literal \"a\\n\"))").is_err());
        assert!(well_formed("(version 1)\n(deny default)\n(allow f (literal \"a\nb\"))").is_err());
        assert!(well_formed("(version 1)\n(deny default)\n(allow f (literal \"a))").is_err());
        assert!(well_formed("(version 1)\n(deny default)\n(allow f (literal \"a\\\"b\"))").is_ok());
    }

    #[test]
    fn rhai_gets_no_process_no_program_and_only_its_scratch() {
        let policy = sample_policy("rhai");
        assert!(!policy.contains("(allow process-fork)"), "{policy}");
        let execs: Vec<&str> = policy
            .lines()
            .filter(|l| l.starts_with("(allow process-exec"))
            .collect();
        assert_eq!(
            execs,
            [format!("(allow process-exec (literal \"{SAMPLE_ENGINE}\"))").as_str()]
        );
        let writes: Vec<&str> = policy
            .lines()
            .filter(|l| l.contains("file-write*"))
            .collect();
        assert_eq!(
            writes,
            [format!("(allow file-read* file-write* (subpath \"{SAMPLE_SCRATCH}\"))").as_str()]
        );
        assert!(policy.contains("(allow signal (target pgrp))"));
        // Code is mapped from the system, the engine: never the scratch dir.
        assert!(policy.contains("(allow file-read* file-map-executable (subpath \"/usr/lib\"))"));
        assert!(!policy
            .lines()
            .any(|l| l.contains("file-map-executable") && l.contains(SAMPLE_SCRATCH)));
        assert!(!policy.contains("(allow mach-lookup"), "{policy}");
        assert!(!policy.contains("kern.hostname"), "{policy}");
    }

    #[test]
    fn python_execs_its_interpreter_forks_and_reads_its_prefix() {
        let policy = sample_policy("python");
        assert!(policy.contains("(allow process-fork)"));
        assert!(policy.contains(&format!("(literal \"{SAMPLE_PYTHON}\")")));
        assert!(policy.contains(&format!(
            "(allow file-read* file-map-executable (subpath \"{SAMPLE_PYTHON_PREFIX}\"))"
        )));
        // /etc is a link into /private: both names are granted.
        assert!(policy.contains("(subpath \"/etc/localtime\")"));
        assert!(policy.contains("(subpath \"/private/etc/localtime\")"));
        assert!(policy.contains(MACH_LIBINFO));
        // The exec-access loader rule grants reading, not executing: only
        // the interpreter may be executed ("once").
        let exec_lines = policy
            .lines()
            .filter(|l| l.contains("process-exec"))
            .count();
        assert_eq!(exec_lines, 2, "{policy}");
        // The directories leading to the interpreter: stat, not list.
        assert!(policy.contains("  (literal \"/opt/homebrew\")"));
        assert!(!policy.contains("(subpath \"/opt\")"));
    }

    #[test]
    fn shell_executes_beneath_its_exec_paths() {
        let policy = sample_policy("shell");
        assert!(policy.contains("(allow process-fork)"));
        let profile = Profile::load("shell").unwrap();
        for rule in profile
            .filesystem
            .paths
            .iter()
            .filter(|r| r.access == PathAccess::Exec)
        {
            let granted = format!("(subpath \"{}\")", rule.path.display());
            assert!(
                policy
                    .lines()
                    .skip_while(|l| !l.starts_with("(allow process-exec"))
                    .any(|l| l.contains(&granted)),
                "{granted} not executable:\n{policy}"
            );
        }
    }

    fn plan_with_path(path: PathBuf) -> SandboxPlan {
        let mut plan = sample_plan("rhai");
        plan.paths.push(PathRule {
            path,
            access: PathAccess::Read,
            optional: false,
            why: "a hostile name\nwith a line break in its why".into(),
            arch: None,
        });
        plan
    }

    #[test]
    fn quotes_and_backslashes_are_escaped() {
        let hostile = r#"/data/a"b\c) (allow default"#;
        let policy = compile(&plan_with_path(hostile.into()), Path::new(SAMPLE_ENGINE)).unwrap();
        well_formed(&policy).unwrap_or_else(|e| panic!("{e}\n{policy}"));
        assert!(
            policy.contains(r#"(subpath "/data/a\"b\\c) (allow default")"#),
            "{policy}"
        );
        // The why's line break stays inside its comment.
        assert!(policy.contains("; read: a hostile name with a line break in its why"));
        assert!(!policy.contains("\n(allow default"));
        // The scratch directory and the engine are escaped the same way.
        let mut plan = sample_plan("rhai");
        plan.scratch = r#"/s/"x\"#.into();
        let policy = compile(&plan, Path::new(r#"/e/"q"#)).unwrap();
        well_formed(&policy).unwrap();
        assert!(policy.contains(r#"(subpath "/s/\"x\\")"#), "{policy}");
        assert!(policy.contains(r#"(literal "/e/\"q")"#), "{policy}");
    }

    #[test]
    fn paths_that_cannot_be_written_are_errors() {
        let bad: Vec<(PathBuf, &str)> = vec![
            ("/data/line\nbreak".into(), "control character"),
            ("/data/cr\rhere".into(), "control character"),
            ("/data/tab\there".into(), "control character"),
            ("/data/nul\0here".into(), "NUL"),
            ("relative/path".into(), "not absolute"),
            (
                PathBuf::from(OsStr::from_bytes(b"/data/not-utf8-\xff")),
                "not UTF-8",
            ),
        ];
        for (path, why) in bad {
            // As a profile path, the scratch dir, a backend path, the engine.
            let e = compile(&plan_with_path(path.clone()), Path::new(SAMPLE_ENGINE)).unwrap_err();
            assert!(e.to_string().contains(why), "{path:?}: {e}");
            let mut plan = sample_plan("python");
            plan.scratch = path.clone();
            assert!(
                compile(&plan, Path::new(SAMPLE_ENGINE)).is_err(),
                "{path:?}"
            );
            let mut plan = sample_plan("python");
            plan.read_only.push(path.clone());
            assert!(
                compile(&plan, Path::new(SAMPLE_ENGINE)).is_err(),
                "{path:?}"
            );
            let mut plan = sample_plan("python");
            plan.exec.push(path.clone());
            assert!(
                compile(&plan, Path::new(SAMPLE_ENGINE)).is_err(),
                "{path:?}"
            );
            assert!(compile(&sample_plan("rhai"), &path).is_err(), "{path:?}");
        }
    }

    #[test]
    fn private_aliases() {
        assert_eq!(
            private_alias(Path::new("/etc/localtime")),
            Some(PathBuf::from("/private/etc/localtime"))
        );
        assert_eq!(
            private_alias(Path::new("/tmp")),
            Some(PathBuf::from("/private/tmp"))
        );
        assert_eq!(private_alias(Path::new("/usr/lib")), None);
        assert_eq!(private_alias(Path::new("/etcetera")), None);
    }
}
