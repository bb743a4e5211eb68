//! Limits for one cell. Per-call limits may only tighten a session's.

use crate::plan::Rlimits;
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// Every limit a cell runs under. The wall-clock timeout and the output caps
/// are enforced by the supervisor (the guarantee); the rest are applied in
/// the worker (rlimits, engine limits).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Limits {
    /// Wall-clock time for the whole cell, in milliseconds.
    pub timeout_ms: u64,
    /// Bytes of stdout (and, separately, of stderr) kept in the result.
    pub max_output_bytes: usize,
    /// Largest accepted script source.
    pub max_script_bytes: usize,
    /// Largest protocol frame either side may send.
    pub max_frame_bytes: usize,
    /// Rhai: operations before the engine stops the script.
    pub max_operations: u64,
    /// Rhai: function call nesting.
    pub max_call_levels: usize,
    /// Rhai: expression nesting.
    pub max_expr_depth: usize,
    /// Rhai: largest string, array and map.
    pub max_string_bytes: usize,
    pub max_array_len: usize,
    pub max_map_len: usize,
    /// Python: bytes of `display` items (figures, rich values; base64 for
    /// images) a cell keeps in all, and for one item.
    pub max_display_bytes: usize,
    pub max_display_item_bytes: usize,
    /// CPU seconds a session's processes may use over its whole life, all
    /// its cells (and their sub-cells and whatever they started) together,
    /// as its cgroup counts them; 0: no such budget. A cell that would run
    /// with it spent is refused, and one that spends it is ended,
    /// `limit_exceeded` naming it (see docs/architecture.md §10).
    pub session_cpu_seconds: u64,
    /// OS: the cell's rlimits, keys of this table like the others (any
    /// left out keeps its default).
    #[serde(flatten, deserialize_with = "rlimits_over_defaults")]
    pub rlimits: Rlimits,
}

fn rlimits_over_defaults<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Rlimits, D::Error> {
    Rlimits::deserialize_over(Limits::default().rlimits, d)
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            timeout_ms: 30_000,
            max_output_bytes: 1024 * 1024,
            max_script_bytes: 1024 * 1024,
            max_frame_bytes: crate::protocol::DEFAULT_MAX_FRAME_BYTES,
            max_operations: 50_000_000,
            max_call_levels: 64,
            max_expr_depth: 64,
            max_string_bytes: 16 * 1024 * 1024,
            max_array_len: 1_000_000,
            max_map_len: 100_000,
            max_display_bytes: crate::protocol::DEFAULT_MAX_DISPLAY_BYTES,
            max_display_item_bytes: crate::protocol::DEFAULT_MAX_DISPLAY_ITEM_BYTES,
            session_cpu_seconds: DEFAULT_SESSION_CPU_SECONDS,
            rlimits: Rlimits::default(),
        }
    }
}

/// A session's CPU time over its life, by default: an hour, sixty cells
/// of the default `cpu_seconds` each.
pub const DEFAULT_SESSION_CPU_SECONDS: u64 = 3600;

/// Per-call overrides; `None` keeps the session's value. Values larger than
/// the session's are ignored: a call can only tighten.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LimitOverrides {
    pub timeout_ms: Option<u64>,
    pub max_output_bytes: Option<usize>,
    pub max_operations: Option<u64>,
    pub memory_bytes: Option<u64>,
}

impl Limits {
    pub fn timeout(&self) -> Duration {
        Duration::from_millis(self.timeout_ms)
    }

    /// The limits with `o` applied, never wider than `self`.
    pub fn tighten(&self, o: &LimitOverrides) -> Limits {
        fn min<T: Ord + Copy>(base: T, o: Option<T>) -> T {
            o.map_or(base, |v| v.min(base))
        }
        Limits {
            timeout_ms: min(self.timeout_ms, o.timeout_ms),
            max_output_bytes: min(self.max_output_bytes, o.max_output_bytes),
            max_operations: min(self.max_operations, o.max_operations),
            rlimits: Rlimits {
                memory_bytes: min(self.rlimits.memory_bytes, o.memory_bytes),
                ..self.rlimits
            },
            ..self.clone()
        }
    }

    /// Field-wise minimum: a child never gets more than its parent.
    pub fn narrow(&self, other: &Limits) -> Limits {
        Limits {
            timeout_ms: self.timeout_ms.min(other.timeout_ms),
            max_output_bytes: self.max_output_bytes.min(other.max_output_bytes),
            max_script_bytes: self.max_script_bytes.min(other.max_script_bytes),
            max_frame_bytes: self.max_frame_bytes.min(other.max_frame_bytes),
            max_operations: self.max_operations.min(other.max_operations),
            max_call_levels: self.max_call_levels.min(other.max_call_levels),
            max_expr_depth: self.max_expr_depth.min(other.max_expr_depth),
            max_string_bytes: self.max_string_bytes.min(other.max_string_bytes),
            max_array_len: self.max_array_len.min(other.max_array_len),
            max_map_len: self.max_map_len.min(other.max_map_len),
            max_display_bytes: self.max_display_bytes.min(other.max_display_bytes),
            max_display_item_bytes: self
                .max_display_item_bytes
                .min(other.max_display_item_bytes),
            session_cpu_seconds: narrow_budget(self.session_cpu_seconds, other.session_cpu_seconds),
            rlimits: self.rlimits.min(&other.rlimits),
        }
    }

