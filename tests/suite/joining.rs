//! A cell forked by a warm parent (a Python zygote, the Rhai fork server)
//! joins its session's and its own cgroups itself, before it runs any
//! code: the Python cell finds itself in them, and the Rhai cell's worker is
//! in its cell group while it runs (forked for it: with session cgroups the
//! fork server keeps no spares, which would have to be moved by pid).

use super::common::{self, *};
use cellbox::{CellRequest, Language, SessionConfig, Status, Supervisor};

fn require_root() {
    common::require_root(
        "these tests need root: per-session cgroups are made by a root supervisor",
    );
}

/// The cgroup path of `controller` in a `/proc/<pid>/cgroup` text.
fn path_of<'a>(text: &'a str, controller: &str) -> &'a str {
    text.lines()
        .find_map(|l| {
            let mut parts = l.splitn(3, ':');
            let (_, ctl, path) = (parts.next()?, parts.next()?, parts.next()?);
            ctl.split(',').any(|c| c == controller).then_some(path)
        })
        .unwrap_or_else(|| panic!("no {controller} line in {text:?}"))
}

/// The last `n` components of a cgroup path, each a letter and a number.
fn tail(path: &str, n: usize) -> Vec<(char, u64)> {
    let parts: Vec<&str> = path.rsplit('/').take(n).collect();
    parts
        .into_iter()
        .rev()
        .map(|p| {
            let mut c = p.chars();
            let head = c.next().unwrap_or('?');
            (head, c.as_str().parse::<u64>().unwrap_or(u64::MAX))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_zygote_cell_joins_its_session_and_cell_cgroups_itself() {
    require_root();
    let sup = one_zygote(pool(1));
    sup.start_pools().await.unwrap();
    assert!(
        sup.pool_status().await.session_cgroups,
        "no session cgroups"
    );
    // Cells forked by the zygote (a live session's later cells are forked
    // by its state process, and moved by the supervisor: see live.rs).
    let session = sup.session(replay(SessionConfig::default())).unwrap();
    let read = "open('/proc/self/cgroup').read()";
    let mut cells = Vec::new();
    for _ in 0..2 {
        let r = session.run(CellRequest::new(Language::Python, read)).await;
        assert_eq!(r.status, Status::Ok, "{r:?}");
        cells.push(r.value.as_str().unwrap().to_owned());
    }
    let forked: u64 = sup.pool_status().await.python.iter().map(|z| z.cells).sum();
    assert!(forked >= 2, "the cells did not come from the zygote");
    for text in &cells {
        // memory: …/s<k>; pids and cpuacct: …/s<k>/c<m>.
        let mem = tail(path_of(text, "memory"), 1);
        let pids = tail(path_of(text, "pids"), 2);
        let cpu = tail(path_of(text, "cpuacct"), 2);
        assert_eq!(mem[0].0, 's', "memory cgroup {text}");
        assert!(pids[0] == mem[0] && pids[1].0 == 'c', "pids cgroup {text}");
        assert_eq!(cpu, pids, "cpuacct cgroup {text}");
    }
    // One session: the same session group for both cells.
    assert_eq!(
        tail(path_of(&cells[0], "memory"), 1),
        tail(path_of(&cells[1], "memory"), 1)
    );
}

/// Host pids of the processes in this supervisor's Rhai cell groups
/// (`pids/cellbox-<our pid>-*/s*/c*`), with their names.
fn in_cell_groups() -> Vec<(i32, String)> {
    let prefix = format!("cellbox-{}-", std::process::id());
    let mut out = Vec::new();
    let Ok(tops) = std::fs::read_dir("/sys/fs/cgroup/pids") else {
        return out;
    };
    for top in tops.flatten() {
        if !top.file_name().to_string_lossy().starts_with(&prefix) {
            continue;
        }
        for s in std::fs::read_dir(top.path())
            .into_iter()
            .flatten()
            .flatten()
        {
            for c in std::fs::read_dir(s.path()).into_iter().flatten().flatten() {
                if !c.file_name().to_string_lossy().starts_with('c') || !c.path().is_dir() {
                    continue;
                }
                let procs =
                    std::fs::read_to_string(c.path().join("cgroup.procs")).unwrap_or_default();
                for pid in procs.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
                    let comm =
                        std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
                    out.push((pid, comm.trim().to_owned()));
                }
            }
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fork_server_cell_joins_its_cell_cgroup_itself() {
    require_root();
    assert!(
        std::path::Path::new("/sys/fs/cgroup/pids").is_dir(),
        "this test reads the cgroup v1 pids hierarchy"
    );
    let sup = Supervisor::builder()
        .worker_exe(bin())
        .warm(true)
        .build()
        .unwrap();
    sup.start_pools().await.unwrap();
    let status = sup.pool_status().await;
    assert!(status.rhai_fork_server, "no fork server");
    assert!(status.session_cgroups, "no session cgroups");
    // Every cell is forked for it: no spares wait.
    assert_eq!(status.rhai_spares, 0, "{status:?}");
    // A cell that runs until it is dropped; while it runs, its worker is
    // in its cell group.
    let running = tokio::spawn({
        let sup = sup.clone();
        async move {
            sup.run(
                CellRequest::new(Language::Rhai, "loop { }"),
                SessionConfig::default(),
            )
            .await
        }
    });
    let mut seen = Vec::new();
    let found = tokio::task::block_in_place(|| {
        eventually(20, || {
            seen = in_cell_groups();
            seen.iter().any(|(_, comm)| comm == "cellbox-cell")
        })
    });
    running.abort();
    assert!(found, "no Rhai worker in a cell group: {seen:?}");
    // And the next cells (now and in a session) still run.
    let session = sup.session(SessionConfig::default()).unwrap();
    for _ in 0..2 {
        let r = session
            .run(CellRequest::new(Language::Rhai, "40 + 2"))
            .await;
        assert_eq!(r.value, serde_json::json!(42), "{r:?}");
    }
}
