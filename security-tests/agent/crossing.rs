//! Crossing between tenants through what the server holds for them: an
//! upstream MCP server reached over HTTP, and a session's working
//! directory.
//!
//! `upstream_http`: X stores a canary in a stateful HTTP upstream (the
//! fake one keeps `store`d text per MCP session) and Y calls `read`.
//! Control: the upstream declared `shared = true` (one MCP session for
//! every principal): Y reads X's canary. Defence: the default, an MCP
//! session per principal: Y reads nothing of X's, while X reads its own
//! canary back.
//!
//! `session_paths`: X's cell plants symlinks in its session's working
//! directory (to a host file holding a canary, to the supervisor's own
//! `/proc/PID/environ`, which holds the model key, to `..`, and to a host
//! directory), then X asks the session file tools to read, list and
//! write through them, and through `..`, absolute, doubled-slash and
//! full-width-dot paths; X also names Y's session (its id handed to X)
//! and a path of its own with Y's id. Control: the same host file is
//! read whole by a plain `cat` on the host, the supervisor's environ holds
//! the key, and Y downloads its own canary by the same session id and
//! path. Defence: none of X's answers holds the host canary, the key
//! (beyond what `harness::tenant_leak` allows) or Y's canary, and nothing
//! was written in the host directory.

use super::harness::{marker, AgentServe, HttpUpstream};
use super::Env;
use crate::tenancy::harness::{call, python, session, Client, Serve};
use crate::tenancy::Outcome;
use serde_json::json;

fn upstream_config(dir: &std::path::Path, url: &str, shared: bool) -> Result<String, String> {
    let conf = dir.join(format!("up-{shared}.toml"));
    std::fs::write(
        &conf,
        format!(
            "[server]\nlanguages = [\"python\"]\n[tools.up]\nkind = \"mcp\"\nurl = {url:?}\n\
             shared = {shared}\n[policy]\nallow = [\"up.*\"]\n"
        ),
    )
    .map_err(|e| format!("config: {e}"))?;
    Ok(conf.display().to_string())
}

/// (what X read back, what Y read) after X stored `canary`.
async fn store_and_read(x: &Client, y: &Client, canary: &str) -> Result<(String, String), String> {
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
    let read = "print(tools.up.read())";
    let mine = python(x, None, read, 30).await;
    let theirs = python(y, None, read, 30).await;
    if theirs.status() != "ok" {
        return Err(format!("Y could not read: {}", theirs.all_text()));
    }
    Ok((mine.stdout(), theirs.stdout()))
}

pub fn upstream_http(env: &Env) -> Result<Outcome, String> {
    let up = HttpUpstream::start()?;
    let dir = tempfile::tempdir().map_err(|e| format!("temp dir: {e}"))?;
    let canary = marker("UPCANARY");
    // Control: one MCP session for both principals.
    let conf = upstream_config(dir.path(), &up.url, true)?;
    let serve = Serve::start(env, &["x", "y"], &["--config", &conf])?;
    let (x, y) = (serve.client(env, "x")?, serve.client(env, "y")?);
    let (_, theirs) = env.block_on("control", store_and_read(&x, &y, &canary))??;
    if !theirs.contains(&canary) {
        return Err(format!(
            "with shared = true Y did not read X's canary ({theirs}): the attack is broken"
        ));
    }
    drop((x, y, serve));
    let canary = marker("UPCANARY");
    let conf = upstream_config(dir.path(), &up.url, false)?;
    let serve = Serve::start(env, &["x", "y"], &["--config", &conf])?;
    let (x, y) = (serve.client(env, "x")?, serve.client(env, "y")?);
    let (mine, theirs) = env.block_on("attack", store_and_read(&x, &y, &canary))??;
    Ok(Outcome {
        control: "with shared = true, Y's read of the HTTP upstream returned X's canary".into(),
        blocked: mine.contains(&canary) && !theirs.contains(&canary),
        evidence: format!(
            "with an MCP session per principal X read back {}, Y read {:?}",
            if mine.contains(&canary) {
                "its canary"
            } else {
                "nothing of its own"
            },
            theirs.trim()
        ),
    })
}

/// Every way X reaches, and what it was answered.
async fn reach(x: &Client, xs: &str, ys: &str, hostdir: &str) -> String {
    let mut seen = Vec::new();
    for path in [
        "host",
        "environ",
        "up/up/etc/hostname",
        "../secret.txt",
        "/etc/hostname",
        "dir/pwn.txt",
        ".//../secret.txt",
        "\u{ff0e}\u{ff0e}/secret.txt",
        "up",
    ] {
        seen.push(
            call(x, "download_file", json!({"session_id": xs, "path": path}))
                .await
                .all_text(),
        );
    }
    for path in ["up", "dir", "..", "/"] {
        seen.push(
            call(x, "list_files", json!({"session_id": xs, "path": path}))
                .await
                .all_text(),
        );
    }
    for path in [
        "dir/pwn.txt",
        "up/pwn.txt",
        "../pwn.txt",
        &format!("{hostdir}/pwn.txt"),
    ] {
        seen.push(
            call(
                x,
                "upload_file",
                json!({"session_id": xs, "path": path, "content": "PWNED"}),
            )
            .await
            .all_text(),
        );
    }
    // Y's session by its id, and Y's id as a path.
    seen.push(
        call(
            x,
            "download_file",
            json!({"session_id": ys, "path": "secret.txt"}),
        )
        .await
        .all_text(),
    );
    seen.push(
        call(x, "list_files", json!({"session_id": ys}))
            .await
            .all_text(),
    );
    seen.push(
        call(
            x,
            "download_file",
            json!({"session_id": xs, "path": format!("../{ys}/secret.txt")}),
        )
        .await
        .all_text(),
    );
    seen.push(
        python(x, Some(ys), "print(open('secret.txt').read())", 30)
            .await
            .all_text(),
    );
    seen.join("\n")
}