    /// These limits under a sandbox profile's `[limits]`, which is a
    /// ceiling: each OS limit is the lower of the two. Session and call
    /// limits narrow the profile's; they never widen it.
    pub fn under_profile(&self, ceiling: &crate::profiles::LimitsSpec) -> Limits {
        Limits {
            rlimits: self.rlimits.min(&ceiling.rlimits),
            ..self.clone()
        }
    }

    pub(crate) fn script_limits(&self) -> crate::protocol::ScriptLimits {
        crate::protocol::ScriptLimits {
            timeout_ms: self.timeout_ms,
            max_operations: self.max_operations,
            max_call_levels: self.max_call_levels,
            max_expr_depth: self.max_expr_depth,
            max_string_bytes: self.max_string_bytes,
            max_array_len: self.max_array_len,
            max_map_len: self.max_map_len,
            max_display_bytes: self.max_display_bytes,
            max_display_item_bytes: self.max_display_item_bytes,
        }
    }
}

/// The narrower of two budgets where 0 is none.
fn narrow_budget(a: u64, b: u64) -> u64 {
    match (a, b) {
        (0, n) | (n, 0) => n,
        (a, b) => a.min(b),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overrides_only_tighten() {
        let base = Limits::default();
        let t = base.tighten(&LimitOverrides {
            timeout_ms: Some(1_000_000_000),
            max_output_bytes: Some(10),
            ..Default::default()
        });
        assert_eq!(t.timeout_ms, base.timeout_ms);
        assert_eq!(t.max_output_bytes, 10);
    }

    #[test]
    fn a_profile_is_a_ceiling() {
        let ceiling = crate::profiles::LimitsSpec {
            rlimits: Rlimits {
                cpu_seconds: 7,
                memory_bytes: 4 << 30,
                max_processes: 1,
                max_open_files: 17,
                max_file_size_bytes: 1 << 20,
            },
            stack_bytes: 8 << 20,
        };
        let session = Limits {
            rlimits: Rlimits {
                max_open_files: 10,
                ..Limits::default().rlimits
            },
            ..Limits::default()
        };
        let l = session.under_profile(&ceiling).rlimits;
        assert_eq!(l.cpu_seconds, 7);
        // Below the ceiling, the session's own value stays.
        assert_eq!(l.memory_bytes, session.rlimits.memory_bytes);
        assert_eq!(l.max_processes, 1);
        assert_eq!(l.max_open_files, 10);
        assert_eq!(l.max_file_size_bytes, 1 << 20);
        assert_eq!(
            session.under_profile(&ceiling).timeout_ms,
            session.timeout_ms
        );
    }

    /// The shapes of `Limits` in JSON (a result's `asked` limits) and TOML
    /// (`cellbox serve`'s `[limits]`): one flat table, in this order.
    const JSON: &str = concat!(
        r#"{"timeout_ms":30000,"max_output_bytes":1048576,"max_script_bytes":1048576,"#,
        r#""max_frame_bytes":8388608,"max_operations":50000000,"max_call_levels":64,"#,
        r#""max_expr_depth":64,"max_string_bytes":16777216,"max_array_len":1000000,"#,
        r#""max_map_len":100000,"max_display_bytes":327680,"max_display_item_bytes":262144,"#,
        r#""session_cpu_seconds":3600,"#,
        r#""cpu_seconds":60,"memory_bytes":1073741824,"#,
        r#""max_processes":64,"max_open_files":256,"max_file_size_bytes":67108864}"#
    );

    #[test]
    fn the_json_and_toml_shapes_stay() {
        let l = Limits::default();
        assert_eq!(serde_json::to_string(&l).unwrap(), JSON);
        assert_eq!(serde_json::from_str::<Limits>(JSON).unwrap(), l);
        let toml_text = toml::to_string(&l).unwrap();
        let lines: Vec<String> = JSON
            .trim_matches(['{', '}'])
            .split(',')
            .map(|kv| kv.replacen(':', " = ", 1).replace('"', ""))
            .collect();
        assert_eq!(toml_text, lines.join("\n") + "\n");
        assert_eq!(toml::from_str::<Limits>(&toml_text).unwrap(), l);
    }

    #[test]
    fn any_field_may_be_left_out_and_none_may_be_unknown() {
        let l: Limits = serde_json::from_str(r#"{"max_open_files":9,"timeout_ms":7}"#).unwrap();
        let want = Limits {
            timeout_ms: 7,
            rlimits: Rlimits {
                max_open_files: 9,
                ..Limits::default().rlimits
            },
            ..Limits::default()
        };
        assert_eq!(l, want);
        let l: Limits = toml::from_str("cpu_seconds = 5").unwrap();
        let want = Limits {
            rlimits: Rlimits {
                cpu_seconds: 5,
                ..Limits::default().rlimits
            },
            ..Limits::default()
        };
        assert_eq!(l, want);
        assert_eq!(
            serde_json::from_str::<Limits>("{}").unwrap(),
            Limits::default()
        );
        for bad in [
            r#"{"cpu_second":5}"#,
            r#"{"cpu_seconds":-1}"#,
            r#"{"cpu_seconds":null}"#,
            r#"{"cpu_seconds":"5"}"#,
            r#"{"timeout_ms":-1}"#,
        ] {
            let e = serde_json::from_str::<Limits>(bad).unwrap_err().to_string();
            assert!(
                e.contains("cpu_second") || e.contains("invalid"),
                "{bad}: {e}"
            );
        }
        let e = toml::from_str::<Limits>("max_open_file = 1").unwrap_err();
        assert!(
            e.to_string().contains("unknown field `max_open_file`"),
            "{e}"
        );
    }
}
