//! Each session's scratch is bounded on its own (bytes and inodes): a
//! session that fills it, and keeps it full while it idles, takes nothing
//! from the other sessions of the supervisor. Held for every kind of cell:
//! warm Python (forked from a zygote), cold Python and shell cells, and
//! sub-cells, which count against their session.

use super::common::{self, *};
use cellbox::{
    CellRequest, CellResult, Language, ScratchQuota, Session, SessionConfig, Status, Supervisor,
};
use serde_json::json;
use std::path::{Path, PathBuf};

async fn sh_in(session: &Session, code: &str) -> CellResult {
    session.run(CellRequest::new(Language::Shell, code)).await
}

/// Whether the cell was forked from a zygote.
fn was_warm(r: &CellResult) -> bool {
    r.sandbox
        .as_ref()
        .and_then(|s| s.layer("hygiene"))
        .is_some_and(|l| l.detail.contains("Python zygote"))
}

fn require_root() {
    common::require_root(
        "the session scratch quota needs root to mount its tmpfs; run the suite as root",
    );
}

fn sup_with(warm: bool, quota: ScratchQuota) -> Supervisor {
    let sup = Supervisor::builder()
        .worker_exe(bin())
        .warm(warm)
        .session_scratch_bytes(quota.bytes)
        .session_scratch_inodes(quota.inodes)
        .build()
        .unwrap();
    assert_eq!(sup.session_scratch_quota(), Some(quota));
    sup
}

/// The mountinfo line of the mount on `path`, if there is one.
fn mount_line(mountinfo: &str, path: &Path) -> Option<String> {
    mountinfo
        .lines()
        .find(|l| l.split(' ').nth(4) == Some(path.to_str().unwrap()))
        .map(str::to_owned)
}

/// The session's home (its tmpfs), as the host sees it.
fn home_of(s: &Session) -> PathBuf {
    s.scratch_dir().unwrap().parent().unwrap().to_path_buf()
}

