//! The Python package (`clients/python`) against the binaries under test,
//! in the venv `tests/clients/install.sh` makes the way a user would
//! (`pip install ./clients/python rlms smolagents`): the package's pytest
//! suite (sync and async clients, sessions, files, typed errors, HTTP with
//! a token; the rlms environment and the smolagents executor against the
//! real libraries), rlms' own environment tests run against the cellbox
//! environment, and the package README's examples as written. A missing
//! venv, a failing test, a skipped test or a run that ran nothing fails.

use super::clients::installed;
use super::common::bin;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const DEADLINE: Duration = Duration::from_secs(900);

fn package_dir() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("clients/python")
}

/// Run `python args...` of the venv `venv` (under the clients directory)
/// in `dir` with `cellbox` on PATH and in `CELLBOX_BIN`, and `env` set; its
/// output, once it exited 0.
fn venv_python_of(
    venv: &str,
    args: &[&str],
    dir: &Path,
    what: &str,
    env: &[(&str, &Path)],
) -> String {
    let python = installed(&format!("{venv}/bin/python"));
    let cellbox = bin();
    let bin_dir = cellbox.parent().unwrap().to_path_buf();
    let mut path = std::ffi::OsString::from(bin_dir);
    if let Some(p) = std::env::var_os("PATH") {
        path.push(":");
        path.push(p);
    }
    let mut child = Command::new(&python)
        .args(args)
        .current_dir(dir)
        .env("CELLBOX_BIN", &cellbox)
        .env("PATH", path)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .envs(env.iter().map(|(k, v)| (*k, *v)))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("failed to start {what}: {e}"));
    let out = child.stdout.take().unwrap();
    let err = child.stderr.take().unwrap();
    let out = std::thread::spawn(move || std::io::read_to_string(out).unwrap_or_default());
    let err = std::thread::spawn(move || std::io::read_to_string(err).unwrap_or_default());
    let t0 = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break Some(s);
        }
        if t0.elapsed() > DEADLINE {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let (out, err) = (out.join().unwrap(), err.join().unwrap());
    eprintln!("--- {what}: stdout ---\n{out}--- {what}: stderr ---\n{err}");
    let status = status.unwrap_or_else(|| panic!("{what} ran past {DEADLINE:?}"));
    assert!(
        status.success(),
        "{what} failed ({status}); its output is above"
    );
    out
}

/// pytest's summary must count passed tests and nothing skipped.
fn pytest(args: &[&str], dir: &Path, what: &str, env: &[(&str, &Path)]) -> String {
    pytest_in("pyclient", args, dir, what, env)
}

fn pytest_in(venv: &str, args: &[&str], dir: &Path, what: &str, env: &[(&str, &Path)]) -> String {
    let mut all = vec!["-m", "pytest", "-p", "no:cacheprovider", "-q", "-rs"];
    all.extend_from_slice(args);
    let out = venv_python_of(venv, &all, dir, what, env);
    let summary = out
        .lines()
        .rev()
        .find(|l| l.contains(" passed"))
        .unwrap_or_else(|| panic!("{what}: no pytest summary in its output"));
    let passed: u32 = summary
        .split_whitespace()
        .zip(summary.split_whitespace().skip(1))
        .find(|(_, w)| w.starts_with("passed"))
        .and_then(|(n, _)| n.trim_matches('=').trim().parse().ok())
        .unwrap_or(0);
    assert!(passed > 0, "{what}: no test passed: {summary}");
    for bad in ["skipped", "xfail", "error", "failed", "deselected"] {
        assert!(!summary.contains(bad), "{what}: {summary}");
    }
    out
}

#[test]
fn python_package_client_suite() {
    pytest(
        &["tests/test_sandbox.py", "tests/test_async.py"],
        &package_dir(),
        "clients/python client tests",
        &[],
    );
}

/// The same client tests with the official SDK 1.x (the client-matrix venv).
#[test]
fn python_package_client_suite_on_mcp_sdk_1x() {
    pytest_in(
        "py1",
        &["tests/test_sandbox.py", "tests/test_async.py"],
        &package_dir(),
        "clients/python client tests, MCP SDK 1.x",
        &[],
    );
}

#[test]
fn python_package_rlms_and_smolagents_integrations() {
    pytest(
        &["tests/test_rlm.py", "tests/test_smolagents.py"],
        &package_dir(),
        "clients/python integration tests",
        &[],
    );
}

#[test]
fn python_package_readme_examples_run_as_written() {
    pytest(
        &["tests/test_readme.py"],
        &package_dir(),
        "clients/python README examples",
        &[],
    );
}

