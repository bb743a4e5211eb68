//! A fake upstream MCP server over stdio, for the tests of `kind = "mcp"`
//! tools (see tests/suite/common/fake_upstream.rs for its tools). With
//! `--banner`, it first writes a line that is not JSON on stdout; with
//! `--list MODE`, its tool list is an attack (see `OddList`).
#![allow(clippy::disallowed_macros)] // its `log` tool writes raw stderr on purpose

#[allow(dead_code)]
#[path = "../tests/suite/common/fake_upstream.rs"]
mod fake_upstream;

use rmcp::ServiceExt;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    if std::env::args().any(|a| a == "--banner") {
        use std::io::Write;
        let mut out = std::io::stdout().lock();
        out.write_all(b"fake upstream 0.0.1 starting\n")?;
        out.flush()?;
    }
    let args: Vec<String> = std::env::args().collect();
    let io = (tokio::io::stdin(), tokio::io::stdout());
    match args.iter().position(|a| a == "--list") {
        Some(i) => {
            let mode = match args.get(i + 1).map(String::as_str) {
                Some("many") => "many",
                Some("huge") => "huge",
                Some("deep") => "deep",
                _ => "endless",
            };
            fake_upstream::OddList(mode)
                .serve(io)
                .await?
                .waiting()
                .await?;
        }
        None => {
            fake_upstream::FakeUpstream
                .serve(io)
                .await?
                .waiting()
                .await?;
        }
    }
    Ok(())
}
