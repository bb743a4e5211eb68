//! One escape attempt: its source and the header that says what it tries,
//! what a sandbox must do, and how the harness judges it.
//!
//! A header is the block of `key: value` comment lines at the top of the file
//! (`#` for Python and shell, `//` for Rhai). It ends at the first line that is
//! not such a comment. Parsing is strict: an unknown key, a bad value or a
//! missing required key is an error naming the file and the key, so a typo
//! cannot quietly turn a check off.

use serde::Serialize;
use std::time::Duration;

/// The language an attack is written in (and the `--lang` it runs with).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Lang {
    Python,
    Rhai,
    Shell,
}

impl Lang {
    pub fn as_str(self) -> &'static str {
        match self {
            Lang::Python => "python",
            Lang::Rhai => "rhai",
            Lang::Shell => "shell",
        }
    }

    /// The directory under `security-tests/` and the file extension.
    pub fn dir_and_ext(self) -> (&'static str, &'static str) {
        match self {
            Lang::Python => ("python", "py"),
            Lang::Rhai => ("rhai", "rhai"),
            Lang::Shell => ("shell", "sh"),
        }
    }

    fn comment(self) -> &'static str {
        match self {
            Lang::Python | Lang::Shell => "#",
            Lang::Rhai => "//",
        }
    }

    pub fn from_ext(ext: &str) -> Option<Lang> {
        match ext {
            "py" => Some(Lang::Python),
            "rhai" => Some(Lang::Rhai),
            "sh" => Some(Lang::Shell),
            _ => None,
        }
    }
}

impl std::str::FromStr for Lang {
    type Err = String;
    fn from_str(s: &str) -> Result<Lang, String> {
        match s {
            "python" | "py" => Ok(Lang::Python),
            "rhai" => Ok(Lang::Rhai),
            "shell" | "sh" => Ok(Lang::Shell),
            other => Err(format!("unknown language {other:?} (python, rhai, shell)")),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Category {
    Filesystem,
    Network,
    Process,
    Resource,
    Leak,
    Protocol,
    Rhai,
}

impl Category {
    pub fn as_str(self) -> &'static str {
        match self {
            Category::Filesystem => "filesystem",
            Category::Network => "network",
            Category::Process => "process",
            Category::Resource => "resource",
            Category::Leak => "leak",
            Category::Protocol => "protocol",
            Category::Rhai => "rhai",
        }
    }

    fn parse(s: &str) -> Option<Category> {
        Some(match s {
            "filesystem" => Category::Filesystem,
            "network" => Category::Network,
            "process" => Category::Process,
            "resource" => Category::Resource,
            "leak" => Category::Leak,
            "protocol" => Category::Protocol,
            "rhai" => Category::Rhai,
            _ => return None,
        })
    }
}

/// Something the harness plants or measures and checks after the run. The
/// leak checks (planted secret token, `API_KEY`, the supervisor's command-line
/// token, the inherited-fd token) and the survivor check apply to every
/// attack; these are the extra ones an attack asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Canary {
    /// The planted secret file: its token in output, or the file changed.
    SecretFile,
    /// The loopback TCP listener saw a connection.
    Tcp,
    /// The loopback UDP listener received a datagram.
    Udp,
    /// The pathname unix socket listener saw a connection.
    Unix,
    /// The abstract unix socket listener saw a connection.
    Abstract,
    /// A victim process died, or a stopped victim was continued.
    Victim,
    /// Something appeared in the harness's outside directory.
    ScratchEscape,
    /// A digest of a host file (/etc/shadow, /root, /proc/1/environ) in output.
    HostFiles,
    /// The host's hostname, interface names, addresses or MACs in output.
    HostId,
    /// The harness could connect to `{{BIND_PORT}}` while the cell ran.
    Bind,
    /// `{{FORGE_TOKEN}}` reached a result field other than stdout/stderr.
    Forged,
    /// The result's stdout was not capped.
    OutputCap,
    /// The supervisor's peak RSS grew past the bound.
    SupervisorRss,
    /// A file named with the run's marker appeared in a host temp directory
    /// (/tmp, /var/tmp, /dev/shm, /run/lock). Checked for every attack.
    HostTmp,
}

impl Canary {
    fn parse(s: &str) -> Option<Canary> {
        Some(match s {
            "secret_file" => Canary::SecretFile,
            "tcp" => Canary::Tcp,
            "udp" => Canary::Udp,
            "unix" => Canary::Unix,
            "abstract" => Canary::Abstract,
            "victim" => Canary::Victim,
            "scratch_escape" => Canary::ScratchEscape,
            "host_files" => Canary::HostFiles,
            "host_id" => Canary::HostId,
            "bind" => Canary::Bind,
            "forged" => Canary::Forged,
            "output_cap" => Canary::OutputCap,
            "supervisor_rss" => Canary::SupervisorRss,
            "host_tmp" => Canary::HostTmp,
            _ => return None,
        })
    }
}

/// The wall timeout given to a cell when the header names none.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, Clone, Serialize)]
pub struct Attack {
    /// The `attack:` id, equal to the file stem.
    pub name: String,
    /// Path relative to `security-tests/`, e.g. `python/net_tcp_loopback.py`.
    pub file: String,
    pub lang: Lang,
    pub category: Category,
    pub attempts: String,
    pub expect: String,
    /// Run once unsandboxed first, and require it to escape.
    pub control: bool,
    pub canaries: Vec<Canary>,
    /// Statuses that count as the sandbox stopping the attempt when the script
    /// could not say so itself. Empty: the script must print its own result
    /// and the cell must end `ok`.
    pub statuses: Vec<String>,
    /// Lower-case substrings, one of which must appear in the status, limit or
    /// error of a run that ended without an ATTACK-RESULT line.
    pub denial: Vec<String>,
    #[serde(serialize_with = "secs")]
    pub timeout: Duration,
    #[serde(skip)]
    pub source: String,
}

fn secs<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64())
}

