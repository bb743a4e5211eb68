//! A fake upstream MCP server over stdio, for the tests of `kind = "mcp"`
//! tools (see tests/suite/common/fake_upstream.rs for its tools).

#[allow(dead_code)]
#[path = "../tests/suite/common/fake_upstream.rs"]
mod fake_upstream;

use rmcp::ServiceExt;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let service = fake_upstream::FakeUpstream
        .serve((tokio::io::stdin(), tokio::io::stdout()))
        .await?;
    service.waiting().await?;
    Ok(())
}