pub fn session_paths(env: &Env) -> Result<Outcome, String> {
    let dir = tempfile::tempdir().map_err(|e| format!("temp dir: {e}"))?;
    let host_canary = marker("HOSTCANARY");
    let host_file = dir.path().join("host-secret.txt");
    std::fs::write(&host_file, &host_canary).map_err(|e| e.to_string())?;
    let hostdir = dir.path().join("drop");
    std::fs::create_dir(&hostdir).map_err(|e| e.to_string())?;
    // Readable and writable by anyone: only the server's rules stand in
    // the way.
    for p in [dir.path(), hostdir.as_path(), host_file.as_path()] {
        use std::os::unix::fs::PermissionsExt;
        let mode = if p.is_dir() { 0o777 } else { 0o666 };
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode))
            .map_err(|e| e.to_string())?;
    }
    let key = format!("sk-{}{}", marker(""), marker(""));
    let (tx, ty) = (marker("tok-x-"), marker("tok-y-"));
    let tokens = dir.path().join("tokens");
    std::fs::write(&tokens, format!("x {tx}\ny {ty}\n")).map_err(|e| e.to_string())?;
    let config = format!(
        "[server]\nlanguages = [\"python\"]\n[http]\ntoken_file = {:?}\n[models.m]\n\
         endpoint = \"http://127.0.0.1:9/v1\"\nmodel = \"x\"\napi_key_env = \"CB_MODEL_KEY\"\n",
        tokens.display().to_string()
    );
    let serve = AgentServe::start(env, &config, &[("CB_MODEL_KEY", &key)])?;
    let environ = std::fs::read_to_string(format!("/proc/{}/environ", serve.pid()))
        .map_err(|e| format!("the supervisor's environ: {e}"))?;
    let host_read = std::fs::read_to_string(&host_file).unwrap_or_default();
    if !environ.contains(&key) || host_read != host_canary {
        return Err(
            "the control failed: the key is not in the supervisor's environment, or \
                    the host file does not hold its canary"
                .into(),
        );
    }
    let (x, y) = (serve.client_as(env, &tx)?, serve.client_as(env, &ty)?);
    let y_canary = marker("YCANARY");
    let pid = serve.pid();
    let (seen, y_own) = env.block_on("attack", async {
        let xs = session(&x).await?;
        let ys = session(&y).await?;
        let up = call(
            &y,
            "upload_file",
            json!({"session_id": ys, "path": "secret.txt", "content": y_canary}),
        )
        .await;
        if up.is_error {
            return Err(format!("Y could not upload: {}", up.all_text()));
        }
        let plant = format!(
            "import os\n\
             for target, name in [({host:?}, 'host'), ('/proc/{pid}/environ', 'environ'), \
             ('..', 'up'), ({hostdir:?}, 'dir'), ('../{ys}', 'ys')]:\n    \
                 try:\n        os.symlink(target, name)\n    except Exception as e:\n        \
                 print('symlink', name, e)\n\
             print(sorted(os.listdir('.')))\n",
            host = host_file.display().to_string(),
            hostdir = hostdir.display().to_string(),
        );
        let planted = python(&x, Some(&xs), &plant, 30).await;
        if !planted.stdout().contains("'host'") {
            return Err(format!(
                "X could not plant its symlinks: {}",
                planted.all_text()
            ));
        }
        let seen = reach(&x, &xs, &ys, &hostdir.display().to_string()).await;
        let own = call(
            &y,
            "download_file",
            json!({"session_id": ys, "path": "secret.txt"}),
        )
        .await
        .all_text();
        Ok((seen, own))
    })??;
    if !y_own.contains(&y_canary) {
        return Err(format!("Y could not download its own file: {y_own}"));
    }
    let mut problems = Vec::new();
    if seen.contains(&host_canary) {
        problems.push("X read the host file through a symlink".to_owned());
    }
    for leak in serve.leaks(&seen, std::slice::from_ref(&key)) {
        problems.push(format!("the key: {leak}"));
    }
    if seen.contains(&y_canary) {
        problems.push("X read Y's file".to_owned());
    }
    let dropped: Vec<_> = std::fs::read_dir(&hostdir)
        .map_err(|e| e.to_string())?
        .flatten()
        .map(|e| e.file_name())
        .collect();
    if !dropped.is_empty() || dir.path().join("pwn.txt").exists() {
        problems.push(format!("X wrote on the host: {dropped:?}"));
    }
    Ok(Outcome {
        control: "the host file holds its canary (read by the host), the supervisor's environ \
                  holds the model key, Y downloaded its own canary by its session id and path, \
                  and X's cell planted its symlinks"
            .into(),
        blocked: problems.is_empty(),
        evidence: if problems.is_empty() {
            "X's downloads, lists and uploads through symlinks to a host file, the \
             supervisor's environ, '..' and a host directory, and through .., absolute and \
             full-width paths and Y's session id, returned nothing of the host's, the key's or \
             Y's, and wrote nothing on the host"
                .into()
        } else {
            format!("{}; X saw: {seen}", problems.join("; "))
        },
    })
}