#[derive(Debug, thiserror::Error)]
#[error("security-tests/{file}: {problem}")]
pub struct AttackError {
    pub file: String,
    pub problem: String,
}

impl Attack {
    /// Parse an attack from its path relative to `security-tests/` and its
    /// source.
    pub fn parse(file: &str, source: &str) -> Result<Attack, AttackError> {
        let err = |problem: String| AttackError {
            file: file.to_owned(),
            problem,
        };
        let (stem, ext) = file
            .rsplit('/')
            .next()
            .and_then(|base| base.rsplit_once('.'))
            .ok_or_else(|| err("file name has no extension".into()))?;
        let lang = Lang::from_ext(ext).ok_or_else(|| err(format!("unknown extension .{ext}")))?;
        let (dir, _) = lang.dir_and_ext();
        if !file.starts_with(&format!("{dir}/")) {
            return Err(err(format!("a .{ext} attack belongs in {dir}/")));
        }
        let mut fields: Vec<(String, String)> = Vec::new();
        let prefix = lang.comment();
        for line in source.lines() {
            let Some(rest) = line.strip_prefix(prefix) else {
                break;
            };
            let rest = rest.trim();
            let Some((key, value)) = rest.split_once(':') else {
                break;
            };
            if key.is_empty() || !key.chars().all(|c| c.is_ascii_lowercase() || c == '_') {
                break;
            }
            if fields.iter().any(|(k, _)| k == key) {
                return Err(err(format!("header key {key:?} appears twice")));
            }
            fields.push((key.to_owned(), value.trim().to_owned()));
        }
        let get = |key: &str| {
            fields
                .iter()
                .find(|(k, _)| k == key)
                .map(|(_, v)| v.as_str())
        };
        let required = |key: &str| {
            get(key)
                .filter(|v| !v.is_empty())
                .ok_or_else(|| err(format!("header has no {key:?} line")))
        };
        for (key, _) in &fields {
            const KNOWN: &[&str] = &[
                "attack", "category", "attempts", "expect", "control", "canaries", "status",
                "denial", "timeout",
            ];
            if !KNOWN.contains(&key.as_str()) {
                return Err(err(format!("unknown header key {key:?}")));
            }
        }
        let name = required("attack")?.to_owned();
        if name != stem {
            return Err(err(format!(
                "attack id {name:?} does not match the file name {stem:?}"
            )));
        }
        let category = required("category")?;
        let category = Category::parse(category)
            .ok_or_else(|| err(format!("unknown category {category:?}")))?;
        let control = match required("control")? {
            "yes" => true,
            "no" => false,
            other => return Err(err(format!("control must be yes or no, not {other:?}"))),
        };
        if control && lang == Lang::Rhai {
            return Err(err(
                "Rhai has no unsandboxed form: a Rhai attack cannot be control: yes".into(),
            ));
        }
        let mut canaries = Vec::new();
        for c in required("canaries")?.split(',').map(str::trim) {
            if c == "none" {
                continue;
            }
            let canary = Canary::parse(c).ok_or_else(|| err(format!("unknown canary {c:?}")))?;
            if !canaries.contains(&canary) {
                canaries.push(canary);
            }
        }
        let mut statuses = Vec::new();
        if let Some(list) = get("status") {
            for s in list.split(',').map(str::trim) {
                if crate::Status::from_name(s).is_none() {
                    return Err(err(format!("unknown status {s:?}")));
                }
                statuses.push(s.to_owned());
            }
        }
        let denial = get("denial")
            .map(|d| {
                d.split('|')
                    .map(|s| s.trim().to_ascii_lowercase())
                    .filter(|s| !s.is_empty())
                    .collect()
            })
            .unwrap_or_default();
        let timeout = match get("timeout") {
            None => DEFAULT_TIMEOUT,
            Some(t) => {
                let secs: f64 = t
                    .parse()
                    .map_err(|_| err(format!("timeout {t:?} is not a number of seconds")))?;
                if !(secs.is_finite() && secs > 0.0 && secs <= 120.0) {
                    return Err(err(format!(
                        "timeout {t:?} must be within (0, 120] seconds"
                    )));
                }
                Duration::from_secs_f64(secs)
            }
        };
        Ok(Attack {
            name,
            file: file.to_owned(),
            lang,
            category,
            attempts: required("attempts")?.to_owned(),
            expect: required("expect")?.to_owned(),
            control,
            canaries,
            statuses,
            denial,
            timeout,
            source: source.to_owned(),
        })
    }

