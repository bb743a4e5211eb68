//! Principal names crafted to escape or collide. A principal's name is the
//! one string of a tenant's that becomes a host path (its directory
//! beneath the workspace) and reaches the log, the events and every
//! refusal that names it.
//!
//! Attack, first: token files (and `[principals.NAME]` tables) whose names
//! would climb out of the workspace (`..`, `../x`, `a/b`), hide in it
//! (`.`), carry a terminal escape or a newline into the log, look like
//! another name (`%2e%2e`, full-width letters) or run long. Then names the
//! grammar allows that look dangerous (`...`, `-x`, `x.`, and `X` beside
//! `x`): each writes a canary through the file tools and reaches for the
//! others' with `..`, absolute host paths and the other's directory name.
//!
//! Control: the same token file with a plain name in place of the hostile
//! one starts and serves; with one principal for two clients, the second
//! reads the first's canary through the same paths' plain form (the
//! reaching would show).
//! Defence: every hostile name is refused at start, naming the line and
//! never printing a token or the escape raw; each allowed name gets a
//! directory of its own exactly at `WORKSPACE/<name>` (the host sees every
//! canary there, nothing elsewhere), and no principal's answers hold
//! another's canary.

use super::Env;
use crate::tenancy::harness::{call, marker, Client, Serve};
use crate::tenancy::Outcome;
use serde_json::json;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::time::{Duration, Instant};

/// How a server given `token_file` (and `config`) ended: `Ok(log)` when it
/// refused to start, `Err(log)` when it started serving.
fn start_outcome(env: &Env, token_file: &Path, config: Option<&Path>) -> Result<String, String> {
    let mut cmd = std::process::Command::new(&env.cellbox);
    cmd.args(["serve", "--http", "127.0.0.1:0", "--language", "python"])
        .arg("--token-file")
        .arg(token_file);
    if let Some(c) = config {
        cmd.arg("--config").arg(c);
    }
    let mut child = cmd
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| format!("failed to start serve: {e}"))?;
    let stderr = child.stderr.take();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let Some(stderr) = stderr else { return };
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { return };
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    let t0 = Instant::now();
    let mut log = Vec::new();
    loop {
        while let Ok(l) = rx.try_recv() {
            log.push(l);
        }
        if log.iter().any(|l| l.contains("at http://")) {
            let _ = child.kill();
            let _ = child.wait();
            return Err(log.join("\n"));
        }
        if let Ok(Some(_)) = child.try_wait() {
            std::thread::sleep(Duration::from_millis(50));
            while let Ok(l) = rx.try_recv() {
                log.push(l);
            }
            return Ok(log.join("\n"));
        }
        if t0.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!("neither served nor exited: {}", log.join("\n")));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Names a token file or a `[principals]` table must refuse.
const HOSTILE: &[&str] = &[
    "..",
    ".",
    "../x",
    "a/b",
    "/abs",
    "x\u{1b}[2J\u{1b}]52;c;SGVsbG8=\u{7}",
    "x\u{202e}y",
    "%2e%2e",
    "\u{ff58}",
    "x\u{0}y",
    "x\\..\\y",
];

fn refusals(env: &Env, dir: &Path) -> Result<(Vec<String>, String), String> {
    let token = format!("tok-{}", marker(""));
    let other = format!("tok-{}", marker(""));
    let file = dir.join("tokens");
    // Control: a plain name in the same place starts and serves.
    std::fs::write(&file, format!("plain {token}\nother {other}\n")).map_err(|e| e.to_string())?;
    if let Ok(log) = start_outcome(env, &file, None) {
        return Err(format!("a plain token file did not start: {log}"));
    }
    let mut problems = Vec::new();
    let mut shown = 0;
    let long = "n".repeat(65);
    for name in HOSTILE.iter().copied().chain([long.as_str()]) {
        std::fs::write(&file, format!("{name} {token}\nother {other}\n"))
            .map_err(|e| e.to_string())?;
        match start_outcome(env, &file, None) {
            Err(log) => problems.push(format!("{name:?} in a token file started a server: {log}")),
            Ok(log) => {
                if log.contains(&token) || log.contains(&other) {
                    problems.push(format!("refusing {name:?} printed a token: {log}"));
                }
                if log.contains('\u{1b}') || log.contains('\u{202e}') {
                    problems.push(format!("refusing {name:?} printed it raw: {log:?}"));
                }
                if log.contains("line 1") {
                    shown += 1;
                }
            }
        }
        // The same name as a `[principals.NAME]` table.
        let conf = dir.join("named.toml");
        let key = serde_json::to_string(name).map_err(|e| e.to_string())?;
        std::fs::write(&conf, format!("[principals.{key}]\nmax_tool_calls = 1\n"))
            .map_err(|e| e.to_string())?;
        std::fs::write(&file, format!("plain {token}\n")).map_err(|e| e.to_string())?;
        match start_outcome(env, &file, Some(&conf)) {
            Err(log) => problems.push(format!("[principals.{key}] started a server: {log}")),
            Ok(log) if log.contains('\u{1b}') || log.contains('\u{202e}') => problems.push(
                format!("refusing [principals.{key}] printed it raw: {log:?}"),
            ),
            Ok(_) => {}
        }
    }
    Ok((
        problems,
        format!(
            "{} hostile names refused in a token file ({shown} naming the line) and as \
             [principals.NAME] tables",
            HOSTILE.len() + 1
        ),
    ))
}

