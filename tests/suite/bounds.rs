//! What a tenant can make the supervisor hold or do is bounded: the replies
//! of a `model_query_batched` are capped as they arrive (each, and the
//! batch's together), so a batch of large replies leaves `serve`'s memory
//! where it was, and the call fails naming the bound; an
//! `aggregate_context` a cell started stops with its cell.

use super::common::fake_model::{FakeModel, Reply};
use super::common::{bin, config};
use cellbox::{CellRequest, Language, Status, Supervisor};
use rmcp::model::CallToolRequestParams;
use rmcp::transport::TokioChildProcess;
use rmcp::ServiceExt;
use serde_json::json;

/// The most `serve`'s resident memory may reach in the batch below: the
/// batch's replies may hold 16 MiB together, each 4 MiB; the rest is the
/// server itself. Before the bounds, 24 replies of this size took the
/// supervisor from 19 MB to 930 MB.
const PEAK_BOUND_BYTES: u64 = 256 << 20;

/// Bytes of each reply's text: just within the bound of one reply.
const REPLY_BYTES: usize = (4 << 20) - 4096;

/// `VmHWM` (the peak resident memory) of process `pid`, in bytes.
fn peak_rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map(|kb| kb * 1024)
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_of_large_replies_is_capped_as_it_arrives() {
    let text = "y".repeat(REPLY_BYTES);
    let body = json!({"choices": [{"message": {"role": "assistant", "content": text}}],
                      "usage": {"prompt_tokens": 1, "completion_tokens": 1}})
    .to_string();
    let fake = FakeModel::start(vec![]);
    fake.otherwise(Reply::Raw(body));
    let dir = tempfile::tempdir().unwrap();
    let conf = dir.path().join("serve.toml");
    std::fs::write(
        &conf,
        format!(
            "[policy]\nallow = [\"model_query_batched\"]\n\
             [models.local]\nendpoint = \"{}\"\nmodel = \"m\"\n",
            fake.url
        ),
    )
    .unwrap();
    let mut cmd = tokio::process::Command::new(bin());
    cmd.arg("serve")
        .args(["--config", conf.to_str().unwrap(), "--language", "python"]);
    let transport = TokioChildProcess::new(cmd).unwrap();
    let pid = transport.id().unwrap();
    let client = ().serve(transport).await.unwrap();
    let before = peak_rss(pid);
    let args = json!({"language": "python",
                      "code": "rs = llm_query_batched(['x'] * 24)\nprint(len(rs))",
                      "timeout_seconds": 120});
    let r = client
        .call_tool(
            CallToolRequestParams::new("execute_code")
                .with_arguments(args.as_object().cloned().unwrap()),
        )
        .await
        .unwrap();
    let peak = peak_rss(pid);
    let s = r.structured_content.unwrap_or_default();
    // The endpoint was asked (the attack was delivered), each reply was
    // within the bound of one, and the batch failed at the bound of all.
    assert!(fake.seen().len() >= 5, "{} queries sent", fake.seen().len());
    let text = s.to_string();
    assert!(
        text.contains("the replies of one batch passed 16777216 bytes together"),
        "{text}"
    );
    assert!(
        peak < PEAK_BOUND_BYTES,
        "serve's peak memory went from {before} to {peak} bytes"
    );
    client.cancel().await.unwrap();
}

/// Wait (at most a minute) until `aggregate_context` runs `n` times at once.
async fn until_aggregations(n: usize) {
    let t0 = std::time::Instant::now();
    while cellbox::context::running() != n {
        assert!(
            t0.elapsed() < std::time::Duration::from_secs(60),
            "{} aggregations run, not {n}",
            cellbox::context::running()
        );
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_aggregation_stops_when_its_cell_is_cancelled() {
    let sup = Supervisor::builder()
        .worker_exe(bin())
        .capability(cellbox::context::capability().unwrap())
        .unwrap()
        .build()
        .unwrap();
    // About 6 MiB of distinct text in one call (a frame holds 8 MiB): work
    // of seconds on its blocking thread.
    let code = "line = 'the quick brown fox jumps over the lazy dog again\\n' * 64\n\
                texts = ['%d\\n' % i + line for i in range(1700)]\n\
                r = aggregate_context(texts, 'fox', 10000000)\n\
                print(r['tokens'])";
    let request =
        || CellRequest::new(Language::Python, code).timeout(std::time::Duration::from_secs(300));
    // Control: left alone, the cell gets its answer and nothing is stopped.
    let before = cellbox::context::stopped();
    let r = sup.run(request(), config(&["aggregate_context"])).await;
    assert_eq!(r.status, Status::Ok, "{r:?}");
    assert!(r.stdout.trim().parse::<u64>().unwrap() > 500_000, "{r:?}");
    assert_eq!(cellbox::context::stopped(), before);
    // Cancelled while the aggregation runs: the cell ends, and so does the
    // work on the blocking thread, before its end.
    let cancel = tokio_util::sync::CancellationToken::new();
    let mut req = request();
    req.cancel = Some(cancel.clone());
    let cell = tokio::spawn({
        let sup = sup.clone();
        async move { sup.run(req, config(&["aggregate_context"])).await }
    });
    until_aggregations(1).await;
    cancel.cancel();
    let r = cell.await.unwrap();
    assert_eq!(r.status, Status::Killed, "{r:?}");
    until_aggregations(0).await;
    assert_eq!(
        cellbox::context::stopped(),
        before + 1,
        "the aggregation went on after its cell was cancelled"
    );
}
