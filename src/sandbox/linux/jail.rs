//! The jail sequence on Linux: [`sequence`] applies the layers in order,
//! one line per layer; what each process does with a layer comes from the
//! table in [`crate::sandbox::jail`].

use super::{apply_seccomp, host_ids, hygiene, landlock, layer, mounts, namespaces};
use super::{privileges, rlimits, sys, view};
use crate::profiles::LayerMode;
use crate::sandbox::jail::{step, Entry, Step};
use crate::sandbox::{Layer, SandboxError, SandboxPlan, SandboxReport};
use std::os::fd::BorrowedFd;

/// How the namespaces step finds the process.
pub(crate) enum Start<'a> {
    /// Not in them yet: the step clones into them (and returns in the
    /// clone).
    Clone,
    /// Cloned into them by the process on the host side, maps written;
    /// `control` is a socket whose other end that process holds while it
    /// lives (the step keeps a handle on it to check).
    Cloned {
        names: Vec<&'static str>,
        setgroups: bool,
        control: BorrowedFd<'a>,
    },
    /// Not in them, and not going to be: the report line to push.
    Without(LayerMode, String),
}

/// One process entering the sandbox.
pub(crate) struct Jail<'a> {
    plan: &'a SandboxPlan,
    entry: Entry,
    ids: namespaces::HostIds,
    report: SandboxReport,
    /// The report of the process this one was forked from (for what it
    /// inherits).
    parent: Option<&'a SandboxReport>,
    /// Hygiene: hand the scratch directory to these ids; who is calling.
    owner: Option<(u32, u32)>,
    caller: hygiene::Caller,
    start: Start<'a>,
    /// What the cell will see: resolved by the caller before a clone, or
    /// by the namespaces step.
    given_view: Option<&'a view::FsView>,
    view: Option<view::FsView>,
    in_ns: Option<namespaces::InNamespaces>,
}

/// Apply the layers of `jail`, in the order of docs/architecture.md §3.
pub(crate) fn sequence(mut jail: Jail<'_>) -> Result<SandboxReport, SandboxError> {
    jail.hygiene()?;
    jail.namespaces()?;
    jail.rlimits()?;
    jail.privileges()?;
    jail.landlock()?;
    jail.seccomp()?;
    Ok(jail.report)
}

impl<'a> Jail<'a> {
    /// A worker, the fork server or a zygote: a process that enters from
    /// outside, cloning into the namespaces itself.
    pub(crate) fn new(plan: &'a SandboxPlan, entry: Entry) -> Jail<'a> {
        let mut ids = host_ids(plan);
        if ids.sub.is_some() && entry != Entry::Worker {
            // Subordinate ids are for a worker's cell, whose scratch
            // directory it hands over and the supervisor removes with them;
            // the pools' cells keep the user's own ids.
            ids = super::own_ids();
        }
        Jail {
            plan,
            entry,
            ids,
            report: SandboxReport {
                profile: plan.profile.clone(),
                ..SandboxReport::default()
            },
            parent: None,
            owner: ids.root.then_some((ids.uid, ids.gid)),
            caller: hygiene::Caller::Worker,
            start: Start::Clone,
            given_view: None,
            view: None,
            in_ns: None,
        }
    }

    /// A pool process (the fork server, a zygote) that the supervisor
    /// cloned into the namespaces `names` and wrote the maps of
    /// ([`namespaces::clone_exec_mapped`]); `control` is its channel to the
    /// supervisor, which the supervisor holds while it lives.
    pub(crate) fn cloned(
        plan: &'a SandboxPlan,
        entry: Entry,
        names: Vec<&'static str>,
        control: BorrowedFd<'a>,
    ) -> Jail<'a> {
        let mut jail = Jail::new(plan, entry);
        jail.start = Start::Cloned {
            names,
            // Root's maps are written without denying setgroups; an
            // unprivileged supervisor's own are not.
            setgroups: jail.ids.switches_ids(),
            control,
        };
        jail
    }

