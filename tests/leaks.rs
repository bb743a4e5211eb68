#![allow(clippy::unwrap_used, clippy::expect_used, clippy::disallowed_macros)] // test code: a panic is a failed test; stderr is for the developer
//! No fd, zombie or scratch dir outlives a cell. A binary of its own: it
//! counts process-wide resources, which concurrent tests would disturb.

use cellbox::{CellRequest, Language, SessionConfig, Status, Supervisor};

#[path = "suite/common/procs.rs"]
mod procs;

/// Every process descended from this one, with its command line.
fn descendants() -> Vec<(i32, String)> {
    procs::descendants_in(&procs::processes(), std::process::id() as i32)
        .into_iter()
        .map(|p| (p.pid, p.cmd.chars().take(300).collect()))
        .collect()
}

/// Descendants minus the fork server's waiting spares (their pids change as
/// cells take them) and the supervisor's freezer guard (it lives as long as
/// the supervisor: gone with it, as the end of the test checks), and how
/// many spares there are.
fn settled_processes() -> (Vec<(i32, String)>, usize) {
    let (spares, others): (Vec<_>, Vec<_>) = descendants()
        .into_iter()
        .filter(|(_, cmd)| !cmd.contains(" __freezer_guard "))
        .partition(|(pid, _)| procs::comm(*pid) == "cellbox-spare");
    (others, spares.len())
}

fn scratch_dirs() -> usize {
    std::fs::read_dir(std::env::temp_dir())
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("cellbox-"))
        .count()
}

async fn two_hundred_and_fifty_cells(sup: &Supervisor) {
    for i in 0..200 {
        let code = match i % 4 {
            0 => "print(\"x\"); 1".to_string(),
            1 => "throw \"no\"".to_string(),
            2 => "let s = \"\"; for i in 0..100 { s += i; } s".to_string(),
            _ => "loop {}".to_string(),
        };
        let mut req = CellRequest::new(Language::Rhai, code);
        req.limits.timeout_ms = Some(200);
        let r = sup.run(req, SessionConfig::default()).await;
        assert_ne!(r.status, Status::ProtocolError, "{r:?}");
        assert_ne!(r.status, Status::SandboxError, "{r:?}");
        if i % 4 == 0 {
            // Python too: a value, an error, a runaway, and a cell that
            // leaves a file, a thread and a forked sleeper behind.
            let code = match (i / 4) % 4 {
                0 => "print('x'); 1",
                1 => "raise ValueError('no')",
                2 => "while True: pass",
                _ => {
                    "import os, threading, time
open('f', 'w').write('x')
threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
if os.fork() == 0:
    time.sleep(60)
1"
                }
            };
            let mut req = CellRequest::new(Language::Python, code);
            req.limits.timeout_ms = Some(300);
            let r = sup.run(req, SessionConfig::default()).await;
            assert_ne!(r.status, Status::ProtocolError, "{r:?}");
            assert_ne!(r.status, Status::SandboxError, "{r:?}");
        }
    }
}

/// The supervisor keeps up to 8 emptied session cgroups for its next
/// sessions, each with at most one emptied cell cgroup: 9 open fds each,
/// 72 at most. Cells run one after another need one, but one more is kept
/// whenever a session's group happens to be given back after the next
/// session took its own: a cache that grows to its bound with timing, not
/// a leak. So fds into the cgroup hierarchies are counted apart, against
/// that bound.
const GROUP_CACHE_FDS: usize = 8 * 9;