/// Wait until `path` is gone (a closed session's last handles may be
/// held a moment longer by background tasks); panic if it stays.
async fn gone(path: &Path) {
    let t0 = std::time::Instant::now();
    while path.exists() && t0.elapsed() < std::time::Duration::from_secs(10) {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert!(!path.exists(), "{} left behind", path.display());
}

/// The pids of the live zygotes.
async fn zygote_pids(sup: &Supervisor) -> Vec<i32> {
    sup.pool_status()
        .await
        .python
        .iter()
        .filter(|z| z.alive)
        .map(|z| z.pid)
        .collect()
}

/// Python: write 1 MiB files until the writes fail; `[files written, errno]`.
const FILL_BYTES_PY: &str = "import errno\nn = 0\ncode = None\ntry:\n    for i in range(64):\n        with open(f'fill{i}', 'wb') as f:\n            f.write(b'x' * (1 << 20))\n        n += 1\nexcept OSError as e:\n    code = errno.errorcode.get(e.errno, e.errno)\n[n, code]";

/// Python: make empty files until that fails; `[files made, errno]`.
const FILL_INODES_PY: &str = "import errno\nn = 0\ncode = None\ntry:\n    while n < 100000:\n        open(f'e{n}', 'w').close()\n        n += 1\nexcept OSError as e:\n    code = errno.errorcode.get(e.errno, e.errno)\n[n, code]";

/// Python: the cell's scratch as statvfs sees it: `[bytes, inodes]`.
const STATVFS_PY: &str = "import os\nv = os.statvfs('.')\n[v.f_blocks * v.f_frsize, v.f_files]";

/// Shell: write 1 MiB files (at most `max`); prints how many were written.
fn fill_sh(max: u32, prefix: &str) -> String {
    format!(
        "n=0; while [ $n -lt {max} ] && head -c 1048576 /dev/zero > {prefix}$n 2>/dev/null; do \
         n=$((n+1)); done; echo $n"
    )
}

#[tokio::test]
async fn session_scratch_bytes_are_bounded_per_session_on_every_path() {
    require_root();
    let quota = ScratchQuota {
        bytes: 8 << 20,
        inodes: 16384,
    };
    for warm in [true, false] {
        let sup = sup_with(warm, quota);
        let a = sup.session(SessionConfig::default()).unwrap();
        let b = sup.session(SessionConfig::default()).unwrap();

        // A fills its scratch: 64 files of 1 MiB stop at ENOSPC.
        let r = py_in(&a, FILL_BYTES_PY).await;
        assert_eq!(r.status, Status::Ok, "warm {warm}: {r:?}");
        assert_eq!(was_warm(&r), warm, "{r:?}");
        let v = r.value.as_array().unwrap().clone();
        assert_eq!(v[1], json!("ENOSPC"), "warm {warm}: {r:?}");
        let first = v[0].as_u64().unwrap();
        assert!((7..=8).contains(&first), "warm {warm}: wrote {first} MiB");
        // A's next cells, Python and shell, find it full.
        let r = py_in(&a, "open('more', 'wb').write(b'x' * (2 << 20))").await;
        assert_eq!(r.status, Status::Error, "warm {warm}: {r:?}");
        assert!(
            r.error.as_ref().unwrap().message.contains("No space left"),
            "warm {warm}: {r:?}"
        );
        let r = sh_in(&a, &fill_sh(4, "s")).await;
        assert_eq!(r.status, Status::Ok, "warm {warm}: {r:?}");
        assert_eq!(r.stdout.trim(), "0", "warm {warm}: {r:?}");

        // A's home is a tmpfs of exactly that size.
        let home_a = home_of(&a);
        let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        let line = mount_line(&mounts, &home_a)
            .unwrap_or_else(|| panic!("{} is not a mount:\n{mounts}", home_a.display()));
        assert!(
            line.contains(" - tmpfs ") && line.contains("size=8192k"),
            "{line}"
        );

        // B, while A idles full: its own 8 MiB, for a Python cell (warm
        // when the supervisor is) and a shell cell.
        let r = py_in(&b, &format!("{STATVFS_PY}\n")).await;
        assert_eq!(r.status, Status::Ok, "warm {warm}: {r:?}");
        assert_eq!(was_warm(&r), warm, "{r:?}");
        assert_eq!(r.value, json!([8u64 << 20, 16384]), "warm {warm}: {r:?}");
        // A reaches nothing of B's: neither its directory nor its home.
        let (pb, home_b) = (b.scratch_dir().unwrap().to_path_buf(), home_of(&b));
        let code = format!(
            "import os\nout = []\nfor f in (lambda: os.listdir({p:?}), \
             lambda: open({p:?} + '/x', 'w'), lambda: os.listdir({h:?}), \
             lambda: os.mkdir({h:?} + '/y')):\n    try:\n        f()\n        out.append('ok')\n    \
             except OSError as e:\n        out.append(type(e).__name__)\nout",
            p = pb.to_str().unwrap(),
            h = home_b.to_str().unwrap()
        );
        let r = py_in(&a, &code).await;
        assert_eq!(r.status, Status::Ok, "warm {warm}: {r:?}");
        let outcomes = r.value.as_array().unwrap();
        assert!(
            outcomes.len() == 4 && outcomes.iter().all(|o| o != "ok"),
            "warm {warm}: {r:?}"
        );
        assert!(!pb.join("x").exists() && !home_b.join("y").exists());
        let r = py_in(&b, FILL_BYTES_PY).await;
        assert_eq!(r.status, Status::Ok, "warm {warm}: {r:?}");
        let v = r.value.as_array().unwrap().clone();
        assert_eq!(v[1], json!("ENOSPC"), "warm {warm}: {r:?}");
        assert!(
            (7..=8).contains(&v[0].as_u64().unwrap()),
            "warm {warm}: {r:?}"
        );
        let r = py_in(&b, "import os\nfor f in os.listdir('.'):\n    os.remove(f)").await;
        assert_eq!(r.status, Status::Ok, "warm {warm}: {r:?}");
        let r = sh_in(&b, &fill_sh(4, "s")).await;
        assert_eq!(r.status, Status::Ok, "warm {warm}: {r:?}");
        assert_eq!(r.stdout.trim(), "4", "warm {warm}: {r:?}");

        // A closes: its files and its tmpfs go, on the host and in the
        // zygotes; B's stay.
        let zygotes = zygote_pids(&sup).await;
        assert_eq!(zygotes.is_empty(), !warm, "{zygotes:?}");
        drop(a);
        gone(&home_a).await;
        let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        assert!(!mounts.contains(home_a.to_str().unwrap()), "{mounts}");
        for pid in zygotes {
            let theirs = std::fs::read_to_string(format!("/proc/{pid}/mountinfo")).unwrap();
            assert!(
                !theirs.contains(home_a.to_str().unwrap()),
                "zygote {pid} still holds A's tmpfs:\n{theirs}"
            );
        }
        let r = sh_in(&b, "ls s0 s3").await;
        assert_eq!(r.status, Status::Ok, "warm {warm}: {r:?}");
        drop(b);
        drop(sup);
        gone(&home_b).await;
    }
}

#[tokio::test]
async fn session_scratch_inodes_are_bounded_per_session_on_every_path() {
    require_root();
    let quota = ScratchQuota {
        bytes: 64 << 20,
        inodes: 1000,
    };
    for warm in [true, false] {
        let sup = sup_with(warm, quota);
        let mut cfg = config(&["run_cell"]);
        cfg.policy.max_depth = 1;
        let a = sup.session(cfg.clone()).unwrap();
        let b = sup.session(cfg).unwrap();

        // A makes empty files until ENOSPC: the bound is what was
        // configured, less the home and A's directory themselves.
        let r = py_in(&a, FILL_INODES_PY).await;
        assert_eq!(r.status, Status::Ok, "warm {warm}: {r:?}");
        assert_eq!(was_warm(&r), warm, "{r:?}");
        let v = r.value.as_array().unwrap().clone();
        assert_eq!(v[1], json!("ENOSPC"), "warm {warm}: {r:?}");
        let made = v[0].as_u64().unwrap();
        assert!(
            (990..=998).contains(&made),
            "warm {warm}: made {made} files"
        );
        // Counted on the host.
        let on_host = std::fs::read_dir(a.scratch_dir().unwrap()).unwrap().count() as u64;
        assert!((made..=made + 2).contains(&on_host), "{on_host} vs {made}");
        let home_a = home_of(&a);
        let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        let line = mount_line(&mounts, &home_a).unwrap();
        assert!(line.contains("nr_inodes=1000"), "{line}");
        // A shell cell of A can make nothing either.
        let r = sh_in(&a, "touch x 2>&1; echo $?").await;
        assert_eq!(r.status, Status::Ok, "warm {warm}: {r:?}");
        assert!(r.stdout.contains("No space left"), "warm {warm}: {r:?}");

        // A sub-cell's scratch is in A's space: with 20 inodes freed, the
        // sub-cell (its directory included) gets at most those.
        let r = py_in(
            &a,
            &format!(
                "import os\nfor i in range(20):\n    os.remove(f'e{{i}}')\n\
                 r = run_cell('python', {FILL_INODES_PY:?})\nr"
            ),
        )
        .await;
        assert_eq!(r.status, Status::Ok, "warm {warm}: {r:?}");
        let v = r.value.as_array().unwrap().clone();
        assert_eq!(v[1], json!("ENOSPC"), "warm {warm}: {r:?}");
        assert!(v[0].as_u64().unwrap() <= 19, "warm {warm}: {r:?}");

        // B, while A idles full: files and runs, Python (warm when the
        // supervisor is) and shell, and so do its sub-cells.
        let r = py_in(
            &b,
            "import os\nfor i in range(500):\n    open(f'p{i}', 'w').close()\nlen(os.listdir('.'))",
        )
        .await;
        assert_eq!(r.status, Status::Ok, "warm {warm}: {r:?}");
        assert_eq!(was_warm(&r), warm, "{r:?}");
        assert_eq!(r.value, json!(500), "warm {warm}: {r:?}");
        let r = sh_in(
            &b,
            "i=0; while [ $i -lt 300 ]; do : > s$i || exit 1; i=$((i+1)); done; ls | wc -l",
        )
        .await;
        assert_eq!(r.status, Status::Ok, "warm {warm}: {r:?}");
        assert_eq!(r.stdout.trim(), "800", "warm {warm}: {r:?}");
        let r = py_in(&b, "run_cell('python', \"open('x', 'w').close()\\n1\")").await;
        assert_eq!(r.status, Status::Ok, "warm {warm}: {r:?}");
        assert_eq!(r.value, json!(1), "warm {warm}: {r:?}");

        // A closes: its files go with its tmpfs.
        drop(a);
        gone(&home_a).await;
        let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        assert!(!mounts.contains(home_a.to_str().unwrap()), "{mounts}");
    }
}

/// An unprivileged user with subordinate ids and a profile with
/// `subordinate_ids = "auto"`: a session's shell cell runs as the profile's
/// uid (a subordinate id on the host, so not the user), and the read-only
/// tree it leaves in its scratch is removed with the session all the same
/// (by the worker binary in a user namespace that maps those ids, where it
/// is root): nothing is left in the user's temp dir. The user and its
/// ranges are the test's own, in a private view of `/etc` (an overlay in a
/// mount namespace of its own), made with util-linux's `unshare` and
/// `setpriv`.
#[test]
fn a_cell_as_a_subordinate_id_leaves_nothing_behind() {
    use std::os::unix::fs::{chown, PermissionsExt};
    common::require_root("the test becomes an unprivileged user with ranges of its own");
    for tool in ["newuidmap", "newgidmap"] {
        if let Err(e) = cellbox::sandbox::linux::subids::tool(tool) {
            panic!("{e}: the subordinate-id tests need it");
        }
    }
    const USER: u32 = 59997;
    let dir = tempfile::tempdir().unwrap();
    let mode = |p: &Path, m: u32| std::fs::set_permissions(p, std::fs::Permissions::from_mode(m));
    mode(dir.path(), 0o755).unwrap();
    let tmp = dir.path().join("tmp");
    std::fs::create_dir(&tmp).unwrap();
    chown(&tmp, Some(USER), Some(USER)).unwrap();
    let shell = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("sandbox-profiles/shell.toml"),
    )
    .unwrap();
    let profile = dir.path().join("shell.toml");
    std::fs::write(
        &profile,
        shell.replace("[identity]", "[identity]\nsubordinate_ids = \"auto\""),
    )
    .unwrap();
    let mut passwd = std::fs::read_to_string("/etc/passwd").unwrap();
    passwd.push_str(&format!(
        "cellbox-subids:x:{USER}:{USER}::/nonexistent:/usr/sbin/nologin\n"
    ));
    let ranges = "cellbox-subids:400000:65536\n";
    let script = "echo ids=$(id -u):$(id -g):$(id -G); \
                  mkdir -p ro/deep && echo x > ro/deep/f && chmod 400 ro/deep/f && \
                  chmod 500 ro/deep && chmod 0 ro && chmod 0 . && echo wrote\n:quit\n";
    // `cellbox ARGS` as the user, with these files in its /etc.
    let as_user = |args: &str, etc: &[(&str, &str)], stdin: &str| {
        let (upper, work) = (dir.path().join("etc/upper"), dir.path().join("etc/work"));
        for d in [&upper, &work] {
            let _ = std::fs::remove_dir_all(d);
            std::fs::create_dir_all(d).unwrap();
        }
        for (name, text) in etc {
            std::fs::write(upper.join(name), text).unwrap();
        }
        let setup = format!(
            "mount -t overlay overlay -o lowerdir=/etc,upperdir={},workdir={} /etc && \
             exec setpriv --reuid={USER} --regid={USER} --clear-groups \
             env TMPDIR={} {} {args}",
            upper.display(),
            work.display(),
            tmp.display(),
            common::bin().display(),
        );
        let mut child = std::process::Command::new("unshare")
            .args(["--mount", "--propagation", "private", "sh", "-c", &setup])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("util-linux's unshare");
        use std::io::Write;
        let mut input = child.stdin.take().unwrap();
        input.write_all(stdin.as_bytes()).unwrap();
        drop(input);
        let out = child.wait_with_output().unwrap();
        (
            out.status,
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let with_ranges = [
        ("passwd", passwd.as_str()),
        ("subuid", ranges),
        ("subgid", ranges),
    ];
    let repl = format!("repl --lang shell --profile {}", profile.display());
    let (status, stdout, stderr) = as_user(&repl, &with_ranges, script);
    assert!(status.success(), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("ids=65534:65534:65534\n") && stdout.contains("wrote"),
        "{stdout}\n{stderr}"
    );
    let left: Vec<_> = std::fs::read_dir(&tmp)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}\n{stderr}");
    // A one-shot cell too (its scratch is in the cell).
    let exec = format!("exec --profile {} -- /usr/bin/id -u", profile.display());
    let (status, stdout, stderr) = as_user(&exec, &with_ranges, "");
    assert!(status.success(), "{stdout}\n{stderr}");
    assert_eq!(stdout, "65534\n", "{stderr}");
    let (_, doctor, _) = as_user("doctor", &with_ranges, "");
    assert!(
        doctor.contains(
            "subordinate ids  yes: cells of profiles with subordinate_ids = \"auto\" run as \
             uid 400000 and gid 400000"
        ),
        "{doctor}"
    );
    // Without ranges for the user: its own ids, and doctor says why.
    let none = "someone-else:400000:65536\n";
    let without = [
        ("passwd", passwd.as_str()),
        ("subuid", none),
        ("subgid", none),
    ];
    let (status, stdout, stderr) = as_user(&repl, &without, "echo ids=$(id -u)\n:quit\n");
    assert!(status.success(), "{stdout}\n{stderr}");
    assert!(
        stdout.contains(&format!("ids={USER}\n")),
        "{stdout}\n{stderr}"
    );
    let (_, doctor, _) = as_user("doctor", &without, "");
    assert!(
        doctor.contains(
            "subordinate ids  NO (/etc/subuid gives cellbox-subids no subordinate uids): every \
             cell runs as the user's own uid"
        ),
        "{doctor}"
    );
}