/// rlms' own tests of its REPL environment (from its source distribution,
/// unpacked by install.sh), with `LocalREPL` swapped for the cellbox one by
/// the `rlms_as_cellbox` plugin: every REPL they make is a cellbox session.
#[test]
fn rlms_own_repl_tests_pass_against_the_cellbox_environment() {
    let src = installed("pyclient/rlms-src/tests");
    let root = src.parent().unwrap().to_path_buf();
    let plugin_dir = package_dir().join("tests");
    let files = [
        "tests/test_local_repl.py",
        "tests/test_local_repl_persistent.py",
        "tests/test_rlm_query.py",
        "tests/test_parsing.py",
        "tests/test_multi_turn_integration.py",
        "tests/test_subcall.py",
        "tests/test_depth_metadata.py",
    ];
    let mut args = vec!["-p", "rlms_as_cellbox"];
    args.extend_from_slice(&files);
    // The plugin module is found on PYTHONPATH.
    let out = pytest(
        &args,
        &root,
        "rlms' REPL tests against CellboxREPL",
        &[("PYTHONPATH", &plugin_dir)],
    );
    // The swap took: the tests made cellbox environments, many of them.
    let made: u32 = out
        .lines()
        .find_map(|l| l.strip_prefix("cellbox environments made: "))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0);
    assert!(made >= 100, "the tests made {made} cellbox environments");
    let passed: u32 = out
        .lines()
        .rev()
        .find(|l| l.contains(" passed"))
        .and_then(|l| l.split_whitespace().find_map(|w| w.parse().ok()))
        .unwrap_or(0);
    assert!(passed >= 141, "only {passed} of rlms' REPL tests ran");
}

/// Checks a `cellbox agent --trajectory` file with rlms' own code (in the
/// venv with `rlms` installed): each line is rebuilt into rlms' types
/// (`RLMMetadata`, `RLMIteration`, `CodeBlock`, `REPLResult`, and
/// `RLMChatCompletion.from_dict` for the cells' model calls) whose
/// `to_dict()` must give the line back exactly; the same objects written
/// through rlms' `RLMLogger` must give lines with the same keys. Prints
/// `ok N` (the iterations).
const RLMS_LOG_CHECK: &str = r#"
import json, sys, tempfile, os
from rlm.core.types import (RLMMetadata, RLMIteration, CodeBlock, REPLResult,
                            RLMChatCompletion)
from rlm.logger import RLMLogger

lines = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
assert lines and lines[0]["type"] == "metadata", lines[:1]
meta_line = lines[0]
fields = {k: v for k, v in meta_line.items() if k not in ("type", "timestamp")}
meta = RLMMetadata(**fields)
assert meta.to_dict() == fields, (meta.to_dict(), fields)
iterations = []
for n, line in enumerate(lines[1:], 1):
    assert line["type"] == "iteration" and line["iteration"] == n, line
    body = {k: v for k, v in line.items() if k not in ("type", "iteration", "timestamp")}
    blocks = [CodeBlock(code=b["code"], result=REPLResult(
        stdout=b["result"]["stdout"], stderr=b["result"]["stderr"],
        locals=b["result"]["locals"], execution_time=b["result"]["execution_time"],
        rlm_calls=[RLMChatCompletion.from_dict(c) for c in b["result"]["rlm_calls"]],
        final_answer=b["result"]["final_answer"])) for b in body["code_blocks"]]
    it = RLMIteration(prompt=body["prompt"], response=body["response"], code_blocks=blocks,
                      final_answer=body["final_answer"], iteration_time=body["iteration_time"])
    assert it.to_dict() == body, (it.to_dict(), body)
    iterations.append(it)
with tempfile.TemporaryDirectory() as d:
    logger = RLMLogger(log_dir=d)
    logger.log_metadata(meta)
    for it in iterations:
        logger.log(it)
    theirs = [json.loads(l) for l in open(logger.log_file_path)]
assert [sorted(x) for x in theirs] == [sorted(x) for x in lines], (theirs, lines)
traj = logger.get_trajectory()
print("ok", len(traj["iterations"]))
print(json.dumps(lines))
"#;

