#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a failed test
//! No fd, zombie or scratch dir outlives a cell. A binary of its own: it
//! counts process-wide resources, which concurrent tests would disturb.

use cellbox::{CellRequest, Language, SessionConfig, Status, Supervisor};

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

fn children_of_me() -> usize {
    let me = std::process::id().to_string();
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| std::fs::read_to_string(e.path().join("stat")).ok())
        .filter(|stat| {
            stat.rfind(')')
                .and_then(|i| stat[i + 2..].split_whitespace().nth(1).map(|p| p == me))
                .unwrap_or(false)
        })
        .count()
}

fn scratch_dirs() -> usize {
    std::fs::read_dir(std::env::temp_dir())
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("cellbox-"))
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_leaked_fds_zombies_or_dirs_after_200_cells() {
    let sup = Supervisor::builder()
        .worker_exe(env!("CARGO_BIN_EXE_cellbox"))
        .build()
        .unwrap();
    // Warm up the runtime's own fds (worker threads, epoll, signal pipe).
    let r = sup
        .run(
            CellRequest::new(Language::Rhai, "1"),
            SessionConfig::default(),
        )
        .await;
    assert_eq!(r.status, Status::Ok, "{r:?}");
    let fds = open_fds();
    let dirs = scratch_dirs();
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
    }
    assert_eq!(open_fds(), fds, "file descriptors leaked");
    assert_eq!(
        children_of_me(),
        0,
        "worker processes (or zombies) left behind"
    );
    assert_eq!(scratch_dirs(), dirs, "scratch directories left behind");
}
