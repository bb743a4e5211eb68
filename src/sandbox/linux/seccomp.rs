//! The seccomp layer: an allowlist per profile, applied last.
//!
//! [`build_program`] turns a profile's [`SeccompSpec`] into one BPF program:
//!
//! 1. a short hand-written prefix that, for this architecture only, answers
//!    `clone3` with ENOSYS (so libc falls back to `clone`, whose flags the
//!    filter can see) and kills the process for syscalls in `deny` groups
//!    whose action is `kill`;
//! 2. the allowlist compiled by `seccompiler`: listed syscalls are allowed,
//!    some only with filtered arguments, everything else fails with EPERM.
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
//! Syscall numbers are per architecture; the seccompiler program starts with
//! an architecture check that kills on a foreign ABI (i386 via `int 0x80`),
//! and x32 numbers (bit 30 set) simply match nothing and get EPERM.

use crate::profiles::{
    address_family, ioctl_request, prctl_option, DenyAction, ExecMode, SeccompSpec,
};
use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch,
};
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

// Classic BPF opcodes used by the prefix.
const BPF_LD_W_ABS: u16 = 0x20;
const BPF_JEQ_K: u16 = 0x15;
const BPF_RET_K: u16 = 0x06;

const SECCOMP_RET_KILL_PROCESS: u32 = 0x8000_0000;
const SECCOMP_RET_ERRNO: u32 = 0x0005_0000;

