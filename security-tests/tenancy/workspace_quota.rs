//! Workspace quota: one principal fills the host's disk through
//! `write_file` (1 MiB at a time, as many as it is let), then through many
//! small files.
//!
//! Defence: each workspace holds at most `max_workspace_bytes` in files and
//! `max_workspace_files` entries: X's writes past them are refused (the
//! error names the setting), the host sees X's workspace within both, and
//! Y's own workspace still takes a 1 MiB write.
//!
//! Control: the same attack with quotas far above it: every write is
//! accepted (the host holds all of it).

use super::harness::{call, Client, Env, Serve};
use super::Outcome;
use serde_json::json;
use std::path::Path;

const WRITES: usize = 24;
const MIB: usize = 1 << 20;

fn config(dir: &Path, workspace: &Path, bytes: u64, files: u64) -> Result<String, String> {
    let conf = dir.join(format!("serve-{bytes}.toml"));
    std::fs::write(
        &conf,
        format!(
            "[files]\nworkspace = {:?}\nmax_write_bytes = {MIB}\nmax_workspace_bytes = {bytes}\n\
             max_workspace_files = {files}\n",
            workspace.display().to_string()
        ),
    )
    .map_err(|e| format!("config: {e}"))?;
    Ok(conf.display().to_string())
}

/// X's writes: 1 MiB files, then empty ones; how many of each were
/// accepted, and the text of the first refusal.
async fn fill(x: &Client) -> (usize, usize, String) {
    let big = "x".repeat(MIB);
    let (mut bytes_ok, mut files_ok, mut refusal) = (0, 0, String::new());
    for i in 0..WRITES {
        let a = call(
            x,
            "write_file",
            json!({"path": format!("big/{i}.bin"), "content": big}),
        )
        .await;
        if a.is_error {
            refusal = a.all_text();
        } else {
            bytes_ok += 1;
        }
    }
    for i in 0..WRITES {
        let a = call(
            x,
            "write_file",
            json!({"path": format!("small/{i}"), "content": ""}),
        )
        .await;
        if a.is_error {
            if refusal.is_empty() || !refusal.contains("max_workspace_files") {
                refusal.push_str(&a.all_text());
            }
        } else {
            files_ok += 1;
        }
    }
    (bytes_ok, files_ok, refusal)
}

/// Bytes of regular files and entries beneath `dir`, as the host sees them.
fn usage(dir: &Path) -> (u64, u64) {
    let (mut bytes, mut entries) = (0, 0);
    let mut stack = vec![dir.to_owned()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            entries += 1;
            if let Ok(m) = e.metadata() {
                if m.is_dir() {
                    stack.push(e.path());
                } else {
                    bytes += m.len();
                }
            }
        }
    }
    (bytes, entries)
}

pub fn run(env: &Env) -> Result<Outcome, String> {
    let dir = tempfile::tempdir().map_err(|e| format!("temp dir: {e}"))?;

    // Control: quotas far above the attack.
    let open = dir.path().join("open");
    std::fs::create_dir(&open).map_err(|e| format!("{e}"))?;
    let conf = config(dir.path(), &open, 1 << 30, 100_000)?;
    let serve = Serve::start(env, &["x", "y"], &["--language", "rhai", "--config", &conf])?;
    let x = serve.client(env, "x")?;
    let (bytes_ok, files_ok, refusal) = env.block_on("control", fill(&x))?;
    let (held, _) = usage(&open.join("x"));
    if bytes_ok != WRITES || files_ok != WRITES || held < (WRITES * MIB) as u64 {
        return Err(format!(
            "the control's writes were not all accepted ({bytes_ok} + {files_ok}, host: {held} \
             bytes): {refusal}"
        ));
    }
    let control = format!(
        "with quotas of 1 GiB and 100000 entries, X wrote all {WRITES} MiB and {WRITES} more \
         files (host: {held} bytes)"
    );
    drop((x, serve));

    // Defence: 4 MiB and 16 entries per workspace.
    let ws = dir.path().join("ws");
    std::fs::create_dir(&ws).map_err(|e| format!("{e}"))?;
    let conf = config(dir.path(), &ws, 4 * MIB as u64, 16)?;
    let serve = Serve::start(env, &["x", "y"], &["--language", "rhai", "--config", &conf])?;
    let x = serve.client(env, "x")?;
    let y = serve.client(env, "y")?;
    let ((bytes_ok, files_ok, refusal), y_write) = env.block_on("attack", async {
        let f = fill(&x).await;
        let y_write = call(
            &y,
            "write_file",
            json!({"path": "mine.bin", "content": "y".repeat(MIB)}),
        )
        .await;
        (f, y_write)
    })?;
    let (x_bytes, x_entries) = usage(&ws.join("x"));
    let (y_bytes, _) = usage(&ws.join("y"));
    let blocked = x_bytes <= 4 * MIB as u64
        && x_entries <= 16
        && bytes_ok < WRITES
        && files_ok < WRITES
        && refusal.contains("max_workspace_bytes")
        && refusal.contains("max_workspace_files")
        && !y_write.is_error
        && y_bytes == MIB as u64;
    Ok(Outcome {
        control,
        blocked,
        evidence: format!(
            "X had {bytes_ok} of {WRITES} 1 MiB writes and {files_ok} of {WRITES} small files \
             accepted; host: X's workspace holds {x_bytes} bytes in {x_entries} entries; Y wrote \
             {y_bytes} bytes in its own{}",
            if blocked {
                String::new()
            } else {
                format!("; refusals: {refusal}; Y: {}", y_write.all_text())
            }
        ),
    })
}
