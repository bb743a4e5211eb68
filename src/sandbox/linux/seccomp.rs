//! The seccomp layer: an allowlist per profile, applied last.
//!
//! [`build_program`] turns a profile's [`SeccompSpec`] into one BPF program:
//!
//! an architecture check, then a binary search over the syscall numbers
//! that have a [`Verdict`] ([`verdicts`]): listed syscalls are allowed,
//! some only with filtered arguments; `clone3` answers ENOSYS (so libc falls
//! back to `clone`, whose flags the filter can see); syscalls in `deny`
//! groups whose action is `kill` kill the process; everything else fails
//! with EPERM.
//!
//! One program rather than several stacked filters, because the kernel keeps
//! the first-seen errno among equal actions, and a filter installed after the
//! allowlist would need `seccomp(2)` itself to be allowed.
//!
//! Argument filters (all compare 32-bit values on the low half of the
//! register, which is what the kernel itself uses for these arguments):
//! - `ioctl`: only the named requests. TIOCSTI is never allowed, and a
//!   request with high bits set is compared on its low 32 bits, so
//!   `TIOCSTI | 1 << 32` is denied too;
//! - `clone`: only without any `CLONE_NEW*` flag;
//! - `socket` / `socketpair`: only the named address families;
//! - `prctl`: only the named options;
//! - `prlimit64`: only on the calling process (pid 0);
//! - `execve`: never, always, or only with the exec gate's pathname pointer.
//!
//! Syscall numbers are per architecture; the program starts with an
//! architecture check that kills on a foreign ABI (i386 via `int 0x80`), and
//! x32 numbers (bit 30 set) simply match nothing and get EPERM.

use crate::profiles::{
    address_family, ioctl_request, prctl_option, DenyAction, ExecMode, SeccompSpec,
};
use seccompiler::{sock_filter, BpfProgram};
use std::collections::BTreeMap;

/// Every namespace-creating clone flag (CLONE_NEWTIME is not settable via
/// `clone`: that bit is part of the exit signal there).
pub const CLONE_NEW_MASK: u64 = (libc::CLONE_NEWNS
    | libc::CLONE_NEWCGROUP
    | libc::CLONE_NEWUTS
    | libc::CLONE_NEWIPC
    | libc::CLONE_NEWUSER
    | libc::CLONE_NEWPID
    | libc::CLONE_NEWNET) as u64;

// struct seccomp_data offsets.
const DATA_NR: u32 = 0;
const DATA_ARCH: u32 = 4;
const DATA_ARGS: u32 = 16;

// Classic BPF opcodes.
const BPF_LD_W_ABS: u16 = 0x20;
const BPF_ALU_AND_K: u16 = 0x54;
const BPF_JA: u16 = 0x05;
const BPF_JEQ_K: u16 = 0x15;
const BPF_JGE_K: u16 = 0x35;
const BPF_RET_K: u16 = 0x06;

const SECCOMP_RET_KILL_PROCESS: u32 = 0x8000_0000;
const SECCOMP_RET_ERRNO: u32 = 0x0005_0000;
const SECCOMP_RET_ALLOW: u32 = 0x7fff_0000;
/// What every syscall not in the allowlist gets.
const RET_EPERM: u32 = SECCOMP_RET_ERRNO | libc::EPERM as u32;

/// Syscall numbers per leaf of the search tree: a leaf compares them one
/// by one, an inner node splits the numbers in two halves.
const LEAF_ENTRIES: usize = 8;
/// The kernel's limit on a classic BPF program (BPF_MAXINSNS).
const MAX_INSNS: usize = 4096;

// The argument loads below read the low half of a 64-bit argument at its
// own offset, which holds only on little-endian machines.
const _: () = assert!(cfg!(target_endian = "little"));

#[derive(Debug, thiserror::Error)]
pub enum SeccompError {
    #[error("architecture {0} is not supported by the seccomp layer")]
    Arch(&'static str),
    #[error("the seccomp program has {0} instructions, more than the kernel accepts")]
    TooLong(usize),
    #[error("the seccomp rule for syscall {nr} is too large for one jump ({len} instructions)")]
    RuleTooLarge { nr: u32, len: usize },
    #[error("exec mode `once` needs the exec gate's address")]
    NoExecGate,
    #[error("failed to install the seccomp filter: {0}")]
    Install(#[source] seccompiler::Error),
}

fn audit_arch() -> Result<u32, SeccompError> {
    match std::env::consts::ARCH {
        "x86_64" => Ok(0xC000_003E),
        "aarch64" => Ok(0xC000_00B7),
        "riscv64" => Ok(0xC000_00F3),
        other => Err(SeccompError::Arch(other)),
    }
}

/// What a filter returns for a call (seccompiler's `SeccompAction`, the
/// three this project uses).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Action {
    Allow,
    /// Fail with this errno.
    Errno(u16),
    /// Kill the whole process (SIGSYS).
    KillProcess,
}

impl Action {
    /// Fail with EPERM: what a call the policy does not name gets.
    pub const EPERM: Action = Action::Errno(libc::EPERM as u16);

    /// The `SECCOMP_RET_*` value.
    pub fn ret(self) -> u32 {
        match self {
            Action::Allow => SECCOMP_RET_ALLOW,
            Action::Errno(e) => SECCOMP_RET_ERRNO | u32::from(e),
            Action::KillProcess => SECCOMP_RET_KILL_PROCESS,
        }
    }
}

/// A check on a syscall's arguments: pass → allowed, fail → EPERM.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum ArgCheck {
    /// The low 32 bits of argument `arg` are one of `values`.
    OneOf { arg: u8, values: Vec<u32> },
    /// The low 32 bits of argument `arg` have none of the `mask` bits set.
    NoneOf { arg: u8, mask: u32 },
    /// Argument `arg`, all 64 bits, equals `value`.
    Equals { arg: u8, value: u64 },
    /// The low 32 bits of argument `arg` are none of `values`.
    NotOneOf { arg: u8, values: Vec<u32> },
}