    pub fn wants(&self, c: Canary) -> bool {
        self.canaries.contains(&c)
    }

    /// The placeholders the source uses, e.g. `VICTIM_PID`.
    pub fn uses(&self, placeholder: &str) -> bool {
        self.source.contains(&format!("{{{{{placeholder}}}}}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "# attack: net_x\n# category: network\n# attempts: connect\n\
        # expect: EPERM\n# control: yes\n# canaries: tcp, udp\n# status: ok,timeout\n\
        # denial: Limit|timeout\n# timeout: 2.5\n# A free comment: ends the header\nimport os\n";

    #[test]
    fn parses_a_full_header() {
        let a = Attack::parse("python/net_x.py", GOOD).unwrap();
        assert_eq!(a.name, "net_x");
        assert_eq!(a.lang, Lang::Python);
        assert_eq!(a.category, Category::Network);
        assert!(a.control);
        assert_eq!(a.canaries, vec![Canary::Tcp, Canary::Udp]);
        assert_eq!(a.statuses, vec!["ok", "timeout"]);
        assert_eq!(a.denial, vec!["limit", "timeout"]);
        assert_eq!(a.timeout, Duration::from_millis(2500));
    }

    #[test]
    fn rejects_what_would_silently_weaken_a_check() {
        let cases = [
            ("python/other.py", GOOD, "does not match"),
            ("rhai/net_x.py", GOOD, "belongs in python/"),
            (
                "python/net_x.py",
                &GOOD.replace("canaries: tcp", "canaries: tpc"),
                "unknown canary",
            ),
            (
                "python/net_x.py",
                &GOOD.replace("status: ok", "status: okay"),
                "unknown status",
            ),
            (
                "python/net_x.py",
                &GOOD.replace("control: yes", "control: maybe"),
                "yes or no",
            ),
            (
                "python/net_x.py",
                &GOOD.replace("# expect: EPERM\n", ""),
                "no \"expect\"",
            ),
            (
                "python/net_x.py",
                &GOOD.replace("# timeout: 2.5", "# timeuot: 2.5"),
                "unknown header key",
            ),
            (
                "python/net_x.py",
                &GOOD.replace("# timeout: 2.5", "# timeout: 1e9"),
                "within",
            ),
        ];
        for (file, src, want) in cases {
            let e = Attack::parse(file, src).unwrap_err().to_string();
            assert!(e.contains(want), "{file}: {e:?} lacks {want:?}");
        }
    }

    #[test]
    fn rhai_cannot_have_a_control_run() {
        let src = "// attack: r\n// category: rhai\n// attempts: a\n// expect: b\n\
                   // control: yes\n// canaries: none\n";
        let e = Attack::parse("rhai/r.rhai", src).unwrap_err().to_string();
        assert!(e.contains("unsandboxed"), "{e}");
    }

    #[test]
    fn none_means_no_extra_canaries_and_defaults_apply() {
        let src = "// attack: r\n// category: rhai\n// attempts: a\n// expect: b\n\
                   // control: no\n// canaries: none\nloop {}\n";
        let a = Attack::parse("rhai/r.rhai", src).unwrap();
        assert!(a.canaries.is_empty());
        assert!(a.statuses.is_empty());
        assert_eq!(a.timeout, DEFAULT_TIMEOUT);
    }
}
