//! cgroup v2 in a VM: the tests that need a cgroup-v2-only host, run on
//! one, since the hosts this suite usually runs on mount cgroup v1.
//!
//! QEMU (software emulation: the hosts' /dev/kvm cannot boot a stock
//! kernel) boots Debian's backports kernel with `cgroup_no_v1=all` and an
//! initramfs of a static busybox and five modules (tests/vm/init). The
//! host's root is shared read-only over 9p beneath a tmpfs for writes, so
//! the VM runs this build's binaries where they are; a second share holds
//! the jobs (shell scripts) and takes back what each printed and its exit
//! status. tests/vm/stage2 mounts cgroup2 with `nsdelegate`, enables
//! `cpu io memory pids` and runs the jobs in `/ci.service`, a cgroup that
//! holds processes, as a service's does.
//!
//! Needs qemu-system-x86_64, busybox (static) and the kernel that
//! tests/vm/fetch-kernel.sh unpacks into target/vm/kernel; `.ci/run`
//! installs all three. Without them this test fails and says what to do.
//! The other test programs it runs in the VM are found beside it, so run
//! it as part of `cargo test` (which builds them first).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::disallowed_macros)] // test code: a panic is a failed test; stderr is for the developer

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// How long one boot may take with its jobs, at most.
const VM_TIMEOUT: Duration = Duration::from_secs(25 * 60);

/// Where fetch-kernel.sh put the kernel (`CELLBOX_VM_DIR` overrides).
fn kernel_dir() -> PathBuf {
    std::env::var_os("CELLBOX_VM_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target/vm"))
        .join("kernel")
}

fn on_path(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join(name))
            .find(|p| p.is_file())
    })
}

/// A test program built beside this one: the newest `<name>-<hash>` in
/// this program's directory, and, with `probe`, one whose `--list` names
/// that test (the library's tests share their name with the binaries).
fn sibling(name: &str, probe: Option<&str>) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let me = std::env::current_exe().expect("this test program's path");
    let dir = me.parent().expect("its directory");
    let mut found: Vec<(std::time::SystemTime, PathBuf)> = std::fs::read_dir(dir)
        .expect("read the test programs' directory")
        .flatten()
        .filter(|e| {
            let n = e.file_name().to_string_lossy().into_owned();
            n.strip_prefix(name)
                .and_then(|rest| rest.strip_prefix('-'))
                .is_some_and(|h| h.len() == 16 && h.bytes().all(|b| b.is_ascii_hexdigit()))
        })
        .filter_map(|e| {
            let m = e.metadata().ok()?;
            (m.is_file() && m.permissions().mode() & 0o111 != 0)
                .then(|| (m.modified().ok(), e.path()))
                .and_then(|(t, p)| Some((t?, p)))
        })
        .collect();
    found.sort();
    found.reverse();
    for (_, path) in found {
        let Some(test) = probe else { return path };
        let listed = Command::new(&path)
            .args(["--list", test])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).contains(test))
            .unwrap_or(false);
        if listed {
            return path;
        }
    }
    panic!(
        "no test program {name}-<hash> beside {} (build them all: cargo test --profile \
         test-release --no-run)",
        me.display()
    );
}

/// The initramfs: busybox, the modules, tests/vm/init.
fn initramfs(work: &Path, kernel: &Path) -> PathBuf {
    let busybox = Path::new("/bin/busybox");
    let root = work.join("initramfs");
    for d in [
        "bin",
        "dev",
        "proc",
        "sys",
        "mnt/lower",
        "mnt/rw",
        "newroot",
        "modules",
    ] {
        std::fs::create_dir_all(root.join(d)).unwrap();
    }
    std::fs::copy(busybox, root.join("bin/busybox")).unwrap();
    for m in std::fs::read_dir(kernel.join("modules")).unwrap().flatten() {
        std::fs::copy(m.path(), root.join("modules").join(m.file_name())).unwrap();
    }
    let init = root.join("init");
    std::fs::copy(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/vm/init"),
        &init,
    )
    .unwrap();
    std::fs::set_permissions(&init, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let mut names = Vec::new();
    let mut stack = vec![root.clone()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let rel = e.path().strip_prefix(&root).unwrap().to_path_buf();
            names.push(format!("./{}", rel.display()));
            if e.file_type().unwrap().is_dir() {
                stack.push(e.path());
            }
        }
    }
    let out = work.join("initramfs.cpio");
    let mut cpio = Command::new(busybox)
        .args(["cpio", "-o", "-H", "newc"])
        .current_dir(&root)
        .stdin(Stdio::piped())
        .stdout(std::fs::File::create(&out).unwrap())
        .stderr(Stdio::null())
        .spawn()
        .expect("run busybox cpio");
    cpio.stdin
        .take()
        .unwrap()
        .write_all(names.join("\n").as_bytes())
        .unwrap();
    assert!(cpio.wait().unwrap().success(), "busybox cpio failed");
    out
}