/// This process's open fds: those into the cgroup hierarchies, and the
/// others.
fn open_fds() -> (usize, usize) {
    let all = procs::fd_list();
    let groups = all
        .iter()
        .filter(|f| f.contains(" -> /sys/fs/cgroup/"))
        .count();
    (all.len() - groups, groups)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_leaked_fds_zombies_or_dirs_after_250_cells_on_either_path() {
    // Count scratch dirs in a temp dir of our own: other programs come and
    // go in the shared one.
    let own_tmp = tempfile::Builder::new().prefix("leaks-").tempdir().unwrap();
    std::env::set_var("TMPDIR", own_tmp.path());
    for warm in [false, true] {
        let sup = Supervisor::builder()
            .worker_exe(env!("CARGO_BIN_EXE_cellbox"))
            .warm(warm)
            .build()
            .unwrap();
        // Warm up the runtime's own fds (threads, epoll), the fork server
        // and the whole Python pool.
        sup.start_pools().await.unwrap();
        let r = sup
            .run(
                CellRequest::new(Language::Rhai, "1"),
                SessionConfig::default(),
            )
            .await;
        assert_eq!(r.status, Status::Ok, "{r:?}");
        let r = sup
            .run(
                CellRequest::new(Language::Python, "1"),
                SessionConfig::default(),
            )
            .await;
        assert_eq!(r.status, Status::Ok, "{r:?}");
        // The session prepared for the next cell is counted apart: it is
        // given back before counting, and again after the cells, so that
        // what the cells' prepared sessions held is counted as left too.
        sup.release_prepared().await;
        // A warm cell's result comes before its worker has exited: let the
        // workers of the two cells above be reaped before counting.
        let mut fds = open_fds();
        let mut same = 0;
        for _ in 0..200 {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            let now = open_fds();
            same = if now == fds { same + 1 } else { 0 };
            fds = now;
            if same == 10 {
                break;
            }
        }
        let dirs = scratch_dirs();
        let pool_root = sup.pool_status().await.scratch_root;
        assert_eq!(pool_root.is_some(), warm);
        let in_pool = || {
            pool_root
                .as_ref()
                .map(|r| std::fs::read_dir(r).unwrap().count())
                .unwrap_or(0)
        };
        let pool_dirs = in_pool();
        let fds_before = procs::fd_list();
        let (procs, spares) = settled_processes();
        two_hundred_and_fifty_cells(&sup).await;
        sup.release_prepared().await;
        // The release has waited for the cells' sessions to be torn down
        // (`prepared::release_returns_once_the_sessions_of_cells_over_are_gone`
        // holds it to that); the pool refills its spares in the background:
        // let that finish.
        for _ in 0..100 {
            if open_fds().0 == fds.0 && settled_processes() == (procs.clone(), spares) {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        let (others, groups) = open_fds();
        assert_eq!(
            others,
            fds.0,
            "file descriptors leaked (warm: {warm}); before the cells: {fds_before:#?}, after: {:#?}",
            procs::fd_list()
        );
        assert!(
            groups <= GROUP_CACHE_FDS.max(fds.1),
            "{groups} fds into the cgroup hierarchies (the kept groups hold at most {GROUP_CACHE_FDS}; warm: {warm}): {:#?}",
            procs::fd_list()
        );
        assert_eq!(
            in_pool(),
            pool_dirs,
            "scratch dirs left in the pool root (warm: {warm})"
        );
        assert_eq!(
            scratch_dirs(),
            dirs,
            "scratch dirs left behind (warm: {warm})"
        );
        assert_eq!(
            settled_processes(),
            (procs.clone(), spares),
            "worker processes (or zombies) left behind (warm: {warm})"
        );
        if warm {
            // Three spares, but none with session cgroups (each cell is
            // forked for it and joins its groups itself).
            let want = if sup.pool_status().await.session_cgroups {
                0
            } else {
                3
            };
            assert_eq!(spares, want, "the fork server keeps {want} spares");
            assert!(
                procs.iter().any(|p| p.1.contains("__forkserver")),
                "{procs:?}"
            );
            // The zygotes (running Python once ready) are among them.
            let zygotes: Vec<i32> = sup
                .pool_status()
                .await
                .python
                .iter()
                .filter(|z| z.alive)
                .map(|z| z.pid)
                .collect();
            assert!(!zygotes.is_empty(), "{procs:?}");
            for z in zygotes {
                assert!(procs.iter().any(|p| p.0 == z), "{z}: {procs:?}");
            }
        } else {
            assert!(procs.is_empty() && spares == 0, "{procs:?}");
        }
        // Dropping the supervisor stops its fork server.
        drop(sup);
        for _ in 0..100 {
            if descendants().is_empty() {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        assert_eq!(
            descendants(),
            vec![],
            "the fork server outlived its supervisor"
        );
    }
}
