//! Quota exhaustion: one session fills the scratch space (inodes, then
//! bytes) so that another principal's session cannot write files.
//!
//! Attack: X's cell creates empty files until the filesystem refuses
//! (ENOSPC), then writes one file until it is refused again. Defence: Y's
//! session then creates 100 files and writes 1 MiB (Y's own result), and
//! the host sees X's home with no inode left and Y's home as another
//! filesystem.
//!
//! Control: `serve` has no switch that turns the per-session tmpfs off
//! (a home falls back to a plain directory on the shared scratch root only
//! when the mount fails). The control is that the attack exhausts what it
//! fills: X's own next cell, in the same session, cannot create a file,
//! and the host's `statvfs` of X's home shows 0 inodes free: any session
//! sharing X's filesystem would be refused the same way, and only the
//! separate filesystem (another `st_dev`) keeps Y out of it.

use super::harness::{python, session, Env, Serve};
use super::Outcome;
use std::os::unix::fs::MetadataExt;

const FILL: &str = r#"import os
n = 0
try:
    while True:
        open("f%d" % n, "w").close()
        n += 1
except OSError as e:
    err = e.errno
try:
    with open("big", "wb") as f:
        while True:
            f.write(b"x" * (1 << 20))
except OSError as e:
    pass
print("HOME", os.path.dirname(os.getcwd()), n, err)
"#;

const VICTIM: &str = r#"import os
for i in range(100):
    open("v%d" % i, "w").close()
with open("m", "wb") as f:
    f.write(b"y" * (1 << 20))
print("VICTIM-OK", len([n for n in os.listdir(".") if n.startswith("v")]), os.path.getsize("m"), os.path.dirname(os.getcwd()))
"#;

pub fn run(env: &Env) -> Result<Outcome, String> {
    let serve = Serve::start(
        env,
        &["x", "y"],
        &[
            "--language",
            "python",
            "--session-scratch-bytes",
            "8388608",
            "--session-scratch-inodes",
            "2048",
        ],
    )?;
    let x = serve.client(env, "x")?;
    let y = serve.client(env, "y")?;
    let (a, again, b) = env.block_on("attack", async {
        let sx = session(&x).await?;
        let sy = session(&y).await?;
        let a = python(&x, Some(&sx), FILL, 20).await;
        let b = python(&y, Some(&sy), VICTIM, 20).await;
        let again = python(&x, Some(&sx), "open('one-more', 'w').close()", 20).await;
        Ok::<_, String>((a, again, b))
    })??;
    let out = a.stdout();
    let words: Vec<&str> = out.split_whitespace().collect();
    let (x_home, made) = match words.as_slice() {
        ["HOME", home, n, _err] => (home.to_string(), n.parse::<u64>().unwrap_or(0)),
        _ => return Err(format!("X's fill did not report: {}", a.all_text())),
    };
    // Host-side: X's home is full, Y's is another filesystem.
    let st = nix::sys::statvfs::statvfs(x_home.as_str())
        .map_err(|e| format!("statvfs {x_home}: {e}"))?;
    let x_dev = std::fs::metadata(&x_home)
        .map_err(|e| format!("{x_home}: {e}"))?
        .dev();
    let again_refused = again.all_text().contains("No space left");
    if made < 1000
        || st.files_available() != 0
        || !again_refused
        || !x_home.contains("cellbox-home-")
    {
        return Err(format!(
            "X made {made} files, its home {x_home} has {} inodes free, X's next cell refused: \
             {again_refused}; the attack is broken ({})",
            st.files_available(),
            again.all_text()
        ));
    }
    let control = format!(
        "no switch turns per-session tmpfs off; X filled its home ({made} files, host statvfs: 0 \
         inodes free) and X's own next cell was refused (ENOSPC): a session sharing that \
         filesystem is refused"
    );
    let vout = b.stdout();
    let vw: Vec<&str> = vout.split_whitespace().collect();
    let blocked = match vw.as_slice() {
        ["VICTIM-OK", "100", "1048576", y_home] => std::fs::metadata(y_home)
            .map(|m| m.dev() != x_dev)
            .unwrap_or(false),
        _ => false,
    };
    Ok(Outcome {
        control,
        blocked,
        evidence: if blocked {
            "Y created 100 files and wrote 1 MiB in its session (its own result); Y's home is \
             another filesystem than X's (host st_dev)"
                .into()
        } else {
            format!("Y's cell: {}", b.all_text())
        },
    })
}