/// What one job printed and how it ended (`None`: it never ended).
struct Ran {
    out: String,
    rc: Option<i32>,
}

/// Boot the VM once, run `jobs` (name, shell script) in order, and return
/// what each did, with the VM's console.
fn boot(jobs: &[(&str, String)]) -> (BTreeMap<String, Ran>, String) {
    let kernel = kernel_dir();
    let qemu = on_path("qemu-system-x86_64").unwrap_or_else(|| {
        panic!(
            "qemu-system-x86_64 is not installed (apt-get install qemu-system-x86; .ci/run does)"
        )
    });
    assert!(
        Path::new("/bin/busybox").is_file(),
        "/bin/busybox is missing (apt-get install busybox-static; .ci/run does)"
    );
    assert!(
        kernel.join("vmlinuz").is_file(),
        "no kernel in {}: run tests/vm/fetch-kernel.sh (.ci/run does)",
        kernel.display()
    );
    let work = tempfile::tempdir().unwrap();
    let initrd = initramfs(work.path(), &kernel);
    let share = work.path().join("share");
    std::fs::create_dir_all(share.join("jobs")).unwrap();
    std::fs::create_dir_all(share.join("out")).unwrap();
    std::fs::copy(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/vm/stage2"),
        share.join("stage2"),
    )
    .unwrap();
    for (i, (name, script)) in jobs.iter().enumerate() {
        std::fs::write(
            share.join("jobs").join(format!("{i:02}-{name}")),
            format!("set -e\n{script}\n"),
        )
        .unwrap();
    }
    let console = work.path().join("console");
    let started = Instant::now();
    let mut vm = Command::new(qemu)
        .args([
            "-machine",
            "q35",
            "-accel",
            "tcg,thread=multi",
            "-cpu",
            "max",
        ])
        .args([
            "-smp",
            "2",
            "-m",
            "4096",
            "-nographic",
            "-no-reboot",
            "-nic",
            "none",
        ])
        .arg("-kernel")
        .arg(kernel.join("vmlinuz"))
        .arg("-initrd")
        .arg(&initrd)
        .args([
            "-append",
            "console=ttyS0 quiet loglevel=3 cgroup_no_v1=all panic=-1",
        ])
        .args([
            "-virtfs",
            "local,path=/,mount_tag=hostroot,security_model=none,readonly=on",
        ])
        .arg("-virtfs")
        .arg(format!(
            "local,path={},mount_tag=share,security_model=none",
            share.display()
        ))
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&console).unwrap())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start qemu-system-x86_64");
    let status = loop {
        if let Some(s) = vm.try_wait().unwrap() {
            break Some(s);
        }
        if started.elapsed() > VM_TIMEOUT {
            let _ = vm.kill();
            let _ = vm.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let console = std::fs::read_to_string(&console).unwrap_or_default();
    eprintln!(
        "VM: {:?} after {:.1} s; its console:\n{console}",
        status,
        started.elapsed().as_secs_f64()
    );
    assert!(status.is_some(), "the VM ran past {VM_TIMEOUT:?}");
    let mut ran = BTreeMap::new();
    for (i, (name, _)) in jobs.iter().enumerate() {
        let base = share.join("out").join(format!("{i:02}-{name}"));
        let out = std::fs::read_to_string(&base).unwrap_or_default();
        let rc = std::fs::read_to_string(base.with_extension("rc"))
            .ok()
            .and_then(|t| t.trim().parse().ok());
        ran.insert(name.to_string(), Ran { out, rc });
    }
    (ran, console)
}

#[test]
fn cgroup_v2_guarantees_hold_in_a_vm() {
    let cellbox = env!("CARGO_BIN_EXE_cellbox");
    let lib = sibling(
        "cellbox",
        Some("sandbox::linux::groups::tests::a_cells_tree_is_bounded_counted_and_emptied"),
    );
    let all = sibling("all", None);
    let security = sibling("security", None);
    let mut jobs = vec![
        ("doctor", format!("{cellbox} doctor")),
        (
            "lib",
            format!(
                "{} --test-threads 1 sandbox::linux::cgroup sandbox::linux::groups",
                lib.display()
            ),
        ),
        (
            "tenancy",
            // With a session's CPU budget, counted by v2's `cpu.stat`.
            format!(
                "{} --test-threads 1 tenancy:: lifetime::a_session_cpu_budget",
                all.display()
            ),
        ),
        // An emulated machine: cells may take three times their time.
        (
            "security",
            format!("CELLBOX_TEST_TIME_SCALE=3 {} tenant_", security.display()),
        ),
        // A few hundred cells across sessions through `serve`, hostile
        // ones among them (memory hogs, fork bombs), and the server back to
        // idle after.
        (
            "soak",
            // Cells of 256 MiB and three times their time: a memory hog
            // reaches its bound before its deadline on an emulated machine
            // under load too (at 10 s one did not, near its bound).
            format!(
                "{cellbox} soak --cells 300 --concurrency 2 --seed 7 --time-scale 3 \\
                 --serve-arg=--memory --serve-arg=268435456"
            ),
        ),
        // Without root: uid 1000 in a subtree delegated to it, as systemd
        // delegates `user@1000.service` (the directory and its
        // cgroup.procs, cgroup.subtree_control and cgroup.threads): two
        // sessions kept apart, and `cellbox exec` held to its memory in all.
        (
            "rootless",
            format!(
                "d=/sys/fs/cgroup/user-1000
mkdir $d
chown 1000:1000 $d $d/cgroup.procs $d/cgroup.subtree_control $d/cgroup.threads
echo $$ > $d/cgroup.procs
mkdir -p /tmp/home-1000 && chown 1000:1000 /tmp/home-1000
HOME=/tmp/home-1000 setpriv --reuid 1000 --regid 1000 --clear-groups --inh-caps=-all \
    {all} --exact --include-ignored --test-threads 1 \
    suite::tenancy::without_root_a_delegated_subtree_keeps_sessions_apart \
    suite::cli::exec_holds_a_forking_program_to_the_memory_limit_in_all",
                all = all.display()
            ),
        ),
    ];
    // For working on one part: CELLBOX_VM_ONLY=lib,tenancy (said aloud).
    if let Some(only) = std::env::var_os("CELLBOX_VM_ONLY") {
        let only = only.to_string_lossy().into_owned();
        let keep: Vec<&str> = only.split(',').collect();
        jobs.retain(|(n, _)| keep.contains(n));
        eprintln!("CELLBOX_VM_ONLY={only}: running only {keep:?}");
    }
    let (ran, _console) = boot(&jobs);
    let mut failed = Vec::new();
    for (name, r) in &ran {
        eprintln!("==== {name}: exit {:?}\n{}", r.rc, r.out);
        if r.rc != Some(0) {
            failed.push(name.clone());
        }
    }
    if let Some(doctor) = ran.get("doctor") {
        // Per-session and per-cell groups, in the cgroup the jobs run in.
        let d = &doctor.out;
        assert!(
            d.contains("cgroup v2 memory (/sys/fs/cgroup/ci.service)"),
            "{d}"
        );
        assert!(d.contains("sessions         a cgroup each"), "{d}");
        assert!(d.contains("one per cell"), "{d}");
    }
    if let Some(soak) = ran.get("soak") {
        assert!(soak.out.contains("PASS"), "{}", soak.out);
    }
    if let Some(r) = ran.get("rootless") {
        assert!(r.out.contains("2 passed"), "{}", r.out);
    }
    assert!(failed.is_empty(), "failed in the VM: {failed:?}");
}
