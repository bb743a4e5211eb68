//! Upstream state between principals: X stores a canary in a stateful
//! upstream MCP server (the fake one's `store`), and Y reads what the
//! server kept (`read`).
//!
//! Control: the upstream declared `shared = true` (one connection for
//! every principal): Y reads X's canary. Defence: the default, a
//! connection per principal (a process each for this stdio server): Y's
//! `read` has nothing of X's, while X reads its own canary back, and the
//! host sees two upstream processes, one per principal.

use super::harness::{marker, python, Client, Env, Serve};
use super::Outcome;

/// The fake upstream program, built beside the cellbox binary by `cargo
/// test` (it builds the examples).
fn fake_upstream(env: &Env) -> Result<std::path::PathBuf, String> {
    let p = env
        .cellbox
        .parent()
        .ok_or("no directory of the cellbox binary")?
        .join("examples")
        .join("fake_mcp_upstream");
    if p.is_file() {
        Ok(p)
    } else {
        Err(format!(
            "{} is missing: build it with cargo build --example fake_mcp_upstream",
            p.display()
        ))
    }
}

/// (what X read back, what Y read).
async fn attack(x: &Client, y: &Client, canary: &str) -> Result<(String, String), String> {
    let stored = python(
        x,
        None,
        &format!("tools.up.store(text={canary:?})\nprint('stored')"),
        30,
    )
    .await;
    if stored.stdout() != "stored\n" {
        return Err(format!("X could not store: {}", stored.all_text()));
    }
    let read = "print(tools.up.read()['stored'])";
    let mine = python(x, None, read, 30).await;
    let theirs = python(y, None, read, 30).await;
    if theirs.status() != "ok" {
        return Err(format!("Y could not read: {}", theirs.all_text()));
    }
    Ok((mine.stdout(), theirs.stdout()))
}

pub fn run(env: &Env) -> Result<Outcome, String> {
    let program = fake_upstream(env)?;
    let dir = tempfile::tempdir().map_err(|e| format!("temp dir: {e}"))?;
    let start = |shared: bool| -> Result<Serve, String> {
        let cfg = dir.path().join(format!("up-{shared}.toml"));
        std::fs::write(
            &cfg,
            format!(
                "[policy]\nallow = [\"up.*\"]\n\
                 [tools.up]\nkind = \"mcp\"\ncommand = [{:?}]\nshared = {shared}\n",
                program.display().to_string()
            ),
        )
        .map_err(|e| format!("config: {e}"))?;
        let cfg = cfg.display().to_string();
        Serve::start(
            env,
            &["x", "y"],
            &["--language", "python", "--config", &cfg],
        )
    };
    let control = {
        let serve = start(true)?;
        let (x, y) = (serve.client(env, "x")?, serve.client(env, "y")?);
        let canary = marker("UPSTATE-");
        let (_, theirs) = env.block_on("control", attack(&x, &y, &canary))??;
        if !theirs.contains(&canary) {
            return Err(format!(
                "with shared = true Y did not read X's canary ({theirs:?}); the attack is broken"
            ));
        }
        "with shared = true Y read X's canary from the one upstream process".to_owned()
    };
    let serve = start(false)?;
    let (x, y) = (serve.client(env, "x")?, serve.client(env, "y")?);
    let canary = marker("UPSTATE-");
    let (mine, theirs) = env.block_on("attack", attack(&x, &y, &canary))??;
    let processes = children_named(serve.pid(), "fake_mcp_upstream");
    let blocked = !theirs.contains(&canary) && mine.contains(&canary) && processes == 2;
    Ok(Outcome {
        control,
        blocked,
        evidence: format!(
            "Y read {theirs:?}; X read back {mine:?}; upstream processes of the server: \
             {processes}"
        ),
    })
}

/// How many processes named `name` have `parent` as their parent.
fn children_named(parent: i32, name: &str) -> usize {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return 0;
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
                let comm = stat
                    .split_once('(')
                    .and_then(|(_, r)| r.rsplit_once(')'))
                    .map(|(c, _)| c);
                let ppid = stat
                    .rsplit_once(')')
                    .and_then(|(_, r)| r.split_whitespace().nth(1))
                    .and_then(|p| p.parse::<i32>().ok());
                // comm holds at most 15 bytes of the name.
                comm.is_some_and(|c| name.starts_with(c)) && ppid == Some(parent)
            })
        })
        .count()
}