/// `cellbox agent --trajectory FILE` writes rlms' log format: a run with a
/// failing cell, a cell's `llm_query`, and an answer, checked by rlms' own
/// types and logger; the cell's query is an `rlm_calls` entry with its
/// prompt, reply and usage, and the last iteration holds the answer. A run
/// stopped by a budget has its best-effort answer there and says it is not
/// final in the metadata.
#[test]
fn cellbox_agent_trajectory_is_read_by_rlms_own_types() {
    use super::common::fake_model::{FakeModel, Reply};
    let fake = FakeModel::start(vec![
        Reply::Text(
            "Look.\n```python\nprint(len(context))\n1/0\n```".into(),
            100,
            20,
        ),
        Reply::Text(
            "```python\nr = llm_query('summarise: ' + context)\nanswer(r)\n```".into(),
            150,
            10,
        ),
        Reply::Text("a short text".into(), 30, 3),
    ]);
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("agent.toml");
    std::fs::write(
        &cfg,
        format!(
            "[server]\npython = \"/usr/bin/python3\"\n[models.local]\nendpoint = \"{}\"\n\
             model = \"m\"\ninput_price = 1.0\noutput_price = 1.0\n",
            fake.url
        ),
    )
    .unwrap();
    let ctx = dir.path().join("ctx.txt");
    std::fs::write(&ctx, "hello world").unwrap();
    let log = dir.path().join("run.jsonl");
    let out = super::common::cellbox(
        &[
            "agent",
            "--config",
            cfg.to_str().unwrap(),
            "--context",
            ctx.to_str().unwrap(),
            "--trajectory",
            log.to_str().unwrap(),
            "Summarise the context",
        ],
        None,
    );
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let checked = venv_python_of(
        "pyclient",
        &["-c", RLMS_LOG_CHECK, log.to_str().unwrap()],
        dir.path(),
        "rlms log check",
        &[],
    );
    let mut parts = checked.splitn(2, '\n');
    assert_eq!(parts.next(), Some("ok 2"), "{checked}");
    let lines: serde_json::Value = serde_json::from_str(parts.next().unwrap().trim()).unwrap();
    let meta = &lines[0];
    assert_eq!(meta["root_model"], "local", "{meta}");
    assert_eq!(meta["environment_type"], "cellbox");
    assert_eq!(meta["environment_kwargs"]["answer_final"], true, "{meta}");
    let first = &lines[1];
    assert_eq!(first["prompt"][1]["content"], "Summarise the context");
    assert_eq!(first["code_blocks"][0]["result"]["stdout"], "11\n");
    assert!(
        first["code_blocks"][0]["result"]["stderr"]
            .as_str()
            .unwrap()
            .contains("ZeroDivisionError"),
        "{first}"
    );
    assert_eq!(first["final_answer"], serde_json::Value::Null);
    let second = &lines[2];
    // The second turn was sent the whole conversation so far.
    assert_eq!(second["prompt"].as_array().unwrap().len(), 4, "{second}");
    let call = &second["code_blocks"][0]["result"]["rlm_calls"][0];
    assert_eq!(call["prompt"], "summarise: hello world", "{call}");
    assert_eq!(call["response"], "a short text", "{call}");
    let usage = &call["usage_summary"]["model_usage_summaries"]["local"];
    assert_eq!(
        (
            usage["total_input_tokens"].as_u64(),
            usage["total_output_tokens"].as_u64()
        ),
        (Some(30), Some(3)),
        "{call}"
    );
    assert_eq!(second["final_answer"], "a short text", "{second}");
    // A run a budget stopped: the best-effort answer, not final.
    let fake = FakeModel::start(vec![
        Reply::Text("```python\nprint(1)\n```".into(), 5, 5),
        Reply::Text("my best guess".into(), 5, 5),
    ]);
    std::fs::write(
        &cfg,
        format!(
            "[server]\npython = \"/usr/bin/python3\"\n[models.local]\nendpoint = \"{}\"\n\
             model = \"m\"\n",
            fake.url
        ),
    )
    .unwrap();
    let out = super::common::cellbox(
        &[
            "agent",
            "--config",
            cfg.to_str().unwrap(),
            "--max-steps",
            "1",
            "--trajectory",
            log.to_str().unwrap(),
            "t",
        ],
        None,
    );
    assert_eq!(out.status.code(), Some(4), "{out:?}");
    let checked = venv_python_of(
        "pyclient",
        &["-c", RLMS_LOG_CHECK, log.to_str().unwrap()],
        dir.path(),
        "rlms log check (budget)",
        &[],
    );
    let mut parts = checked.splitn(2, '\n');
    assert_eq!(parts.next(), Some("ok 2"), "{checked}");
    let lines: serde_json::Value = serde_json::from_str(parts.next().unwrap().trim()).unwrap();
    assert_eq!(lines[0]["environment_kwargs"]["answer_final"], false);
    assert_eq!(
        lines[0]["environment_kwargs"]["stop"]["budget"],
        "max_steps"
    );
    assert_eq!(lines[2]["final_answer"], "my best guess");
    assert_eq!(lines[2]["code_blocks"], serde_json::json!([]));
}