/// Allowed names that look dangerous, and `X` beside `x`.
const ODD: &[&str] = &["x", "X", "...", "-x", "x."];

/// What `p` gets when reaching for the canary file `c.txt` of every other
/// name, through `..`, the host path and the plain name.
async fn reach(p: &Client, ws: &Path, me: &str) -> String {
    let mut seen = Vec::new();
    for other in ODD.iter().filter(|o| **o != me) {
        for path in [
            format!("../{other}/c.txt"),
            format!("{other}/c.txt"),
            format!("./../{other}/./c.txt"),
            format!("{}/{other}/c.txt", ws.display()),
            format!("..//{other}//c.txt"),
        ] {
            seen.push(
                call(p, "read_file", json!({ "path": path }))
                    .await
                    .all_text(),
            );
        }
        seen.push(
            call(p, "list_dir", json!({"path": format!("../{other}")}))
                .await
                .all_text(),
        );
    }
    seen.push(
        call(
            p,
            "search_files",
            json!({"pattern": "NAMECANARY[0-9a-f]+", "path": ".."}),
        )
        .await
        .all_text(),
    );
    seen.join("\n")
}

fn workspace_config(dir: &Path, ws: &Path) -> Result<String, String> {
    let conf = dir.join("ws.toml");
    std::fs::write(
        &conf,
        format!(
            "[files]\nworkspace = {:?}\n\n[policy]\nallow = [\"read_file\", \"search_files\", \
             \"list_dir\", \"write_file\"]\n",
            ws.display().to_string()
        ),
    )
    .map_err(|e| format!("config: {e}"))?;
    Ok(conf.display().to_string())
}

pub fn run(env: &Env) -> Result<Outcome, String> {
    let dir = tempfile::tempdir().map_err(|e| format!("temp dir: {e}"))?;
    let (mut problems, refused) = refusals(env, dir.path())?;

    // Control: one principal for two clients reaches the other's file by
    // its plain name.
    let shared = dir.path().join("shared");
    std::fs::create_dir(&shared).map_err(|e| e.to_string())?;
    let conf = workspace_config(dir.path(), &shared)?;
    let serve = Serve::start(
        env,
        &["default"],
        &["--language", "python", "--config", &conf],
    )?;
    let (a, b) = (serve.client(env, "default")?, serve.client(env, "default")?);
    let canary = marker("NAMECANARY");
    let control_seen = env.block_on("control", async {
        call(
            &a,
            "write_file",
            json!({"path": "x/c.txt", "content": canary}),
        )
        .await;
        call(&b, "read_file", json!({"path": "x/c.txt"}))
            .await
            .all_text()
    })?;
    if !control_seen.contains(&canary) {
        return Err(format!("the control read nothing back: {control_seen}"));
    }
    drop((a, b, serve));

    let ws = dir.path().join("ws");
    std::fs::create_dir(&ws).map_err(|e| e.to_string())?;
    let conf = workspace_config(dir.path(), &ws)?;
    let serve = Serve::start(env, ODD, &["--language", "python", "--config", &conf])?;
    let mut clients = Vec::new();
    for name in ODD {
        clients.push((*name, serve.client(env, name)?, marker("NAMECANARY")));
    }
    let answers = env.block_on("attack", async {
        for (_, c, mine) in &clients {
            let w = call(c, "write_file", json!({"path": "c.txt", "content": mine})).await;
            if w.is_error {
                return Err(format!("a write failed: {}", w.all_text()));
            }
        }
        let mut out = Vec::new();
        for (name, c, _) in &clients {
            out.push((*name, reach(c, &ws, name).await));
        }
        Ok(out)
    })??;
    for (name, seen) in &answers {
        for (other, _, theirs) in &clients {
            if other != name && seen.contains(theirs.as_str()) {
                problems.push(format!("{name:?} read {other:?}'s canary"));
            }
        }
    }
    // The host's view: each canary exactly at WORKSPACE/<name>/c.txt, and
    // no other c.txt anywhere in the temp dir.
    for (name, _, mine) in &clients {
        let at = ws.join(name).join("c.txt");
        if std::fs::read_to_string(&at).ok().as_deref() != Some(mine.as_str()) {
            problems.push(format!("{} does not hold {name:?}'s canary", at.display()));
        }
    }
    let mut found = Vec::new();
    let mut stack = vec![dir.path().to_owned()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() && !p.is_symlink() {
                stack.push(p);
            } else if e.file_name() == "c.txt" {
                found.push(p);
            }
        }
    }
    let expected = ODD.len() + 1;
    if found.len() != expected {
        problems.push(format!(
            "{} files c.txt on the host, not {expected}: {found:?}",
            found.len()
        ));
    }
    Ok(Outcome {
        control: "a plain name in the same token file started and served; two clients of one \
                  principal read each other's canary by its path"
            .into(),
        blocked: problems.is_empty(),
        evidence: if problems.is_empty() {
            format!(
                "{refused}, without printing a token or an escape; {} allowed odd names \
                 ({}) each wrote only to WORKSPACE/<name>/ and read none of the others' \
                 canaries through .., host paths or names",
                ODD.len(),
                ODD.join(" ")
            )
        } else {
            problems.join("; ")
        },
    })
}
