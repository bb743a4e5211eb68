//! The macOS launch path on any platform: cells started as `sandbox-exec
//! -p <policy> <engine> __seatbelt_worker`, with a stand-in `sandbox-exec`
//! that records its arguments and runs the worker without a sandbox. What
//! is tested here is everything but the kernel's enforcement of the policy:
//! the policy handed over, the worker's own steps (descriptors,
//! environment, rlimits), the protocol round trip and the report.

use super::common::*;
use cellbox::{CellRequest, CellResult, Language, SessionConfig, Status, Supervisor};
use serde_json::json;
use std::path::{Path, PathBuf};

/// A stand-in `sandbox-exec` in a fresh directory: it writes its arguments,
/// NUL-separated, to `args.<pid>` beside itself, then checks it was called
/// as `-p <policy> <program> ...` and executes the program.
struct StandIn {
    dir: tempfile::TempDir,
}

impl StandIn {
    fn new() -> StandIn {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let script = dir.path().join("sandbox-exec");
        let body = format!(
            "#!/bin/sh\nprintf '%s\\0' \"$@\" > '{}/args.'$$\n\
             [ \"$1\" = -p ] || {{ echo 'stand-in: expected -p' >&2; exit 64; }}\n\
             shift 2\nexec \"$@\"\n",
            dir.path().display()
        );
        std::fs::write(&script, body).unwrap();
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        StandIn { dir }
    }

    fn path(&self) -> PathBuf {
        self.dir.path().join("sandbox-exec")
    }

    fn supervisor(&self) -> Supervisor {
        Supervisor::builder()
            .worker_exe(bin())
            .python("/usr/bin/python3")
            .sandbox_exec(self.path())
            .warm(false)
            .build()
            .unwrap()
    }

    /// The argument lists it was called with, one per worker.
    fn calls(&self) -> Vec<Vec<String>> {
        let mut calls = Vec::new();
        for e in std::fs::read_dir(self.dir.path()).unwrap() {
            let e = e.unwrap();
            if !e.file_name().to_string_lossy().starts_with("args.") {
                continue;
            }
            let raw = std::fs::read(e.path()).unwrap();
            let args = raw
                .split(|b| *b == 0)
                .filter(|a| !a.is_empty())
                .map(|a| String::from_utf8(a.to_vec()).unwrap())
                .collect();
            calls.push(args);
        }
        calls
    }
}

/// The one call the stand-in got: `-p <policy> <engine> __seatbelt_worker`,
/// with a policy that starts closed and grants the scratch directory.
fn the_policy(stand_in: &StandIn) -> String {
    let calls = stand_in.calls();
    assert_eq!(calls.len(), 1, "{calls:?}");
    let args = &calls[0];
    assert_eq!(args.len(), 4, "{args:?}");
    assert_eq!(args[0], "-p");
    let engine = std::fs::canonicalize(bin()).unwrap();
    assert_eq!(Path::new(&args[2]), engine);
    assert_eq!(args[3], "__seatbelt_worker");
    let policy = args[1].clone();
    let rules: Vec<&str> = policy.lines().filter(|l| !l.starts_with(';')).collect();
    assert_eq!(rules[..2], ["(version 1)", "(deny default)"], "{policy}");
    assert!(
        policy.contains(&format!(
            "(allow process-exec (literal \"{}\"))",
            engine.display()
        )),
        "{policy}"
    );
    assert!(!policy.contains("(allow network"), "{policy}");
    policy
}

fn require_seatbelt_report(r: &CellResult) {
    let report = r
        .sandbox
        .as_ref()
        .unwrap_or_else(|| panic!("no report: {r:?}"));
    let names: Vec<(&str, bool)> = report
        .layers
        .iter()
        .map(|l| (l.name.as_str(), l.applied))
        .collect();
    assert_eq!(
        names,
        [("sandbox_exec", true), ("hygiene", true), ("rlimits", true)],
        "{report:?}"
    );
    assert!(report.namespaces.is_empty());
    assert_eq!(report.landlock_abi, None);
}