#[derive(Debug, thiserror::Error)]
pub enum SeccompError {
    #[error("architecture {0} is not supported by the seccomp layer")]
    Arch(&'static str),
    #[error("failed to build the seccomp rule for {what}: {source}")]
    Rule {
        what: String,
        #[source]
        source: seccompiler::BackendError,
    },
    #[error("failed to compile the seccomp program: {0}")]
    Compile(#[source] seccompiler::BackendError),
    #[error("the seccomp program has {0} instructions, more than the kernel accepts")]
    TooLong(usize),
    #[error("exec mode `once` needs the exec gate's address")]
    NoExecGate,
    #[error("failed to install the seccomp filter: {0}")]
    Install(#[source] seccompiler::Error),
}

fn target_arch() -> Result<TargetArch, SeccompError> {
    TargetArch::try_from(std::env::consts::ARCH)
        .map_err(|_| SeccompError::Arch(std::env::consts::ARCH))
}

fn audit_arch() -> Result<u32, SeccompError> {
    match std::env::consts::ARCH {
        "x86_64" => Ok(0xC000_003E),
        "aarch64" => Ok(0xC000_00B7),
        "riscv64" => Ok(0xC000_00F3),
        other => Err(SeccompError::Arch(other)),
    }
}

fn cond(
    what: &str,
    arg: u8,
    len: SeccompCmpArgLen,
    op: SeccompCmpOp,
    value: u64,
) -> Result<SeccompCondition, SeccompError> {
    SeccompCondition::new(arg, len, op, value).map_err(|source| SeccompError::Rule {
        what: what.to_owned(),
        source,
    })
}

fn rule(what: &str, conds: Vec<SeccompCondition>) -> Result<SeccompRule, SeccompError> {
    SeccompRule::new(conds).map_err(|source| SeccompError::Rule {
        what: what.to_owned(),
        source,
    })
}

/// One rule per allowed value of a 32-bit argument.
fn value_rules(
    what: &str,
    arg: u8,
    values: impl IntoIterator<Item = u32>,
) -> Result<Vec<SeccompRule>, SeccompError> {
    values
        .into_iter()
        .map(|v| {
            rule(
                what,
                vec![cond(
                    what,
                    arg,
                    SeccompCmpArgLen::Dword,
                    SeccompCmpOp::Eq,
                    u64::from(v),
                )?],
            )
        })
        .collect()
}

fn insert(rules: &mut BTreeMap<i64, Vec<SeccompRule>>, name: &str, chain: Vec<SeccompRule>) {
    // A name without a number on this architecture has nothing to allow.
    if let Some(nr) = crate::sandbox::syscalls::number(name) {
        rules.insert(nr, chain);
    }
}

/// The allowlist as seccompiler rules: syscall number → rule chain (an empty
/// chain allows the syscall unconditionally).
pub fn allow_rules(
    spec: &SeccompSpec,
    exec_gate: Option<u64>,
) -> Result<BTreeMap<i64, Vec<SeccompRule>>, SeccompError> {
    let mut rules = BTreeMap::new();
    for group in &spec.allow {
        for name in &group.syscalls {
            let chain = match name.as_str() {
                "clone" => vec![rule(
                    "clone",
                    vec![cond(
                        "clone",
                        0,
                        SeccompCmpArgLen::Dword,
                        SeccompCmpOp::MaskedEq(CLONE_NEW_MASK),
                        0,
                    )?],
                )?],
                "prlimit64" => vec![rule(
                    "prlimit64",
                    vec![cond(
                        "prlimit64",
                        0,
                        SeccompCmpArgLen::Dword,
                        SeccompCmpOp::Eq,
                        0,
                    )?],
                )?],
                _ => Vec::new(),
            };
            insert(&mut rules, name, chain);
        }
    }
    match spec.exec {
        ExecMode::None => {}
        ExecMode::Any => insert(&mut rules, "execve", Vec::new()),
        ExecMode::Once => {
            let addr = exec_gate.ok_or(SeccompError::NoExecGate)?;
            let chain = vec![rule(
                "execve",
                vec![cond(
                    "execve",
                    0,
                    SeccompCmpArgLen::Qword,
                    SeccompCmpOp::Eq,
                    addr,
                )?],
            )?];
            insert(&mut rules, "execve", chain);
        }
    }
    // Names were validated when the profile was loaded; unknown ones map to
    // nothing and are therefore denied.
    let arg_lists: [(&str, u8, Vec<u32>); 4] = [
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
    ];
    for (name, arg, values) in arg_lists {
        if !values.is_empty() {
            let chain = value_rules(name, arg, values)?;
            insert(&mut rules, name, chain);
        }
    }
    Ok(rules)
}

fn stmt(code: u16, k: u32) -> seccompiler::sock_filter {
    seccompiler::sock_filter {
        code,
        jt: 0,
        jf: 0,
        k,
    }
}

fn jeq(k: u32, jt: u8, jf: u8) -> seccompiler::sock_filter {
    seccompiler::sock_filter {
        code: BPF_JEQ_K,
        jt,
        jf,
        k,
    }
}

/// Syscalls answered before the allowlist: `(number, return value)`.
pub fn special_actions(spec: &SeccompSpec) -> Vec<(u32, u32)> {
    let mut out = Vec::new();
    if let Some(nr) = crate::sandbox::syscalls::number("clone3") {
        if let Ok(nr) = u32::try_from(nr) {
            out.push((nr, SECCOMP_RET_ERRNO | libc::ENOSYS as u32));
        }
    }
    for group in spec.deny.iter().filter(|g| g.action == DenyAction::Kill) {
        for name in &group.syscalls {
            if let Some(nr) = crate::sandbox::syscalls::number(name) {
                if let Ok(nr) = u32::try_from(nr) {
                    out.push((nr, SECCOMP_RET_KILL_PROCESS));
                }
            }
        }
    }
    out
}

/// The whole program for `spec`. `exec_gate` is the address of the exec
/// gate's pathname buffer (needed for `exec = "once"`).
pub fn build_program(
    spec: &SeccompSpec,
    exec_gate: Option<u64>,
) -> Result<BpfProgram, SeccompError> {
    let arch = target_arch()?;
    let rules = allow_rules(spec, exec_gate)?;
    let filter = SeccompFilter::new(
        rules,
        SeccompAction::Errno(libc::EPERM as u32),
        SeccompAction::Allow,
        arch,
    )
    .map_err(SeccompError::Compile)?;
    let allowlist: BpfProgram = filter.try_into().map_err(SeccompError::Compile)?;

    // Prefix: [0] load arch; [1] if not ours skip the whole prefix (the
    // allowlist's own arch check kills); [2] load nr; then per special
    // syscall a `jeq nr → ret` pair; falling off the end enters the
    // allowlist.
    let specials = special_actions(spec);
    let mut prefix = Vec::with_capacity(3 + 2 * specials.len());
    let skip = 1 + 2 * specials.len();
    let skip = u8::try_from(skip).map_err(|_| SeccompError::TooLong(skip))?;
    prefix.push(stmt(BPF_LD_W_ABS, DATA_ARCH));
    prefix.push(jeq(audit_arch()?, 0, skip));
    prefix.push(stmt(BPF_LD_W_ABS, DATA_NR));
    for (nr, ret) in specials {
        prefix.push(jeq(nr, 0, 1));
        prefix.push(stmt(BPF_RET_K, ret));
    }
    prefix.extend(allowlist);
    if prefix.len() >= 4096 {
        return Err(SeccompError::TooLong(prefix.len()));
    }
    Ok(prefix)
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
        for flag in [
            libc::CLONE_NEWUSER,
            libc::CLONE_NEWNS,
            libc::CLONE_NEWPID,
            libc::CLONE_NEWNET,
            libc::CLONE_NEWIPC,
            libc::CLONE_NEWUTS,
            libc::CLONE_NEWCGROUP,
        ] {
            let f = libc::SIGCHLD as u64 | flag as u64;
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
