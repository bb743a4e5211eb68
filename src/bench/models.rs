//! `cellbox bench`: what a `model_query` from a warm cell adds over the
//! supervisor's own HTTP request to the same local server.

use crate::models::{ModelClient, ModelConfig, ModelsSection, Query};
use crate::{Policy, Supervisor};
use bytes::Bytes;
use http_body_util::Full;
use std::time::Instant;

/// A chat-completions server on 127.0.0.1 that answers at once.
async fn local_server() -> Result<String, String> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| format!("failed to bind the bench server: {e}"))?;
    let port = listener.local_addr().map_err(|e| e.to_string())?.port();
    let body = Bytes::from_static(
        br#"{"choices":[{"message":{"role":"assistant","content":"ok"}}],"usage":{"prompt_tokens":1,"completion_tokens":1}}"#,
    );
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let body = body.clone();
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |_req| {
                    let body = body.clone();
                    async move {
                        Ok::<_, std::convert::Infallible>(hyper::Response::new(Full::new(body)))
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    Ok(format!("http://127.0.0.1:{port}/v1"))
}

/// The report line: per query, direct and through a cell, and the difference.
pub async fn round_trip(n: usize) -> Result<String, String> {
    let url = local_server().await?;
    let mut models = ModelsSection::new();
    models.insert(
        "bench".into(),
        ModelConfig {
            endpoint: url,
            model: "bench".into(),
            api_key_env: None,
            timeout_seconds: 10,
            max_attempts: 1,
            backoff_ms: 0,
            max_tokens: None,
            input_price: None,
            output_price: None,
            default: true,
        },
    );
    let client = ModelClient::new(&models).map_err(|e| e.to_string())?;
    let q = Query {
        messages: vec![serde_json::json!({"role": "user", "content": "x"})],
        ..Query::default()
    };
    // Warm the connection pool first.
    client.query(&q).await.map_err(|e| e.to_string())?;
    let t = Instant::now();
    for _ in 0..n {
        client.query(&q).await.map_err(|e| e.to_string())?;
    }
    let direct = t.elapsed() / n.max(1) as u32;
    let sup = Supervisor::builder()
        .warm(true)
        .models(client)
        .and_then(|b| b.build())
        .map_err(|e| e.to_string())?;
    let mut policy = Policy::deny_all().allow("model_query");
    policy.max_model_calls = u32::try_from(n + 1).unwrap_or(u32::MAX);
    policy.max_calls = policy.max_model_calls;
    let session = super::bench_session(&sup, policy)?;
    let run = |code: String| super::timed_session_cell(&session, code);
    run("model_query(\"x\")".into()).await?;
    let empty = run(format!("for i in 0..{n} {{ }}")).await?;
    let looped = run(format!("for i in 0..{n} {{ model_query(\"x\"); }}")).await?;
    let through = looped.saturating_sub(empty) / n.max(1) as u32;
    let added = through.as_secs_f64() - direct.as_secs_f64();
    Ok(format!(
        "model_query round trip (local server, {n} queries)  direct {:.3} ms  from a warm Rhai cell {:.3} ms  added {:.3} ms\n",
        direct.as_secs_f64() * 1000.0,
        through.as_secs_f64() * 1000.0,
        added * 1000.0
    ))
}