    /// A cell forked from a pool process that went through the sequence
    /// as [`Entry::ForkServer`] with the report `parent`.
    pub(crate) fn child_of(plan: &'a SandboxPlan, parent: &'a SandboxReport) -> Jail<'a> {
        let mut jail = Jail::new(plan, Entry::ForkServerChild);
        jail.parent = Some(parent);
        jail
    }

    /// A one-shot cell, cloned by the CLI: `view` was resolved there, the
    /// namespaces are as `start` says.
    pub(crate) fn one_shot(
        plan: &'a SandboxPlan,
        ids: namespaces::HostIds,
        view: &'a view::FsView,
        owner: Option<(u32, u32)>,
        start: Start<'a>,
    ) -> Jail<'a> {
        Jail {
            plan,
            entry: Entry::OneShot,
            ids,
            report: SandboxReport {
                profile: plan.profile.clone(),
                ..SandboxReport::default()
            },
            parent: None,
            owner,
            caller: hygiene::Caller::FreshClone,
            start,
            given_view: Some(view),
            view: None,
            in_ns: None,
        }
    }

    fn view(&self) -> Option<&view::FsView> {
        self.given_view.or(self.view.as_ref())
    }

    fn step(&self, layer: Layer) -> Step {
        // Every layer called by `sequence` is in the table.
        step(self.entry, layer).unwrap_or(Step::Apply)
    }

    /// Copy the parent's report line for `layer`.
    fn inherit(&mut self, layer: Layer) -> Result<(), SandboxError> {
        let Some(parent) = self.parent else {
            return Err(SandboxError::new(
                layer,
                "nothing to inherit it from: this process was not forked from a sandboxed one",
            ));
        };
        if let Some(line) = parent.layers.iter().find(|l| l.name == layer.as_str()) {
            self.report.layers.push(line.clone());
        }
        Ok(())
    }

    /// Step 1, hygiene: always, and always required.
    fn hygiene(&mut self) -> Result<(), SandboxError> {
        if self.step(Layer::Hygiene) == Step::Inherit {
            return self.inherit(Layer::Hygiene);
        }
        let plan = self.plan;
        let detail = hygiene::apply(
            &plan.scratch,
            !plan.scratch_in_cell,
            plan.tmp_bytes > 0,
            self.owner,
            self.caller,
        )
        .map_err(|e| SandboxError::new(Layer::Hygiene, e))?;
        self.report
            .push(Layer::Hygiene, LayerMode::Required, true, detail);
        Ok(())
    }

    /// Step 2, namespaces: clone into them (after a successful clone this is the
    /// cell process), then build their contents: the new root, the
    /// hostname.
    fn namespaces(&mut self) -> Result<(), SandboxError> {
        if self.step(Layer::Namespaces) == Step::Inherit {
            if let Some(parent) = self.parent {
                self.report.namespaces = parent.namespaces.clone();
            }
            return self.inherit(Layer::Namespaces);
        }
        let plan = self.plan;
        if self.view().is_none() {
            self.view =
                Some(view::resolve(plan).map_err(|e| SandboxError::new(Layer::Filesystem, e))?);
        }
        let mode = plan.layers.namespaces;
        match std::mem::replace(&mut self.start, Start::Clone) {
            Start::Clone if mode == LayerMode::Off => {
                self.report.push(
                    Layer::Namespaces,
                    LayerMode::Off,
                    false,
                    "off in this profile".into(),
                );
            }
            Start::Clone => match namespaces::clone_into(self.ids) {
                Ok(state) => {
                    self.in_ns = Some(state);
                    if self.ids.sub.is_some() && !plan.scratch_in_cell {
                        // Only now, as root of a namespace that maps the
                        // cell's subordinate ids, may this process give
                        // them the scratch directory (on the host it is
                        // the user, who may not).
                        hygiene::hand_over(&plan.scratch, self.ids.uid, self.ids.gid)
                            .map_err(|e| SandboxError::new(Layer::Hygiene, e))?;
                    }
                }
                Err(e) if e.before_clone() && mode == LayerMode::BestEffort => {
                    self.report
                        .push(Layer::Namespaces, mode, false, e.to_string());
                }
                Err(e) => return Err(SandboxError::new(Layer::Namespaces, e)),
            },
            Start::Cloned {
                names,
                setgroups,
                control,
            } => {
                // A second handle on the sync socket, made after hygiene
                // closed every other inherited fd (close-on-exec).
                let sync = control.try_clone_to_owned().map_err(|e| {
                    SandboxError::new(
                        Layer::Namespaces,
                        format!("failed to keep the sync socket: {e}"),
                    )
                })?;
                self.in_ns = Some(namespaces::InNamespaces {
                    setgroups,
                    names,
                    sync,
                });
            }
            Start::Without(mode, why) => self.report.push(Layer::Namespaces, mode, false, why),
        }
        if self.in_ns.is_none() && self.ids.sub.is_some() {
            // No user namespace to map subordinate ids in: the cell keeps
            // the user's own ids, as without them.
            self.ids = super::own_ids();
        }
        let view = self.given_view.or(self.view.as_ref());
        let (Some(state), Some(view)) = (&self.in_ns, view) else {
            return Ok(());
        };
        let cell = mounts::CellIds {
            uid: self.ids.uid,
            gid: self.ids.gid,
        };
        mounts::build_root(view, plan.tmp_bytes, !plan.show_other_processes, cell)
            .map_err(|e| SandboxError::new(Layer::Namespaces, e))?;
        nix::unistd::sethostname(&plan.hostname).map_err(|e| {
            SandboxError::new(Layer::Namespaces, format!("failed to set hostname: {e}"))
        })?;
        self.report.namespaces = state.names.iter().map(|n| n.to_string()).collect();
        let mut detail = format!("{}; new read-only root", state.names.join(","));
        if let Some(map) = self.ids.sub {
            detail.push_str(&format!(
                "; subordinate ids: the cell's {}:{} are {}:{} on the host",
                self.ids.uid, self.ids.gid, map.uid, map.gid
            ));
        }
        if !view.skipped.is_empty() {
            let skipped: Vec<String> = view
                .skipped
                .iter()
                .map(|p| p.display().to_string())
                .collect();
            detail.push_str(&format!("; optional paths absent: {}", skipped.join(",")));
        }
        self.report.push(Layer::Namespaces, mode, true, detail);
        Ok(())
    }

    /// Step 3, rlimits.
    fn rlimits(&mut self) -> Result<(), SandboxError> {
        match self.step(Layer::Rlimits) {
            Step::Children => Ok(()),
            Step::Inherit => self.inherit(Layer::Rlimits),
            Step::Apply | Step::Nested => {
                let table = rlimits::table(self.plan);
                layer(
                    &mut self.report,
                    Layer::Rlimits,
                    self.plan.layers.rlimits,
                    || rlimits::apply(&table).map(|d| ((), d)),
                )?;
                Ok(())
            }
        }
    }

    /// Step 4, privileges. Running on as root is never acceptable, whatever the
    /// profile says.
    fn privileges(&mut self) -> Result<(), SandboxError> {
        if self.step(Layer::Privileges) == Step::Inherit {
            self.inherit(Layer::Privileges)?;
            if nix::unistd::geteuid().is_root() {
                return Err(SandboxError::new(
                    Layer::Privileges,
                    "the pool process still runs as root; refusing",
                ));
            }
            return Ok(());
        }
        let ids = self.ids;
        let may_setgroups = self.in_ns.as_ref().map_or(ids.root, |s| s.setgroups);
        let dropped = layer(
            &mut self.report,
            Layer::Privileges,
            self.plan.layers.privileges,
            || privileges::apply(ids.uid, ids.gid, may_setgroups).map(|d| ((), d)),
        )?;
        if dropped.is_none() && nix::unistd::geteuid().is_root() {
            return Err(SandboxError::new(
                Layer::Privileges,
                "the cell would run as root; refusing",
            ));
        }
        if let Some(state) = &self.in_ns {
            // The uid change cleared the parent-death signal.
            namespaces::confirm_parent(state)
                .map_err(|e| SandboxError::new(Layer::Namespaces, e))?;
        }
        if let Some(view) = self.view() {
            std::env::set_current_dir(&view.scratch).map_err(|e| {
                SandboxError::new(
                    Layer::Hygiene,
                    format!(
                        "failed to enter scratch dir {}: {e}",
                        view.scratch.display()
                    ),
                )
            })?;
        }
        // Landlock and seccomp need no_new_privs (or CAP_SYS_ADMIN, which
        // the cell must not have); set it even if the privileges layer is
        // off.
        sys::set_no_new_privs().map_err(|e| {
            SandboxError::new(
                Layer::Privileges,
                format!("failed to set no_new_privs: {e}"),
            )
        })
    }

    /// Step 5, Landlock: the plan's rules, or (nested) a domain with no file or
    /// network access at all on top of the inherited one.
    fn landlock(&mut self) -> Result<(), SandboxError> {
        let kernel_abi = sys::landlock_abi();
        let mode = self.plan.layers.landlock;
        match self.step(Layer::Landlock) {
            Step::Children => Ok(()),
            Step::Inherit => self.inherit(Layer::Landlock),
            Step::Nested => {
                let parent = self.parent;
                let outer = parent
                    .and_then(|p| p.layers.iter().find(|l| l.name == Layer::Landlock.as_str()))
                    .map(|l| l.detail.clone())
                    .unwrap_or_default();
                let enforced = layer(&mut self.report, Layer::Landlock, mode, || {
                    landlock::apply(&[], kernel_abi).map(|e| {
                        (
                            e.abi,
                            format!("{outer}; nested per-cell domain: no file or network access"),
                        )
                    })
                })?;
                self.report.landlock_abi = enforced.or(parent.and_then(|p| p.landlock_abi));
                Ok(())
            }
            Step::Apply => {
                let Some(view) = self.given_view.or(self.view.as_ref()) else {
                    return Err(SandboxError::new(
                        Layer::Landlock,
                        "no filesystem view to build the rules from",
                    ));
                };
                let rules = landlock::rules(
                    view,
                    self.plan.tmp_bytes > 0,
                    self.report.namespaces.iter().any(|n| n == "mount"),
                );
                let enforced = layer(&mut self.report, Layer::Landlock, mode, || {
                    landlock::apply(&rules, kernel_abi).map(|e| (e.abi, e.detail.clone()))
                })?;
                self.report.landlock_abi = enforced;
                Ok(())
            }
        }
    }

    /// Step 6, seccomp, last.
    fn seccomp(&mut self) -> Result<(), SandboxError> {
        match self.step(Layer::Seccomp) {
            Step::Children => Ok(()),
            Step::Inherit => self.inherit(Layer::Seccomp),
            Step::Apply | Step::Nested => apply_seccomp(self.plan, &mut self.report),
        }
    }
}
