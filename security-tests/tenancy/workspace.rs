//! Cross-principal workspace access: the host file tools (`read_file`,
//! `search_files`, `list_dir`, `write_file`, `edit_file`), as MCP tools of
//! `serve` and as capabilities in a cell, used by one principal on the
//! files another wrote in the shared `[files] workspace`.
//!
//! Attack: X writes a canary file in the workspace; Y then reads it,
//! searches for the canary, lists the directory, rewrites and edits the
//! file (as MCP tools and from a Python cell). Defence: every principal of
//! a named token file has a workspace of its own beneath `workspace`: Y's
//! answers never hold the canary, and the host sees X's file unchanged in
//! `WORKSPACE/x/` and Y's writes only in `WORKSPACE/y/`.
//!
//! Control: a server whose two clients share one principal (the defence
//! off for them: one workspace): the second client's `read_file` and
//! `search_files` return the canary, and its `write_file` replaces it.

use super::harness::{call, marker, python, Client, Env, Serve};
use super::Outcome;
use serde_json::json;
use std::path::Path;

fn config(dir: &Path, workspace: &Path) -> Result<String, String> {
    let conf = dir.join("serve.toml");
    std::fs::write(
        &conf,
        format!(
            "[files]\nworkspace = {:?}\n\n[policy]\nallow = [\"read_file\", \"search_files\", \
             \"list_dir\", \"write_file\", \"edit_file\"]\n",
            workspace.display().to_string()
        ),
    )
    .map_err(|e| format!("config: {e}"))?;
    Ok(conf.display().to_string())
}

/// Y's attempts on X's file `plans.txt`; everything Y was answered. The
/// searches name the canary by a pattern that does not spell it (an answer
/// echoes its pattern).
async fn attempts(y: &Client) -> String {
    let pattern = "WSCANARY[0-9a-f]+";
    let mut seen = Vec::new();
    for (tool, args) in [
        ("read_file", json!({"path": "plans.txt"})),
        ("search_files", json!({"pattern": pattern})),
        ("list_dir", json!({"path": "."})),
        (
            "edit_file",
            json!({"path": "plans.txt", "old_text": "WSCANARY", "new_text": "EDITED-BY-Y"}),
        ),
    ] {
        seen.push(format!("{tool}: {}", call(y, tool, args).await.all_text()));
    }
    let cell = format!(
        "r = []\nfor f in (lambda: read_file('plans.txt'), lambda: search_files({pattern:?})):\n    \
         try:\n        r.append(str(f()))\n    except Exception as e:\n        r.append(repr(e))\n\
         print(r)\n"
    );
    seen.push(format!(
        "cell: {}",
        python(y, None, &cell, 30).await.all_text()
    ));
    seen.push(format!(
        "write_file: {}",
        call(
            y,
            "write_file",
            json!({"path": "plans.txt", "content": "WRITTEN-BY-Y"})
        )
        .await
        .all_text()
    ));
    seen.join("\n")
}

pub fn run(env: &Env) -> Result<Outcome, String> {
    let dir = tempfile::tempdir().map_err(|e| format!("temp dir: {e}"))?;
    let canary = marker("WSCANARY");

    // Control: one principal for both clients, so one workspace.
    let shared = dir.path().join("shared");
    std::fs::create_dir(&shared).map_err(|e| format!("{e}"))?;
    let conf = config(dir.path(), &shared)?;
    let serve = Serve::start(
        env,
        &["default"],
        &["--language", "python", "--config", &conf],
    )?;
    let x = serve.client(env, "default")?;
    let y = serve.client(env, "default")?;
    let control_seen = env.block_on("control", async {
        let w = call(
            &x,
            "write_file",
            json!({"path": "plans.txt", "content": canary}),
        )
        .await;
        if w.is_error {
            return Err(format!("X could not write: {}", w.all_text()));
        }
        Ok(attempts(&y).await)
    })??;
    let on_host = std::fs::read_to_string(shared.join("plans.txt")).unwrap_or_default();
    if !control_seen.contains(&canary) || on_host != "WRITTEN-BY-Y" {
        return Err(format!(
            "the control did not reach the shared file (host: {on_host:?}): {control_seen}"
        ));
    }
    let control = "with one principal for both clients, the second read and searched the \
                   first's canary and rewrote its file (host: WORKSPACE/plans.txt)"
        .to_owned();
    drop((x, y, serve));

    // Defence: two principals, one workspace directory each.
    let ws = dir.path().join("ws");
    std::fs::create_dir(&ws).map_err(|e| format!("{e}"))?;
    let conf = config(dir.path(), &ws)?;
    let serve = Serve::start(
        env,
        &["x", "y"],
        &["--language", "python", "--config", &conf],
    )?;
    let x = serve.client(env, "x")?;
    let y = serve.client(env, "y")?;
    let seen = env.block_on("attack", async {
        let w = call(
            &x,
            "write_file",
            json!({"path": "plans.txt", "content": canary}),
        )
        .await;
        if w.is_error {
            return Err(format!("X could not write: {}", w.all_text()));
        }
        let seen = attempts(&y).await;
        // X still reads its own file through the tools.
        let again = call(&x, "read_file", json!({"path": "plans.txt"})).await;
        Ok((seen, again.all_text()))
    })??;
    let (seen, x_again) = seen;
    let x_file = std::fs::read_to_string(ws.join("x/plans.txt")).unwrap_or_default();
    let y_file = std::fs::read_to_string(ws.join("y/plans.txt")).unwrap_or_default();
    let top = ws.join("plans.txt").exists();
    let blocked = !seen.contains(&canary)
        && x_file == canary
        && y_file == "WRITTEN-BY-Y"
        && !top
        && x_again.contains(&canary);
    Ok(Outcome {
        control,
        blocked,
        evidence: if blocked {
            "Y's read, search, list, edit and cell never saw X's canary; the host shows X's \
             file unchanged in WORKSPACE/x/ and Y's write in WORKSPACE/y/"
                .into()
        } else {
            format!(
                "host: x/plans.txt {x_file:?}, y/plans.txt {y_file:?}, top-level file {top}; \
                 X reads {x_again}; Y saw: {seen}"
            )
        },
    })
}
