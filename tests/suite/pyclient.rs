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