/// What the filter does with one syscall number.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Verdict {
    /// Return this action.
    Ret(Action),
    /// Allowed when the arguments pass the check.
    Allow(ArgCheck),
}

/// A whole filter before it is compiled: the verdict for each number it
/// names, what every other number gets, and what a call made under
/// another architecture's calling convention gets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Filter {
    pub verdicts: BTreeMap<u32, Verdict>,
    pub default: Action,
    pub foreign_arch: Action,
}

impl Filter {
    /// A cell's filter: what `verdicts` names, EPERM for the rest, a
    /// foreign architecture killed.
    pub fn deny_by_default(verdicts: BTreeMap<u32, Verdict>) -> Filter {
        Filter {
            verdicts,
            default: Action::EPERM,
            foreign_arch: Action::KillProcess,
        }
    }
}

fn number(name: &str) -> Option<u32> {
    crate::sandbox::syscalls::number(name).and_then(|nr| u32::try_from(nr).ok())
}

/// The verdict for every syscall number the profile names, on this
/// architecture (names without a number here have nothing to allow).
///
/// `clone3` answers ENOSYS (so libc falls back to `clone`, whose flags the
/// filter can see), `kill` deny groups kill; these win over the allowlist.
pub fn verdicts(
    spec: &SeccompSpec,
    exec_gate: Option<u64>,
) -> Result<BTreeMap<u32, Verdict>, SeccompError> {
    let mut out = BTreeMap::new();
    let mut set = |name: &str, v: Verdict| {
        if let Some(nr) = number(name) {
            out.insert(nr, v);
        }
    };
    let allow = Verdict::Ret(Action::Allow);
    for group in &spec.allow {
        for name in &group.syscalls {
            let v = match name.as_str() {
                "clone" => Verdict::Allow(ArgCheck::NoneOf {
                    arg: 0,
                    mask: CLONE_NEW_MASK as u32,
                }),
                "prlimit64" => Verdict::Allow(ArgCheck::OneOf {
                    arg: 0,
                    values: vec![0],
                }),
                _ => allow.clone(),
            };
            set(name, v);
        }
    }
    match spec.exec {
        ExecMode::None => {}
        ExecMode::Any => set("execve", allow.clone()),
        ExecMode::Once => {
            let value = exec_gate.ok_or(SeccompError::NoExecGate)?;
            set("execve", Verdict::Allow(ArgCheck::Equals { arg: 0, value }));
        }
    }
    for (name, arg, mut values) in arg_lists(spec) {
        if !values.is_empty() {
            values.sort_unstable();
            values.dedup();
            set(name, Verdict::Allow(ArgCheck::OneOf { arg, values }));
        }
    }
    for group in spec.deny.iter().filter(|g| g.action == DenyAction::Kill) {
        for name in &group.syscalls {
            set(name, Verdict::Ret(Action::KillProcess));
        }
    }
    set("clone3", Verdict::Ret(Action::Errno(libc::ENOSYS as u16)));
    Ok(out)
}