#[tokio::test]
async fn rhai_cells_round_trip_through_sandbox_exec() {
    let stand_in = StandIn::new();
    let sup = stand_in.supervisor();
    let session = sup.session(SessionConfig::default()).unwrap();
    let r = rhai(&session, "let x = 40; print(\"hi\"); x").await;
    assert_eq!(r.status, Status::Ok, "{r:?}");
    assert_eq!(r.stdout, "hi\n");
    assert_eq!(r.value, json!(40));
    require_seatbelt_report(&r);
    let policy = the_policy(&stand_in);
    // A Rhai cell starts no process and executes nothing but the engine.
    assert!(!policy.contains("(allow process-fork)"), "{policy}");
    assert_eq!(policy.matches("(allow process-exec").count(), 1, "{policy}");
    // The session's namespace is carried to the next cell, in a new worker.
    let r = rhai(&session, "x + 2").await;
    assert_eq!(r.status, Status::Ok, "{r:?}");
    assert_eq!(r.value, json!(42));
    assert_eq!(stand_in.calls().len(), 2);
    // The operation limit still ends a runaway script.
    let r = rhai(&session, "loop {}").await;
    assert_ne!(r.status, Status::Ok, "{r:?}");
}

#[tokio::test]
async fn python_cells_round_trip_through_sandbox_exec() {
    let stand_in = StandIn::new();
    let sup = stand_in.supervisor();
    let r = sup
        .run(
            CellRequest::new(
                Language::Python,
                "import os, resource\n\
                 print('hello')\n\
                 fds = sorted(int(f) for f in os.listdir('/dev/fd'))\n\
                 {'env': sorted(os.environ), 'cwd': os.getcwd() == os.environ['HOME'],\n\
                  'nofile': resource.getrlimit(resource.RLIMIT_NOFILE)[0],\n\
                  'core': resource.getrlimit(resource.RLIMIT_CORE)[1],\n\
                  'fds': fds[:4], 'more_fds': len(fds) - 4}",
            ),
            SessionConfig::default(),
        )
        .await;
    assert_eq!(r.status, Status::Ok, "{r:?}");
    assert_eq!(r.stdout, "hello\n");
    require_seatbelt_report(&r);
    let nofile = r
        .sandbox
        .as_ref()
        .unwrap()
        .layer("rlimits")
        .unwrap()
        .detail
        .clone();
    assert_eq!(
        r.value["env"],
        json!(["HOME", "LANG", "LC_ALL", "PATH", "TMPDIR"]),
        "{r:?}"
    );
    assert_eq!(r.value["cwd"], json!(true));
    assert_eq!(r.value["core"], json!(0));
    assert!(
        nofile.contains(&format!("max_open_files={}", r.value["nofile"])),
        "{nofile} vs {}",
        r.value
    );
    // 0-3, and at most the listing's own descriptor above them.
    assert_eq!(r.value["fds"], json!([0, 1, 2, 3]), "{r:?}");
    assert!(r.value["more_fds"].as_i64().unwrap() <= 1, "{r:?}");
    let policy = the_policy(&stand_in);
    let python = std::fs::canonicalize("/usr/bin/python3").unwrap();
    assert!(
        policy.contains(&format!("(literal \"{}\")", python.display())),
        "{policy}"
    );
    assert!(policy.contains("(allow process-fork)"), "{policy}");
    // A Python error comes back as the cell's error.
    let r = sup
        .run(
            CellRequest::new(Language::Python, "raise ValueError('nope')"),
            SessionConfig::default(),
        )
        .await;
    assert_eq!(r.status, Status::Error, "{r:?}");
    assert_eq!(r.error.unwrap().kind, "ValueError");
}

#[tokio::test]
async fn a_launcher_that_is_missing_fails_the_cell_and_says_so() {
    let sup = Supervisor::builder()
        .worker_exe(bin())
        .sandbox_exec("/nonexistent/sandbox-exec")
        .warm(false)
        .build()
        .unwrap();
    let r = sup
        .run(
            CellRequest::new(Language::Rhai, "1"),
            SessionConfig::default(),
        )
        .await;
    assert_ne!(r.status, Status::Ok, "{r:?}");
    let message = r.error.unwrap().message;
    assert!(message.contains("/nonexistent/sandbox-exec"), "{message}");
}
