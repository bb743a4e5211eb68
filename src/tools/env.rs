//! The environment of a helper a declared tool starts: a stdio upstream MCP
//! server (`kind = "mcp"`), or the program of a command tool (`kind =
//! "command"`). It holds what the tool's `env` and `pass_env` name, and
//! nothing else of the supervisor's (docs/architecture.md §2: its model
//! keys and the other tools' tokens stay in the supervisor).
//!
//! `env = { NAME = "literal", NAME2 = { env = "VAR" } }`: a literal, or a
//! secret of the supervisor's environment, read and registered with the
//! redaction ([`crate::secrets`]) when the tool is declared, so whatever
//! the helper prints of it reaches no cell, client, log or event. A secret
//! whose variable is not set fails the helper's start (the call), naming
//! the tool's key: the convention of every secret the configuration names.
//! `pass_env = ["NAME", ...]`: the supervisor's variables by name, not
//! secrets (PATH, HOME, ...); one that is not set is left out.

use super::config::EnvValue;
use std::collections::BTreeMap;
use std::ffi::OsString;

/// The variables the sandbox sets for every process of a cell, a command
/// tool's program included (the worker's hygiene layer): `HOME` and
/// `TMPDIR` name the tool's own scratch directory, `PATH` the programs the
/// sandbox lets it execute, and a fixed locale. A command tool's `env` and
/// `pass_env` may not name them.
pub const SANDBOX_VARS: &[&str] = &["PATH", "HOME", "LANG", "LC_ALL", "TMPDIR"];

/// A valid environment variable name: letters, digits and '_', not
/// starting with a digit.
pub fn valid_env_name(name: &str) -> bool {
    crate::util::valid_var_name(name)
}

/// The value of one variable of a helper's environment.
#[derive(Debug, Clone)]
pub enum HelperValue {
    /// Given in the configuration.
    Literal(String),
    /// A secret of the supervisor's environment (`{ env = "VAR" }`);
    /// `None` when VAR is not set (the helper is then not started).
    Secret {
        var: String,
        value: Option<crate::secrets::Secret>,
    },
    /// Passed through from the supervisor's environment by name
    /// (`pass_env`), when set there.
    Passed(Option<OsString>),
}

/// A helper's environment as the configuration declares it (see the
/// module's documentation).
#[derive(Debug, Clone, Default)]
pub struct HelperEnv {
    vars: Vec<(String, HelperValue)>,
}

/// A tool's `env` or `pass_env` is not valid.
#[derive(Debug, thiserror::Error)]
pub enum EnvError {
    #[error("tools.{name}.{key}: {problem}")]
    Invalid {
        name: String,
        key: &'static str,
        problem: String,
    },
    #[error("tools.{name}: {source}")]
    Secrets {
        name: String,
        #[source]
        source: crate::secrets::SecretsError,
    },
}

impl HelperEnv {
    /// The environment tool `name` declares: its `env` (each secret read
    /// and registered with the redaction now) and `pass_env`. Names that
    /// cannot be variable names, named twice, or in `reserved`, and
    /// literals holding a NUL byte are refused.
    pub fn new(
        name: &str,
        env: &BTreeMap<String, EnvValue>,
        pass_env: &[String],
        reserved: &[&str],
    ) -> Result<HelperEnv, EnvError> {
        let bad = |key, problem: String| EnvError::Invalid {
            name: name.to_owned(),
            key,
            problem,
        };
        let check = |key, var: &str| {
            if !valid_env_name(var) {
                return Err(bad(key, format!("{var:?} is not a variable name")));
            }
            if reserved.contains(&var) {
                return Err(bad(
                    key,
                    format!(
                        "{var} is set by the sandbox ({}: the tool's own scratch directory \
                         and a fixed locale and PATH), not by the configuration",
                        reserved.join(", ")
                    ),
                ));
            }
            Ok(())
        };
        let mut vars = Vec::new();
        for (var, v) in env {
            check("env", var)?;
            let value = match v {
                EnvValue::Literal(s) => {
                    if s.contains('\0') {
                        return Err(bad("env", format!("the value of {var} holds a NUL byte")));
                    }
                    HelperValue::Literal(s.clone())
                }
                EnvValue::FromEnv(f) => {
                    if !valid_env_name(&f.env) {
                        return Err(bad("env", format!("{:?} is not a variable name", f.env)));
                    }
                    HelperValue::Secret {
                        var: f.env.clone(),
                        value: crate::secrets::from_env(&f.env).map_err(|source| {
                            EnvError::Secrets {
                                name: name.to_owned(),
                                source,
                            }
                        })?,
                    }
                }
            };
            vars.push((var.clone(), value));
        }
        for var in pass_env {
            check("pass_env", var)?;
            if env.contains_key(var) || pass_env.iter().filter(|p| *p == var).count() > 1 {
                return Err(bad("pass_env", format!("{var} is named twice")));
            }
            vars.push((var.clone(), HelperValue::Passed(std::env::var_os(var))));
        }
        Ok(HelperEnv { vars })
    }