/// The syscalls allowed only for some values of one argument: name, which
/// argument, the allowed values.
fn arg_lists(spec: &SeccompSpec) -> [(&'static str, u8, Vec<u32>); 4] {
    // Names were validated when the profile was loaded; unknown ones map to
    // nothing and are therefore denied.
    [
        (
            "ioctl",
            1,
            spec.ioctl
                .allow
                .iter()
                .filter(|n| n.as_str() != "TIOCSTI")
                .filter_map(|n| ioctl_request(n))
                .collect(),
        ),
        (
            "socket",
            0,
            spec.socket
                .allow
                .iter()
                .filter_map(|n| address_family(n))
                .collect(),
        ),
        (
            "socketpair",
            0,
            spec.socketpair
                .allow
                .iter()
                .filter_map(|n| address_family(n))
                .collect(),
        ),
        (
            "prctl",
            0,
            spec.prctl
                .allow
                .iter()
                .filter_map(|n| prctl_option(n))
                .collect(),
        ),
    ]
}

fn stmt(code: u16, k: u32) -> sock_filter {
    sock_filter {
        code,
        jt: 0,
        jf: 0,
        k,
    }
}

fn jump(code: u16, k: u32, jt: u8, jf: u8) -> sock_filter {
    sock_filter { code, jt, jf, k }
}

/// Load the low (`high` false) or high half of argument `arg`.
fn load_arg(arg: u8, high: bool) -> sock_filter {
    stmt(
        BPF_LD_W_ABS,
        DATA_ARGS + 8 * u32::from(arg) + if high { 4 } else { 0 },
    )
}

/// The instructions that decide one syscall, ending in a return on every
/// path. Jumps stay inside the block.
fn verdict_block(nr: u32, v: &Verdict) -> Result<Vec<sock_filter>, SeccompError> {
    Ok(match v {
        Verdict::Ret(a) => vec![stmt(BPF_RET_K, a.ret())],
        Verdict::Allow(ArgCheck::NoneOf { arg, mask }) => vec![
            load_arg(*arg, false),
            stmt(BPF_ALU_AND_K, *mask),
            jump(BPF_JEQ_K, 0, 0, 1),
            stmt(BPF_RET_K, SECCOMP_RET_ALLOW),
            stmt(BPF_RET_K, RET_EPERM),
        ],
        Verdict::Allow(ArgCheck::Equals { arg, value }) => vec![
            load_arg(*arg, false),
            jump(BPF_JEQ_K, *value as u32, 0, 3),
            load_arg(*arg, true),
            jump(BPF_JEQ_K, (*value >> 32) as u32, 0, 1),
            stmt(BPF_RET_K, SECCOMP_RET_ALLOW),
            stmt(BPF_RET_K, RET_EPERM),
        ],
        Verdict::Allow(ArgCheck::OneOf { arg, values }) => {
            match_block(nr, *arg, values, SECCOMP_RET_ALLOW, RET_EPERM)?
        }
        Verdict::Allow(ArgCheck::NotOneOf { arg, values }) => {
            match_block(nr, *arg, values, RET_EPERM, SECCOMP_RET_ALLOW)?
        }
    })
}

/// Compare the low half of argument `arg` with each of `values`: `hit`
/// when one matches, else `miss`.
/// Shape: ld; jeq v_i → hit (one per value); ret miss; ret hit.
fn match_block(
    nr: u32,
    arg: u8,
    values: &[u32],
    hit: u32,
    miss: u32,
) -> Result<Vec<sock_filter>, SeccompError> {
    let n = values.len();
    let mut b = Vec::with_capacity(n + 3);
    b.push(load_arg(arg, false));
    for (i, v) in values.iter().enumerate() {
        // From jeq i, the `hit` return is n - i instructions ahead.
        let to_hit =
            u8::try_from(n - i).map_err(|_| SeccompError::RuleTooLarge { nr, len: n + 3 })?;
        b.push(jump(BPF_JEQ_K, *v, to_hit, 0));
    }
    b.push(stmt(BPF_RET_K, miss));
    b.push(stmt(BPF_RET_K, hit));
    Ok(b)
}

/// A leaf: compare the number with each entry, `default` if none matches,
/// and each distinct verdict's block after that.
fn emit_leaf(
    entries: &[(u32, Verdict)],
    default: Action,
    out: &mut Vec<sock_filter>,
) -> Result<(), SeccompError> {
    let mut blocks: Vec<(Verdict, Vec<sock_filter>)> = Vec::new();
    // Offsets of each block from the end of the compare chain (the default
    // return comes first).
    let mut block_of = Vec::with_capacity(entries.len());
    let mut at = 1usize;
    for (nr, v) in entries {
        let idx = match blocks.iter().position(|(b, _)| b == v) {
            Some(i) => i,
            None => {
                let code = verdict_block(*nr, v)?;
                blocks.push((v.clone(), code));
                blocks.len() - 1
            }
        };
        block_of.push(idx);
    }
    let mut starts = Vec::with_capacity(blocks.len());
    for (_, code) in &blocks {
        starts.push(at);
        at += code.len();
    }
    let n = entries.len();
    for (i, (nr, _)) in entries.iter().enumerate() {
        // Jump from compare i to its block: past the rest of the chain.
        let off = (n - 1 - i) + starts[block_of[i]];
        let jt = u8::try_from(off).map_err(|_| SeccompError::RuleTooLarge { nr: *nr, len: off })?;
        out.push(jump(BPF_JEQ_K, *nr, jt, 0));
    }
    out.push(stmt(BPF_RET_K, default.ret()));
    for (_, code) in blocks {
        out.extend(code);
    }
    Ok(())
}

/// A binary search over the sorted entries: numbers at or above the middle
/// entry go right (through a long jump), the rest fall through to the left.
fn emit_tree(
    entries: &[(u32, Verdict)],
    default: Action,
    out: &mut Vec<sock_filter>,
) -> Result<(), SeccompError> {
    if entries.len() <= LEAF_ENTRIES {
        return emit_leaf(entries, default, out);
    }
    let mid = entries.len() / 2;
    let (left, right) = entries.split_at(mid);
    // jge mid → the `ja` (to the right half); else skip it.
    out.push(jump(BPF_JGE_K, right[0].0, 0, 1));
    let ja = out.len();
    out.push(stmt(BPF_JA, 0));
    emit_tree(left, default, out)?;
    let skip = out.len() - ja - 1;
    out[ja].k = u32::try_from(skip).map_err(|_| SeccompError::TooLong(out.len()))?;
    emit_tree(right, default, out)
}

/// The whole program for `spec`. `exec_gate` is the address of the exec
/// gate's pathname buffer (needed for `exec = "once"`).
///
/// Shape: kill on a foreign architecture; load the number; a binary
/// search over runs of numbers with one verdict (`range_tree`, or for a
/// program too large for its short jumps a search over the numbers,
/// `emit_tree`). The search keeps both the program and each syscall's
/// path short (a handful of compares), which also lets the kernel
/// precompute its "always allowed" cache quickly when the filter is
/// installed.
pub fn build_program(
    spec: &SeccompSpec,
    exec_gate: Option<u64>,
) -> Result<BpfProgram, SeccompError> {
    program_for(&Filter::deny_by_default(verdicts(spec, exec_gate)?))
}

/// The program deciding `filter` (see [`build_program`]; the zygote's
/// per-cell filter, which allows by default, is one too).
pub fn program_for(filter: &Filter) -> Result<BpfProgram, SeccompError> {
    let arch = audit_arch()?;
    let entries: Vec<(u32, Verdict)> = filter
        .verdicts
        .iter()
        .map(|(n, v)| (*n, v.clone()))
        .collect();
    let mut prog = Vec::with_capacity(16 + 2 * entries.len());
    prog.push(stmt(BPF_LD_W_ABS, DATA_ARCH));
    prog.push(jump(BPF_JEQ_K, arch, 1, 0));
    prog.push(stmt(BPF_RET_K, filter.foreign_arch.ret()));
    prog.push(stmt(BPF_LD_W_ABS, DATA_NR));
    match range_tree(&entries, filter.default)? {
        Some(tree) => prog.extend(tree),
        None => emit_tree(&entries, filter.default, &mut prog)?,
    }
    if prog.len() > MAX_INSNS {
        return Err(SeccompError::TooLong(prog.len()));
    }
    Ok(prog)
}

/// The number line cut into runs of one verdict: `(first number, verdict)`,
/// each run ending where the next begins, the first at 0. Numbers without
/// an entry get `default`.
fn segments(entries: &[(u32, Verdict)], default: Action) -> Vec<(u32, Verdict)> {
    let deny = Verdict::Ret(default);
    let mut segs: Vec<(u32, Verdict)> = vec![(0, deny.clone())];
    let mut push = |start: u32, v: &Verdict| {
        if let Some(last) = segs.last_mut() {
            if last.1 == *v {
                return;
            }
            if last.0 == start {
                last.1 = v.clone();
                // It may now continue the run before it.
                let n = segs.len();
                if n >= 2 && segs[n - 2].1 == segs[n - 1].1 {
                    segs.pop();
                }
                return;
            }
        }
        segs.push((start, v.clone()));
    };
    for (nr, v) in entries {
        push(*nr, v);
        if let Some(next) = nr.checked_add(1) {
            push(next, &deny);
        }
    }
    segs
}

/// A jump target while the range tree is laid out.
#[derive(Clone, Copy)]
enum Target {
    /// The node at this index of the tree's instructions.
    Node(usize),
    /// The verdict block with this index (placed after the tree).
    Block(usize),
}

/// A binary search over the runs of [`segments`]: one `jge` per boundary,
/// each jumping straight to the next node or to the shared block of its
/// run's verdict, so a run of allowed numbers costs one instruction and the
/// program stays short (a shorter program is quicker to install: the
/// kernel checks, converts, compiles and emulates every instruction for its
/// constant-verdict cache). `None` when a jump would not fit in the 8-bit
/// offsets of a conditional jump: the caller then uses [`emit_tree`].
fn range_tree(
    entries: &[(u32, Verdict)],
    default: Action,
) -> Result<Option<Vec<sock_filter>>, SeccompError> {
    let segs = segments(entries, default);
    let mut blocks: Vec<(Verdict, Vec<sock_filter>)> = Vec::new();
    let mut block_of = Vec::with_capacity(segs.len());
    for (nr, v) in &segs {
        let idx = match blocks.iter().position(|(b, _)| b == v) {
            Some(i) => i,
            None => {
                blocks.push((v.clone(), verdict_block(*nr, v)?));
                blocks.len() - 1
            }
        };
        block_of.push(idx);
    }
    // Nodes in pre-order: (boundary, target if >=, target if <).
    let mut nodes: Vec<(u32, Target, Target)> = Vec::new();
    fn build(
        lo: usize,
        hi: usize,
        segs: &[(u32, Verdict)],
        block_of: &[usize],
        nodes: &mut Vec<(u32, Target, Target)>,
    ) -> Target {
        if hi - lo == 1 {
            return Target::Block(block_of[lo]);
        }
        let mid = (lo + hi) / 2;
        let at = nodes.len();
        nodes.push((segs[mid].0, Target::Block(0), Target::Block(0)));
        let below = build(lo, mid, segs, block_of, nodes);
        let above = build(mid, hi, segs, block_of, nodes);
        nodes[at] = (segs[mid].0, above, below);
        Target::Node(at)
    }
    let root = build(0, segs.len(), &segs, &block_of, &mut nodes);
    let mut starts = Vec::with_capacity(blocks.len());
    let mut at = nodes.len();
    for (_, code) in &blocks {
        starts.push(at);
        at += code.len();
    }
    let mut out = Vec::with_capacity(at);
    if let Target::Block(b) = root {
        // One run only: its block is the whole decision.
        for (i, (_, code)) in blocks.into_iter().enumerate() {
            if i == b {
                out.extend(code);
            }
        }
        return Ok(Some(out));
    }
    for (i, (boundary, above, below)) in nodes.iter().enumerate() {
        let offset = |t: &Target| {
            let to = match t {
                Target::Node(n) => *n,
                Target::Block(b) => starts[*b],
            };
            to.checked_sub(i + 1).and_then(|d| u8::try_from(d).ok())
        };
        let (Some(jt), Some(jf)) = (offset(above), offset(below)) else {
            return Ok(None);
        };
        out.push(jump(BPF_JGE_K, *boundary, jt, jf));
    }
    for (_, code) in blocks {
        out.extend(code);
    }
    Ok(Some(out))
}

/// Install `program` on the calling thread (and its future children).
/// Requires `no_new_privs` (set by the privileges layer).
pub fn apply(program: &BpfProgram) -> Result<(), SeccompError> {
    seccompiler::apply_filter(program).map_err(SeccompError::Install)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::profiles::Profile;

    /// Each namespace-creating clone flag on its own: the ones a cell is
    /// cloned into ([`super::super::namespaces::ALL`]) and the cgroup one,
    /// not taken from `CLONE_NEW_MASK`, so a flag missing there is caught.
    fn namespace_flags() -> impl Iterator<Item = u64> {
        super::super::namespaces::ALL
            .iter()
            .map(|(_, f)| *f)
            .chain([libc::CLONE_NEWCGROUP])
            .map(|f| f as u64)
    }

    /// A classic-BPF interpreter for the instructions seccompiler and the
    /// prefix emit, so programs can be checked without installing them.
    pub(crate) fn run(prog: &[seccompiler::sock_filter], nr: i64, args: [u64; 6]) -> u32 {
        let mut data = [0u8; 64];
        data[0..4].copy_from_slice(&(nr as u32).to_ne_bytes());
        data[4..8].copy_from_slice(&audit_arch().unwrap().to_ne_bytes());
        for (i, a) in args.iter().enumerate() {
            data[16 + 8 * i..24 + 8 * i].copy_from_slice(&a.to_ne_bytes());
        }
        run_data(prog, &data)
    }

    pub(crate) fn run_data(prog: &[seccompiler::sock_filter], data: &[u8; 64]) -> u32 {
        let mut acc: u32 = 0;
        let mut pc = 0usize;
        loop {
            let ins = &prog[pc];
            let class = ins.code & 0x07;
            match class {
                0x00 => {
                    // LD | W | ABS
                    assert_eq!(ins.code, 0x20, "unexpected load {:#x}", ins.code);
                    let off = ins.k as usize;
                    acc = u32::from_ne_bytes(data[off..off + 4].try_into().unwrap());
                    pc += 1;
                }
                0x04 => {
                    // ALU | K
                    match ins.code & 0xf0 {
                        0x50 => acc &= ins.k,
                        op => panic!("unexpected alu op {op:#x}"),
                    }
                    pc += 1;
                }
                0x05 => {
                    // JMP
                    let op = ins.code & 0xf0;
                    if op == 0x00 {
                        pc += 1 + ins.k as usize;
                        continue;
                    }
                    let taken = match op {
                        0x10 => acc == ins.k,
                        0x20 => acc > ins.k,
                        0x30 => acc >= ins.k,
                        0x40 => acc & ins.k != 0,
                        _ => panic!("unexpected jump {:#x}", ins.code),
                    };
                    pc += 1 + if taken { ins.jt } else { ins.jf } as usize;
                }
                0x06 => return ins.k,
                _ => panic!("unexpected instruction {:#x}", ins.code),
            }
        }
    }

    /// The allowlist as seccompiler compiles it (a linear chain per
    /// syscall), with the same prefix for clone3 and kill groups: the
    /// straightforward translation, kept as the reference the search tree
    /// must agree with.
    fn reference_program(spec: &SeccompSpec, exec_gate: Option<u64>) -> BpfProgram {
        use seccompiler::{
            SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
            SeccompRule, TargetArch,
        };
        let dword = |arg: u8, op: SeccompCmpOp, v: u64| {
            SeccompRule::new(vec![SeccompCondition::new(
                arg,
                SeccompCmpArgLen::Dword,
                op,
                v,
            )
            .unwrap()])
            .unwrap()
        };
        let mut rules: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
        let mut insert = |name: &str, chain: Vec<SeccompRule>| {
            if let Some(nr) = crate::sandbox::syscalls::number(name) {
                rules.insert(nr, chain);
            }
        };
        for group in &spec.allow {
            for name in &group.syscalls {
                let chain = match name.as_str() {
                    "clone" => vec![dword(0, SeccompCmpOp::MaskedEq(CLONE_NEW_MASK), 0)],
                    "prlimit64" => vec![dword(0, SeccompCmpOp::Eq, 0)],
                    _ => Vec::new(),
                };
                insert(name, chain);
            }
        }
        match spec.exec {
            ExecMode::None => {}
            ExecMode::Any => insert("execve", Vec::new()),
            ExecMode::Once => insert(
                "execve",
                vec![SeccompRule::new(vec![SeccompCondition::new(
                    0,
                    SeccompCmpArgLen::Qword,
                    SeccompCmpOp::Eq,
                    exec_gate.unwrap(),
                )
                .unwrap()])
                .unwrap()],
            ),
        }
        for (name, arg, values) in arg_lists(spec) {
            if !values.is_empty() {
                let chain = values
                    .into_iter()
                    .map(|v| dword(arg, SeccompCmpOp::Eq, u64::from(v)))
                    .collect();
                insert(name, chain);
            }
        }
        let arch = TargetArch::try_from(std::env::consts::ARCH).unwrap();
        let filter = SeccompFilter::new(
            rules,
            SeccompAction::Errno(libc::EPERM as u32),
            SeccompAction::Allow,
            arch,
        )
        .unwrap();
        let allowlist: BpfProgram = filter.try_into().unwrap();
        let mut specials = vec![(
            number("clone3").unwrap(),
            SECCOMP_RET_ERRNO | libc::ENOSYS as u32,
        )];
        for group in spec.deny.iter().filter(|g| g.action == DenyAction::Kill) {
            for name in &group.syscalls {
                if let Some(nr) = number(name) {
                    specials.push((nr, SECCOMP_RET_KILL_PROCESS));
                }
            }
        }
        let skip = u8::try_from(1 + 2 * specials.len()).unwrap();
        let mut prog = vec![
            stmt(BPF_LD_W_ABS, DATA_ARCH),
            jump(BPF_JEQ_K, audit_arch().unwrap(), 0, skip),
            stmt(BPF_LD_W_ABS, DATA_NR),
        ];
        for (nr, ret) in specials {
            prog.push(jump(BPF_JEQ_K, nr, 0, 1));
            prog.push(stmt(BPF_RET_K, ret));
        }
        prog.extend(allowlist);
        prog
    }

    /// Argument vectors that hit every branch of the argument checks of
    /// `spec`: each allowed value (with and without high bits), its
    /// neighbours, the namespace flags, the exec gate and its neighbours.
    fn probe_args(spec: &SeccompSpec, gate: u64) -> Vec<[u64; 6]> {
        let mut values: Vec<u64> = vec![0, 1, 2, u64::MAX, gate, gate + 8, gate ^ (1 << 40)];
        let names = spec
            .ioctl
            .allow
            .iter()
            .filter_map(|n| ioctl_request(n))
            .chain(spec.socket.allow.iter().filter_map(|n| address_family(n)))
            .chain(
                spec.socketpair
                    .allow
                    .iter()
                    .filter_map(|n| address_family(n)),
            )
            .chain(spec.prctl.allow.iter().filter_map(|n| prctl_option(n)))
            .chain(ioctl_request("TIOCSTI"));
        for v in names {
            let v = u64::from(v);
            values.extend([
                v,
                v + 1,
                v.wrapping_sub(1),
                v | 1 << 32,
                v | 0xffff_ffff << 32,
            ]);
        }
        for flag in namespace_flags() {
            values.push(libc::SIGCHLD as u64 | flag);
        }
        values.push(libc::SIGCHLD as u64 | libc::CLONE_VM as u64);
        values
            .into_iter()
            .flat_map(|v| [[v, 0, 0, 0, 0, 0], [0, v, 0, 0, 0, 0], [v, v, v, v, v, v]])
            .collect()
    }

    /// The search tree decides exactly as the straightforward linear
    /// translation, for every syscall number (and x32 numbers, and numbers
    /// past the table) and every argument branch, under every built-in
    /// profile and every exec mode, with kill groups too.
    #[test]
    fn search_tree_agrees_with_the_linear_reference() {
        let gate = 0x5555_0000_1000u64;
        for name in crate::profiles::BUILTIN_NAMES {
            let base = Profile::load(name).unwrap().seccomp;
            let mut specs = vec![base.clone()];
            for exec in [ExecMode::None, ExecMode::Any, ExecMode::Once] {
                let mut s = base.clone();
                s.exec = exec;
                specs.push(s);
            }
            let mut killing = base.clone();
            for g in &mut killing.deny {
                g.syscalls.retain(|s| s != "socket");
                g.action = DenyAction::Kill;
            }
            specs.push(killing);
            for spec in specs {
                let tree = build_program(&spec, Some(gate)).unwrap();
                let linear = reference_program(&spec, Some(gate));
                assert!(
                    tree.len() < linear.len(),
                    "{name}: {} instructions, the linear program has {}",
                    tree.len(),
                    linear.len()
                );
                let args = probe_args(&spec, gate);
                let nrs = (0..1024i64)
                    .chain((0..1024).map(|n| 0x4000_0000 | n))
                    .chain([u32::MAX as i64, 0x7fff_ffff]);
                for nr in nrs {
                    for a in &args {
                        assert_eq!(
                            run(&tree, nr, *a),
                            run(&linear, nr, *a),
                            "{name} exec {:?}: syscall {nr} args {a:x?}",
                            spec.exec
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn a_path_through_the_tree_is_short() {
        // No syscall number walks more than a few dozen instructions.
        let prog = program("shell");
        let longest = (0..600i64).map(|nr| steps(&prog, nr)).max().unwrap();
        assert!(longest <= 40, "a syscall walks {longest} instructions");
    }

    /// Instructions executed for `nr` (arguments all zero).
    fn steps(prog: &[seccompiler::sock_filter], nr: i64) -> usize {
        let mut data = [0u8; 64];
        data[0..4].copy_from_slice(&(nr as u32).to_ne_bytes());
        data[4..8].copy_from_slice(&audit_arch().unwrap().to_ne_bytes());
        let mut n = 0;
        let mut acc = 0u32;
        let mut pc = 0usize;
        loop {
            n += 1;
            let ins = &prog[pc];
            match ins.code {
                BPF_LD_W_ABS => {
                    let off = ins.k as usize;
                    acc = u32::from_ne_bytes(data[off..off + 4].try_into().unwrap());
                    pc += 1;
                }
                BPF_ALU_AND_K => {
                    acc &= ins.k;
                    pc += 1;
                }
                BPF_JA => pc += 1 + ins.k as usize,
                BPF_JEQ_K | BPF_JGE_K => {
                    let taken = if ins.code == BPF_JEQ_K {
                        acc == ins.k
                    } else {
                        acc >= ins.k
                    };
                    pc += 1 + if taken { ins.jt } else { ins.jf } as usize;
                }
                _ => return n,
            }
        }
    }

    #[test]
    fn an_oversized_argument_list_is_an_error_not_a_wrong_jump() {
        let mut v = BTreeMap::new();
        v.insert(
            16,
            Verdict::Allow(ArgCheck::OneOf {
                arg: 1,
                values: (0..300).collect(),
            }),
        );
        assert!(matches!(
            program_for(&Filter::deny_by_default(v.clone())),
            Err(SeccompError::RuleTooLarge { nr: 16, .. })
        ));
        // 250 values still fit in one block.
        v.insert(
            16,
            Verdict::Allow(ArgCheck::OneOf {
                arg: 1,
                values: (0..250).collect(),
            }),
        );
        let prog = program_for(&Filter::deny_by_default(v)).unwrap();
        assert_eq!(run(&prog, 16, [0, 249, 0, 0, 0, 0]), ALLOW);
        assert_eq!(run(&prog, 16, [0, 250, 0, 0, 0, 0]), EPERM);
    }

    /// A large, irregular table (deep tree, long jumps, every kind of
    /// verdict, shared and unshared blocks) decides every number as the
    /// table says: one too large for the range tree's short jumps (searched
    /// number by number) and one that fits (searched by runs).
    #[test]
    fn a_large_table_is_searched_correctly() {
        let large = table(600);
        let entries: Vec<(u32, Verdict)> = large.iter().map(|(n, v)| (*n, v.clone())).collect();
        assert!(range_tree(&entries, Action::EPERM).unwrap().is_none());
        check_table(&large);
        let medium = table(60);
        let entries: Vec<(u32, Verdict)> = medium.iter().map(|(n, v)| (*n, v.clone())).collect();
        assert!(range_tree(&entries, Action::EPERM).unwrap().is_some());
        check_table(&medium);
        // Adjacent numbers with one verdict make one run.
        let mut runs = BTreeMap::new();
        for nr in (10..20).chain(30..31) {
            runs.insert(nr, Verdict::Ret(Action::Allow));
        }
        let entries: Vec<(u32, Verdict)> = runs.iter().map(|(n, v)| (*n, v.clone())).collect();
        let starts: Vec<u32> = segments(&entries, Action::EPERM)
            .iter()
            .map(|(n, _)| *n)
            .collect();
        assert_eq!(starts, [0, 10, 20, 30, 31]);
        check_table(&runs);
    }

    /// `n` irregular entries of every verdict kind, numbers below 2000.
    fn table(n: u32) -> BTreeMap<u32, Verdict> {
        let mut v = BTreeMap::new();
        let mut x: u32 = 12345;
        for i in 0..n {
            // A simple LCG spreads the numbers and verdict kinds.
            x = x.wrapping_mul(1_103_515_245).wrapping_add(12345);
            let nr = (x >> 8) % 2000;
            let verdict = match i % 7 {
                0 => Verdict::Ret(Action::Allow),
                1 => Verdict::Ret(Action::KillProcess),
                5 => Verdict::Ret(Action::Errno(libc::ENOSYS as u16)),
                6 => Verdict::Allow(ArgCheck::NotOneOf {
                    arg: 1,
                    values: vec![i, 5],
                }),
                2 => Verdict::Allow(ArgCheck::OneOf {
                    arg: (i % 6) as u8,
                    values: vec![i, i + 7, 3],
                }),
                3 => Verdict::Allow(ArgCheck::NoneOf { arg: 0, mask: 0xf0 }),
                _ => Verdict::Allow(ArgCheck::Equals {
                    arg: 2,
                    value: 0x1234_0000_0000 | u64::from(i),
                }),
            };
            v.insert(nr, verdict);
        }
        v
    }

    /// The program for `v` decides every number below 2100 as `v` says,
    /// with either default.
    fn check_table(v: &BTreeMap<u32, Verdict>) {
        for default in [Action::EPERM, Action::Allow] {
            check_filter(&Filter {
                verdicts: v.clone(),
                default,
                foreign_arch: Action::KillProcess,
            });
        }
    }

    fn check_filter(f: &Filter) {
        let prog = program_for(f).unwrap();
        let v = &f.verdicts;
        for nr in 0..2100u32 {
            let arg_sets: Vec<[u64; 6]> = match v.get(&nr) {
                Some(
                    Verdict::Allow(ArgCheck::OneOf { arg, values })
                    | Verdict::Allow(ArgCheck::NotOneOf { arg, values }),
                ) => {
                    let mut sets = Vec::new();
                    for val in values.iter().map(|x| u64::from(*x)).chain([999_999]) {
                        let mut a = [0u64; 6];
                        a[*arg as usize] = val | 1 << 33;
                        sets.push(a);
                    }
                    sets
                }
                Some(Verdict::Allow(ArgCheck::Equals { value, .. })) => vec![
                    [0, 0, *value, 0, 0, 0],
                    [0, 0, *value & 0xffff_ffff, 0, 0, 0],
                ],
                _ => vec![[0; 6], [0x10, 0, 0, 0, 0, 0]],
            };
            for a in arg_sets {
                let want = match v.get(&nr) {
                    None => f.default.ret(),
                    Some(Verdict::Ret(k)) => k.ret(),
                    Some(Verdict::Allow(ArgCheck::NotOneOf { arg, values })) => {
                        if values.contains(&(a[*arg as usize] as u32)) {
                            EPERM
                        } else {
                            ALLOW
                        }
                    }
                    Some(Verdict::Allow(ArgCheck::OneOf { arg, values })) => {
                        if values.contains(&(a[*arg as usize] as u32)) {
                            ALLOW
                        } else {
                            EPERM
                        }
                    }
                    Some(Verdict::Allow(ArgCheck::NoneOf { arg, mask })) => {
                        if (a[*arg as usize] as u32) & mask == 0 {
                            ALLOW
                        } else {
                            EPERM
                        }
                    }
                    Some(Verdict::Allow(ArgCheck::Equals { arg, value })) => {
                        if a[*arg as usize] == *value {
                            ALLOW
                        } else {
                            EPERM
                        }
                    }
                };
                assert_eq!(run(&prog, i64::from(nr), a), want, "nr {nr} args {a:x?}");
            }
        }
    }

    pub(crate) const ALLOW: u32 = 0x7fff_0000;
    pub(crate) const EPERM: u32 = SECCOMP_RET_ERRNO | libc::EPERM as u32;
    const ENOSYS: u32 = SECCOMP_RET_ERRNO | libc::ENOSYS as u32;

    fn nr(name: &str) -> i64 {
        crate::sandbox::syscalls::number(name).unwrap()
    }

    fn program(profile: &str) -> Vec<seccompiler::sock_filter> {
        let p = Profile::load(profile).unwrap();
        build_program(&p.seccomp, Some(0x5555_0000_1000)).unwrap()
    }

    #[test]
    fn every_allowed_syscall_is_allowed_and_every_denied_one_denied() {
        for name in crate::profiles::BUILTIN_NAMES {
            let p = Profile::load(name).unwrap();
            let prog = build_program(&p.seccomp, Some(0x1000)).unwrap();
            for group in &p.seccomp.allow {
                for s in &group.syscalls {
                    let Some(n) = crate::sandbox::syscalls::number(s) else {
                        continue;
                    };
                    let args = match s.as_str() {
                        "clone" => [libc::SIGCHLD as u64, 0, 0, 0, 0, 0],
                        _ => [0; 6],
                    };
                    assert_eq!(run(&prog, n, args), ALLOW, "{name}: {s} should be allowed");
                }
            }
            for group in &p.seccomp.deny {
                for s in &group.syscalls {
                    let Some(n) = crate::sandbox::syscalls::number(s) else {
                        continue;
                    };
                    let want = match group.action {
                        DenyAction::Errno => EPERM,
                        DenyAction::Kill => SECCOMP_RET_KILL_PROCESS,
                    };
                    for args in [[0; 6], [u64::MAX; 6], [1, 2, 3, 4, 5, 6]] {
                        assert_eq!(run(&prog, n, args), want, "{name}: {s} should be denied");
                    }
                }
            }
        }
    }

    #[test]
    fn clone3_is_enosys_everywhere() {
        for name in crate::profiles::BUILTIN_NAMES {
            assert_eq!(run(&program(name), nr("clone3"), [0; 6]), ENOSYS, "{name}");
        }
    }

    #[test]
    fn unknown_and_x32_numbers_are_denied() {
        let prog = program("python");
        assert_eq!(run(&prog, 999, [0; 6]), EPERM);
        // x32: the same arch value with bit 30 set in the number.
        assert_eq!(run(&prog, 0x4000_0000 | nr("read"), [0; 6]), EPERM);
        assert_eq!(run(&prog, 0x4000_0000 | nr("ptrace"), [0; 6]), EPERM);
    }

    #[test]
    fn foreign_architecture_is_killed() {
        let prog = program("python");
        let mut data = [0u8; 64];
        data[0..4].copy_from_slice(&(nr("read") as u32).to_ne_bytes());
        data[4..8].copy_from_slice(&0x4000_0003u32.to_ne_bytes()); // AUDIT_ARCH_I386
        assert_eq!(run_data(&prog, &data), SECCOMP_RET_KILL_PROCESS);
    }

    #[test]
    fn ioctl_is_compared_on_the_low_32_bits() {
        let prog = program("python");
        let ioctl = nr("ioctl");
        let tcgets = u64::from(ioctl_request("TCGETS").unwrap());
        let tiocsti = u64::from(ioctl_request("TIOCSTI").unwrap());
        assert_eq!(run(&prog, ioctl, [1, tcgets, 0, 0, 0, 0]), ALLOW);
        assert_eq!(run(&prog, ioctl, [1, tcgets | 1 << 32, 0, 0, 0, 0]), ALLOW);
        assert_eq!(run(&prog, ioctl, [1, tiocsti, 0, 0, 0, 0]), EPERM);
        assert_eq!(run(&prog, ioctl, [1, tiocsti | 1 << 32, 0, 0, 0, 0]), EPERM);
        assert_eq!(
            run(&prog, ioctl, [1, tiocsti | 0xffff_ffff << 32, 0, 0, 0, 0]),
            EPERM
        );
        // An unknown request.
        assert_eq!(run(&prog, ioctl, [1, 0x4004_5401, 0, 0, 0, 0]), EPERM);
    }

    #[test]
    fn rhai_has_no_ioctl_socket_exec_or_clone() {
        let prog = program("rhai");
        for name in [
            "ioctl",
            "socket",
            "socketpair",
            "execve",
            "clone",
            "fork",
            "openat",
        ] {
            if let Some(n) = crate::sandbox::syscalls::number(name) {
                assert_eq!(run(&prog, n, [0; 6]), EPERM, "{name}");
            }
        }
    }

    #[test]
    fn clone_with_namespace_flags_is_denied() {
        let prog = program("python");
        let clone = nr("clone");
        let thread = (libc::CLONE_VM
            | libc::CLONE_FS
            | libc::CLONE_FILES
            | libc::CLONE_SIGHAND
            | libc::CLONE_THREAD
            | libc::CLONE_SYSVSEM
            | libc::CLONE_SETTLS
            | libc::CLONE_PARENT_SETTID
            | libc::CLONE_CHILD_CLEARTID) as u64;
        assert_eq!(run(&prog, clone, [thread, 0, 0, 0, 0, 0]), ALLOW);
        assert_eq!(
            run(&prog, clone, [libc::SIGCHLD as u64, 0, 0, 0, 0, 0]),
            ALLOW
        );
        for flag in namespace_flags() {
            let f = libc::SIGCHLD as u64 | flag;
            assert_eq!(run(&prog, clone, [f, 0, 0, 0, 0, 0]), EPERM, "{flag:#x}");
        }
    }

    #[test]
    fn socket_families() {
        let python = program("python");
        let socket = nr("socket");
        let pair = nr("socketpair");
        for fam in [
            libc::AF_INET,
            libc::AF_INET6,
            libc::AF_UNIX,
            libc::AF_NETLINK,
        ] {
            assert_eq!(run(&python, socket, [fam as u64, 1, 0, 0, 0, 0]), EPERM);
        }
        assert_eq!(
            run(&python, pair, [libc::AF_UNIX as u64, 1, 0, 0, 0, 0]),
            ALLOW
        );
        assert_eq!(
            run(&python, pair, [libc::AF_INET as u64, 1, 0, 0, 0, 0]),
            EPERM
        );
    }

    #[test]
    fn exec_gate_only_accepts_its_pointer() {
        let prog = program("python");
        let execve = nr("execve");
        assert_eq!(run(&prog, execve, [0x5555_0000_1000, 0, 0, 0, 0, 0]), ALLOW);
        assert_eq!(run(&prog, execve, [0x5555_0000_1008, 0, 0, 0, 0, 0]), EPERM);
        // Same low half, different high half.
        assert_eq!(run(&prog, execve, [0x6666_0000_1000, 0, 0, 0, 0, 0]), EPERM);
        if let Some(n) = crate::sandbox::syscalls::number("execveat") {
            assert_eq!(run(&prog, n, [0; 6]), EPERM);
        }
        // Shell may exec anything Landlock allows; Rhai nothing.
        assert_eq!(
            run(&program("shell"), execve, [0x1234, 0, 0, 0, 0, 0]),
            ALLOW
        );
        assert_eq!(
            run(&program("rhai"), execve, [0x1234, 0, 0, 0, 0, 0]),
            EPERM
        );
    }

    #[test]
    fn once_without_a_gate_is_an_error() {
        let p = Profile::load("python").unwrap();
        assert!(matches!(
            build_program(&p.seccomp, None),
            Err(SeccompError::NoExecGate)
        ));
    }

    #[test]
    fn prlimit_only_on_self_and_prctl_filtered() {
        let prog = program("python");
        let prlimit = nr("prlimit64");
        assert_eq!(run(&prog, prlimit, [0, 7, 0, 0, 0, 0]), ALLOW);
        assert_eq!(run(&prog, prlimit, [1, 7, 0, 0, 0, 0]), EPERM);
        let prctl = nr("prctl");
        assert_eq!(
            run(&prog, prctl, [libc::PR_SET_NAME as u64, 0, 0, 0, 0, 0]),
            ALLOW
        );
        assert_eq!(
            run(&prog, prctl, [libc::PR_SET_SECCOMP as u64, 0, 0, 0, 0, 0]),
            EPERM
        );
        assert_eq!(
            run(&prog, prctl, [libc::PR_SET_MM as u64, 0, 0, 0, 0, 0]),
            EPERM
        );
    }

    #[test]
    fn kill_groups_kill() {
        let mut p = Profile::load("python").unwrap();
        p.seccomp.deny[0].action = DenyAction::Kill;
        let prog = build_program(&p.seccomp, Some(0x1000)).unwrap();
        let name = &p.seccomp.deny[0].syscalls[0];
        assert_eq!(run(&prog, nr(name), [0; 6]), SECCOMP_RET_KILL_PROCESS);
    }
}
