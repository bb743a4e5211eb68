//! The privileges layer: end with no real root, no supplementary groups,
//! empty capability sets (effective, permitted, inheritable, ambient and
//! bounding) and `no_new_privs`.
//!
//! As root (or as the creator of the cell's user namespace) the process can
//! still do all of this; the bounding set is dropped before the uid changes,
//! while CAP_SETPCAP is still held. An unprivileged cellbox without a user
//! namespace has no capabilities to drop; a bounding set it cannot empty is
//! reported, and no_new_privs keeps exec from ever granting any.

use super::sys;

#[derive(Debug, thiserror::Error)]
pub enum PrivilegeError {
    #[error("failed to {op}: {source}")]
    Call {
        op: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("privileges were not dropped: {0}")]
    Check(String),
}

fn call(op: &'static str) -> impl FnOnce(std::io::Error) -> PrivilegeError {
    move |source| PrivilegeError::Call { op, source }
}

/// Drop to `uid`/`gid` (ids as seen in the current user namespace).
/// `may_setgroups` is false in an unprivileged user namespace, where the
/// kernel forbids `setgroups`.
pub fn apply(uid: u32, gid: u32, may_setgroups: bool) -> Result<String, PrivilegeError> {
    let mut notes = Vec::new();
    let (_, permitted, _) = sys::capabilities().map_err(call("read capabilities"))?;
    if may_setgroups {
        nix::unistd::setgroups(&[]).map_err(|e| call("clear supplementary groups")(e.into()))?;
    } else if sys::supplementary_group_count().map_err(call("read supplementary groups"))? > 0 {
        // A root parent clears them before the clone; an unprivileged one
        // cannot, and the kernel keeps them here.
        notes.push("supplementary groups kept by the kernel (unprivileged user namespace)");
    }
    sys::clear_ambient_caps().map_err(call("clear ambient capabilities"))?;
    match sys::drop_bounding_set() {
        Ok(()) => {}
        // Without CAP_SETPCAP the bounding set cannot change; that only
        // happens for a process that holds no capability to begin with.
        Err(e) if e.raw_os_error() == Some(libc::EPERM) && permitted == 0 => {
            notes.push("bounding set unchanged (no CAP_SETPCAP)")
        }
        Err(e) => return Err(call("drop the capability bounding set")(e)),
    }
    let gid = nix::unistd::Gid::from_raw(gid);
    let uid = nix::unistd::Uid::from_raw(uid);
    nix::unistd::setresgid(gid, gid, gid).map_err(|e| call("set gids")(e.into()))?;
    nix::unistd::setresuid(uid, uid, uid).map_err(|e| call("set uids")(e.into()))?;
    sys::clear_capabilities().map_err(call("clear capabilities"))?;
    sys::set_no_new_privs().map_err(call("set no_new_privs"))?;
    verify(uid.as_raw(), gid.as_raw())?;
    let mut detail = format!("uid={} gid={} caps=none no_new_privs", uid, gid);
    for n in notes {
        detail.push_str("; ");
        detail.push_str(n);
    }
    Ok(detail)
}

/// Check the end state from the kernel's point of view.
pub fn verify(uid: u32, gid: u32) -> Result<(), PrivilegeError> {
    let r = nix::unistd::getresuid().map_err(|e| call("read uids")(e.into()))?;
    let g = nix::unistd::getresgid().map_err(|e| call("read gids")(e.into()))?;
    for (what, v) in [
        ("real", r.real),
        ("effective", r.effective),
        ("saved", r.saved),
    ] {
        if v.as_raw() != uid || v.is_root() {
            return Err(PrivilegeError::Check(format!(
                "{what} uid is {v}, wanted {uid}"
            )));
        }
    }
    for v in [g.real, g.effective, g.saved] {
        if v.as_raw() != gid {
            return Err(PrivilegeError::Check(format!("gid is {v}, wanted {gid}")));
        }
    }
    let (eff, prm, inh) = sys::capabilities().map_err(call("read capabilities"))?;
    if eff != 0 || prm != 0 || inh != 0 {
        return Err(PrivilegeError::Check(format!(
            "capabilities remain: effective={eff:#x} permitted={prm:#x} inheritable={inh:#x}"
        )));
    }
    if !sys::no_new_privs().map_err(call("read no_new_privs"))? {
        return Err(PrivilegeError::Check("no_new_privs is not set".into()));
    }
    Ok(())
}
