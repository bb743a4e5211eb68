//! The jail sequence: which layers each way into the sandbox applies.
//!
//! Every sandboxed process of cellbox enters the sandbox through one
//! sequence (`linux::jail::sequence`), one line per layer, in the order of
//! docs/architecture.md §3. What differs between the processes is only what each of them
//! does with a layer, and that is this table, [`SEQUENCE`]: a layer is
//! applied, inherited from the process it was forked from, nested on top of
//! the inherited one, or left to the children.
//!
//! | layer      | worker | one-shot | fork server | its child | zygote | its child |
//! |------------|--------|----------|-------------|-----------|--------|-----------|
//! | hygiene    | apply  | apply    | apply       | inherit   | apply  | apply ¹   |
//! | namespaces | apply  | apply ²  | apply       | inherit   | apply  | inherit   |
//! | rlimits    | apply  | apply    | children    | apply     | apply  | apply ¹   |
//! | privileges | apply  | apply    | apply       | inherit   | apply  | inherit   |
//! | landlock   | apply  | apply    | apply       | nested    | apply  | nested ¹  |
//! | seccomp    | apply  | apply    | children    | apply     | apply  | nested ¹  |
//!
//! ¹ In Python, in `zygote.py`'s `_child` (the zygote's children are forked
//! by the interpreter); [`Row::python`] names the call that does it, and a
//! test checks that `_child` makes those calls in this order.
//! ² The clone into the namespaces is made by the CLI (`sandbox::oneshot`);
//! the cell builds their contents (new root, hostname).
//!
//! The cgroup is not a step of the sequence: the supervisor moves each cell
//! process into its groups from outside before it gets code.

use super::Layer;

/// A way into the sandbox: which process is entering it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Entry {
    /// A fresh worker (`cellbox __worker`): runs one cell.
    Worker,
    /// A one-shot cell cloned by the CLI (`cellbox exec`, `cellbox run`).
    OneShot,
    /// The Rhai fork server: the layers it shares with every cell it forks.
    ForkServer,
    /// A cell forked from the fork server.
    ForkServerChild,
    /// A Python zygote, before it execs the interpreter.
    Zygote,
    /// A cell forked by a zygote's interpreter (the steps are in Python).
    ZygoteChild,
}

impl Entry {
    pub const ALL: [Entry; 6] = [
        Entry::Worker,
        Entry::OneShot,
        Entry::ForkServer,
        Entry::ForkServerChild,
        Entry::Zygote,
        Entry::ZygoteChild,
    ];

    fn column(self) -> usize {
        self as usize
    }
}

/// What one entry does with one layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Applied here, from the plan.
    Apply,
    /// Already in force: inherited from the process this one was forked
    /// from, which applied it (its report line is copied).
    Inherit,
    /// A tighter instance stacked on the inherited one: a nested Landlock
    /// domain with no access at all, a second seccomp filter.
    Nested,
    /// Not here: each child of this process applies it (a long-lived pool
    /// process has no per-cell rlimits or seccomp of its own).
    Children,
}

/// One layer of the sequence.
#[derive(Debug, Clone, Copy)]
pub struct Row {
    pub layer: Layer,
    /// By entry, in the order of [`Entry::ALL`].
    pub steps: [Step; 6],
    /// For [`Entry::ZygoteChild`], whose steps run in Python: the call in
    /// `zygote.py`'s `_child` that makes the step (`None`: inherited).
    pub python: Option<&'static str>,
}

use Step::{Apply as A, Children as C, Inherit as I, Nested as N};

/// The sequence, in order. Columns as in [`Entry::ALL`]: worker, one-shot,
/// fork server, its child, zygote, its child.
pub const SEQUENCE: [Row; 6] = [
    Row {
        layer: Layer::Hygiene,
        steps: [A, A, A, I, A, A],
        python: Some("posix.closerange"),
    },
    Row {
        layer: Layer::Namespaces,
        steps: [A, A, A, I, A, I],
        python: None,
    },
    Row {
        layer: Layer::Rlimits,
        steps: [A, A, C, A, A, A],
        python: Some("resource.setrlimit"),
    },
    Row {
        layer: Layer::Privileges,
        steps: [A, A, A, I, A, I],
        python: None,
    },
    Row {
        layer: Layer::Landlock,
        steps: [A, A, A, N, A, N],
        python: Some("nr_landlock_restrict_self"),
    },
    Row {
        layer: Layer::Seccomp,
        steps: [A, A, C, A, A, N],
        python: Some("nr_seccomp"),
    },
];

/// What `entry` does with `layer` (`None`: the layer is not a step of the
/// sequence, e.g. the cgroup).
pub fn step(entry: Entry, layer: Layer) -> Option<Step> {
    SEQUENCE
        .iter()
        .find(|r| r.layer == layer)
        .map(|r| r.steps[entry.column()])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sequence_is_the_design_order() {
        let order: Vec<Layer> = SEQUENCE.iter().map(|r| r.layer).collect();
        assert_eq!(
            order,
            [
                Layer::Hygiene,
                Layer::Namespaces,
                Layer::Rlimits,
                Layer::Privileges,
                Layer::Landlock,
                Layer::Seccomp
            ]
        );
        assert_eq!(step(Entry::Worker, Layer::Cgroup), None);
        for (i, e) in Entry::ALL.into_iter().enumerate() {
            assert_eq!(e.column(), i);
        }
    }

    #[test]
    fn every_cell_ends_up_with_every_layer() {
        // Each entry that runs a cell has every layer in force: applied,
        // inherited or nested; never left to children.
        for entry in [
            Entry::Worker,
            Entry::OneShot,
            Entry::ForkServerChild,
            Entry::ZygoteChild,
        ] {
            for row in SEQUENCE {
                assert_ne!(
                    row.steps[entry.column()],
                    Step::Children,
                    "{entry:?} leaves {} to children",
                    row.layer
                );
            }
        }
        // What a pool leaves to its children, its children apply.
        for row in SEQUENCE {
            if row.steps[Entry::ForkServer.column()] == Step::Children {
                assert_eq!(row.steps[Entry::ForkServerChild.column()], Step::Apply);
            }
            // A child inherits only what its parent applied.
            for (parent, child) in [
                (Entry::ForkServer, Entry::ForkServerChild),
                (Entry::Zygote, Entry::ZygoteChild),
            ] {
                if matches!(row.steps[child.column()], Step::Inherit | Step::Nested) {
                    assert_eq!(row.steps[parent.column()], Step::Apply, "{}", row.layer);
                }
            }
        }
    }

    #[test]
    fn the_zygote_child_makes_its_python_steps_in_order() {
        let source = include_str!("../worker/python/zygote.py");
        let start = source
            .find("def _child(")
            .expect("zygote.py defines _child");
        let body = &source[start..];
        let end = body[1..].find("\ndef ").map_or(body.len(), |i| i + 1);
        let body = &body[..end];
        let mut last = 0;
        for row in SEQUENCE {
            let step = row.steps[Entry::ZygoteChild.column()];
            match (step, row.python) {
                (Step::Apply | Step::Nested, Some(call)) => {
                    let at = body
                        .find(call)
                        .unwrap_or_else(|| panic!("_child does not call {call}"));
                    assert!(at >= last, "_child calls {call} out of order");
                    last = at;
                }
                (Step::Inherit, None) => {}
                other => panic!("{}: {other:?} is not a zygote child step", row.layer),
            }
        }
    }
}
