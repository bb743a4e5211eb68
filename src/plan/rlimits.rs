//! A cell's OS resource limits.
//!
//! The five limits are declared once, in [`Rlimits`], and named once, with
//! the resource each one sets, in [`Rlimits::each`]. Every table that holds
//! them holds this struct: a profile's `[limits]` and [`crate::Limits`]
//! flatten it beside their other keys (`#[serde(flatten)]`, so the TOML and
//! JSON stay one flat table), the sandbox plan and a zygote cell's setup
//! carry it as it is, a pool's ceiling is one, and the Python zygote sets
//! the limits by the names and resources the supervisor sends it
//! (`sandbox::zygote::python_config`).
//!
//! Which values a cell gets: the session's limits (or a call's, which only
//! lower them) under its profile's `[limits]`, a ceiling
//! ([`Rlimits::min`]); see `Limits::under_profile`.

use rlimit::Resource;
use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serialize};
use std::sync::OnceLock;

/// A cell's OS resource limits: soft and hard limits are equal, except CPU
/// time (see [`Rlimits::each`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rlimits {
    /// CPU seconds.
    pub cpu_seconds: u64,
    /// Address space bytes.
    pub memory_bytes: u64,
    /// Processes and threads (counted per user namespace).
    pub max_processes: u64,
    /// Open file descriptors.
    pub max_open_files: u64,
    /// Largest file the cell may write.
    pub max_file_size_bytes: u64,
}

/// The library's default limits of a cell (`Limits::default`'s).
impl Default for Rlimits {
    fn default() -> Rlimits {
        Rlimits {
            cpu_seconds: 60,
            memory_bytes: 1024 * 1024 * 1024,
            max_processes: 64,
            max_open_files: 256,
            max_file_size_bytes: 64 * 1024 * 1024,
        }
    }
}

/// One limit of [`Rlimits`]: its name (as in every format), the resource it
/// sets and its value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rlimit {
    pub name: &'static str,
    pub resource: Resource,
    pub value: u64,
}

impl Rlimits {
    /// Each limit, in the order the sandbox sets them. The one place a
    /// limit's name is paired with its `RLIMIT_*` resource. RLIMIT_CPU's
    /// hard limit is set one second above its soft one, so that SIGXCPU
    /// comes before SIGKILL.
    pub fn each(&self) -> [Rlimit; 5] {
        let r = |name, resource, value| Rlimit {
            name,
            resource,
            value,
        };
        [
            r("cpu_seconds", Resource::CPU, self.cpu_seconds),
            r("memory_bytes", Resource::AS, self.memory_bytes),
            r(
                "max_file_size_bytes",
                Resource::FSIZE,
                self.max_file_size_bytes,
            ),
            r("max_open_files", Resource::NOFILE, self.max_open_files),
            r("max_processes", Resource::NPROC, self.max_processes),
        ]
    }

    /// Each limit's name and resource, in the order of [`Rlimits::each`].
    pub fn names() -> [(&'static str, Resource); 5] {
        let any = Rlimits {
            cpu_seconds: 0,
            memory_bytes: 0,
            max_processes: 0,
            max_open_files: 0,
            max_file_size_bytes: 0,
        };
        any.each().map(|l| (l.name, l.resource))
    }

    /// Field-wise minimum: the lower of each pair.
    pub fn min(&self, other: &Rlimits) -> Rlimits {
        Rlimits {
            cpu_seconds: self.cpu_seconds.min(other.cpu_seconds),
            memory_bytes: self.memory_bytes.min(other.memory_bytes),
            max_processes: self.max_processes.min(other.max_processes),
            max_open_files: self.max_open_files.min(other.max_open_files),
            max_file_size_bytes: self.max_file_size_bytes.min(other.max_file_size_bytes),
        }
    }

    /// Read the limits from a table in which each may be left out and then
    /// keeps `base`'s value (for a flattened `deserialize_with` in a table
    /// with defaults). Keys that are not limits are left to the outer
    /// table, which refuses the unknown ones.
    pub fn deserialize_over<'de, D: Deserializer<'de>>(
        base: Rlimits,
        d: D,
    ) -> Result<Rlimits, D::Error> {
        use serde_json::{Map, Value};
        /// The entries given, as they are; checked when merged below.
        struct Given;
        impl<'de> serde::de::Visitor<'de> for Given {
            type Value = Map<String, Value>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a table of rlimits")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut a: A,
            ) -> Result<Self::Value, A::Error> {
                let mut m = Map::new();
                while let Some((key, value)) = a.next_entry::<String, Value>()? {
                    m.insert(key, value);
                }
                Ok(m)
            }
        }
        // As a struct with these fields, so that a flattening table hands
        // over (and then no longer holds) exactly these keys.
        static FIELDS: OnceLock<[&str; 5]> = OnceLock::new();
        let fields = FIELDS.get_or_init(|| Rlimits::names().map(|(name, _)| name));
        let given = d.deserialize_struct("Rlimits", fields, Given)?;
        let Value::Object(mut all) = serde_json::to_value(base).map_err(D::Error::custom)? else {
            return Err(D::Error::custom("rlimits are not a table"));
        };
        for (key, value) in given {
            if let Some(slot) = all.get_mut(&key) {
                *slot = value;
            }
        }
        serde_json::from_value(Value::Object(all)).map_err(D::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SOME: Rlimits = Rlimits {
        cpu_seconds: 1,
        memory_bytes: 2,
        max_processes: 3,
        max_open_files: 4,
        max_file_size_bytes: 5,
    };

    #[test]
    fn each_names_every_field_once_as_serde_does() {
        let Ok(serde_json::Value::Object(m)) = serde_json::to_value(SOME) else {
            panic!("not an object");
        };
        let mut names: Vec<&str> = SOME.each().iter().map(|r| r.name).collect();
        names.sort_unstable();
        let mut keys: Vec<&str> = m.keys().map(String::as_str).collect();
        keys.sort_unstable();
        assert_eq!(names, keys);
        for r in SOME.each() {
            assert_eq!(m[r.name], r.value, "{}", r.name);
        }
        let resources: std::collections::BTreeSet<&str> =
            SOME.each().iter().map(|r| r.resource.as_name()).collect();
        assert_eq!(resources.len(), 5);
    }

    #[test]
    fn min_is_field_wise() {
        let other = Rlimits {
            cpu_seconds: 0,
            memory_bytes: 9,
            max_processes: 0,
            max_open_files: 9,
            max_file_size_bytes: 0,
        };
        let m = SOME.min(&other);
        assert_eq!(m, other.min(&SOME));
        assert_eq!(
            m,
            Rlimits {
                cpu_seconds: 0,
                memory_bytes: 2,
                max_processes: 0,
                max_open_files: 4,
                max_file_size_bytes: 0,
            }
        );
    }

    #[test]
    fn a_left_out_limit_keeps_the_base_value() {
        let over = |json: &str| {
            let mut d = serde_json::Deserializer::from_str(json);
            Rlimits::deserialize_over(SOME, &mut d)
        };
        assert_eq!(over("{}").unwrap(), SOME);
        assert_eq!(
            over(r#"{"max_open_files":40,"other":"x"}"#).unwrap(),
            Rlimits {
                max_open_files: 40,
                ..SOME
            }
        );
        assert!(over(r#"{"cpu_seconds":-1}"#).is_err());
        assert!(over(r#"{"cpu_seconds":null}"#).is_err());
    }
}