    pub fn is_empty(&self) -> bool {
        self.vars.is_empty()
    }

    /// The variables the helper starts with; an error naming the variable
    /// and the key when a secret's variable is not set.
    pub fn resolve(&self) -> Result<Vec<(String, OsString)>, String> {
        let mut out = Vec::new();
        for (var, value) in &self.vars {
            match value {
                HelperValue::Literal(v) => out.push((var.clone(), v.into())),
                HelperValue::Secret { value: Some(v), .. } => {
                    out.push((var.clone(), v.expose().into()))
                }
                HelperValue::Secret {
                    value: None,
                    var: from,
                } => {
                    return Err(format!(
                        "the environment variable {from} (env.{var}) is not set"
                    ))
                }
                HelperValue::Passed(Some(v)) => out.push((var.clone(), v.clone())),
                HelperValue::Passed(None) => {}
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::config::FromEnv;

    fn env(pairs: &[(&str, EnvValue)]) -> BTreeMap<String, EnvValue> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), v.clone()))
            .collect()
    }

    #[test]
    fn names_are_checked_and_the_sandbox_keeps_its_own() {
        let lit = |s: &str| EnvValue::Literal(s.into());
        let e = HelperEnv::new("t", &env(&[("A", lit("1"))]), &[], SANDBOX_VARS).unwrap();
        assert_eq!(
            e.resolve().unwrap(),
            [("A".to_owned(), OsString::from("1"))]
        );
        for (bad, pass, want) in [
            (
                env(&[("1A", lit("x"))]),
                vec![],
                "tools.t.env: \"1A\" is not",
            ),
            (env(&[("A=B", lit("x"))]), vec![], "tools.t.env"),
            (
                env(&[("HOME", lit("/"))]),
                vec![],
                "tools.t.env: HOME is set by",
            ),
            (
                env(&[]),
                vec!["PATH".to_owned()],
                "tools.t.pass_env: PATH is set by",
            ),
            (
                env(&[("A", lit("x"))]),
                vec!["A".to_owned()],
                "A is named twice",
            ),
            (env(&[("A", lit("x\0y"))]), vec![], "holds a NUL byte"),
            (
                env(&[("A", EnvValue::FromEnv(FromEnv { env: "B C".into() }))]),
                vec![],
                "\"B C\" is not a variable name",
            ),
        ] {
            let e = HelperEnv::new("t", &bad, &pass, SANDBOX_VARS).unwrap_err();
            assert!(e.to_string().contains(want), "{e}");
        }
        // An upstream server has no sandbox: nothing reserved.
        assert!(HelperEnv::new("t", &env(&[("PATH", lit("/x"))]), &[], &[]).is_ok());
        // A secret that is not set fails the start, naming it and its key.
        let unset = EnvValue::FromEnv(FromEnv {
            env: "CELLBOX_UNIT_NEVER_SET_VARIABLE".into(),
        });
        let e = HelperEnv::new("t", &env(&[("K", unset)]), &[], SANDBOX_VARS).unwrap();
        let e = e.resolve().unwrap_err();
        assert!(
            e.contains("CELLBOX_UNIT_NEVER_SET_VARIABLE (env.K) is not set"),
            "{e}"
        );
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn the_reserved_names_are_the_sandboxs_variables() {
        let fixed = crate::sandbox::linux::hygiene::environment(std::path::Path::new("/s"), true);
        let mut fixed: Vec<&str> = fixed.iter().map(|(k, _)| *k).collect();
        let mut ours = SANDBOX_VARS.to_vec();
        fixed.sort_unstable();
        ours.sort_unstable();
        assert_eq!(fixed, ours);
    }
}
