//! A fake upstream MCP server over stdio, for the tests of `kind = "mcp"`
//! tools (see tests/suite/common/fake_upstream.rs for its tools). With
//! `--banner`, it first writes a line that is not JSON on stdout.

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
    let service = fake_upstream::FakeUpstream
        .serve((tokio::io::stdin(), tokio::io::stdout()))
        .await?;
    service.waiting().await?;
    Ok(())
}
