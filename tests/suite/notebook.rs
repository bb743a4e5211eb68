//! Notebook extras: package paths and preloaded modules from the profile,
//! rich display values (figures, `_repr_*_`), files in and out of a session
//! over MCP.

use super::common::*;
use cellbox::{CellResult, Language, SessionConfig, Status, Supervisor};
use serde_json::json;
use std::path::{Path, PathBuf};

/// Debian's package directory, where `python3-numpy` and
/// `python3-matplotlib` install (.ci/run installs both).
const DIST_PACKAGES: &str = "/usr/lib/python3/dist-packages";

fn require_package(module: &str, deb: &str) {
    let ok = std::process::Command::new("/usr/bin/python3")
        .args([
            "-c",
            &format!("import sys; sys.path.append({DIST_PACKAGES:?}); import {module}"),
        ])
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        ok,
        "this test needs {module}: apt-get install {deb} (.ci/run does)"
    );
}

/// The built-in python profile plus a `[python]` section.
fn packages_profile(dir: &Path, preload: &[&str]) -> PathBuf {
    let base = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/sandbox-profiles/python.toml"
    ))
    .unwrap();
    let preload: Vec<String> = preload.iter().map(|m| format!("{m:?}")).collect();
    let text = format!(
        "{base}\n[python]\npaths = [{DIST_PACKAGES:?}]\npreload = [{}]\n",
        preload.join(", ")
    );
    let path = dir.join("python-packages.toml");
    std::fs::write(&path, text).unwrap();
    path
}

fn with_packages(dir: &Path, preload: &[&str], warm: bool) -> Supervisor {
    Supervisor::builder()
        .worker_exe(bin())
        .warm(warm)
        .profile(
            Language::Python,
            packages_profile(dir, preload).to_string_lossy(),
        )
        .build()
        .unwrap()
}

fn hygiene(r: &CellResult) -> String {
    layer_detail(r, "hygiene")
}

const NUMPY_CELL: &str = "import numpy as np\na = np.arange(12).reshape(3, 4)\n\
    [int(a.sum()), list(a.shape), float((a @ a.T).trace()), np.__file__.startswith('/usr/lib/python3/dist-packages')]";

fn assert_numpy_ran(r: &CellResult) {
    assert_eq!(r.status, Status::Ok, "{r:?}");
    assert_eq!(r.value, json!([66, [3, 4], 506.0, true]), "{r:?}");
}

#[tokio::test]
async fn numpy_from_the_profiles_package_path_in_a_cold_cell() {
    require_package("numpy", "python3-numpy");
    let dir = tempfile::tempdir().unwrap();
    let sup = with_packages(dir.path(), &[], false);
    let r = run_py(&sup, NUMPY_CELL).await;
    assert_numpy_ran(&r);
    assert!(!hygiene(&r).contains("zygote"), "{r:?}");
    // The thread count numeric libraries read is set for the cell.
    let r = run_py(
        &sup,
        "import os\n[os.environ.get('OPENBLAS_NUM_THREADS'), os.environ.get('MPLBACKEND')]",
    )
    .await;
    assert_eq!(r.value, json!(["1", "Agg"]), "{r:?}");
}

#[tokio::test]
async fn numpy_preloaded_by_the_zygote_in_warm_cells() {
    require_package("numpy", "python3-numpy");
    let dir = tempfile::tempdir().unwrap();
    let sup = with_packages(dir.path(), &["numpy"], true);
    let s = sup.session(SessionConfig::default()).unwrap();
    // Before any import in the cell, numpy is there: the zygote imported it.
    let r = py_in(&s, "import sys\n'numpy' in sys.modules").await;
    assert_eq!(r.status, Status::Ok, "{r:?}");
    assert!(hygiene(&r).contains("Python zygote"), "not warm: {r:?}");
    assert_eq!(r.value, json!(true), "{r:?}");
    for _ in 0..2 {
        let r = py_in(&s, NUMPY_CELL).await;
        assert_numpy_ran(&r);
        assert!(hygiene(&r).contains("Python zygote"), "not warm: {r:?}");
    }
    // One BLAS thread: the cell is a single thread after a matrix product.
    let r = py_in(
        &s,
        "import numpy as np, threading\nm = np.ones((300, 300))\n_ = m @ m\nimport os\nlen(os.listdir('/proc/self/task'))",
    )
    .await;
    assert_eq!(r.value, json!(1), "{r:?}");
}

#[tokio::test]
async fn a_missing_module_names_the_package_paths() {
    let dir = tempfile::tempdir().unwrap();
    let sup = with_packages(dir.path(), &[], false);
    let r = run_py(&sup, "import no_such_module_here").await;
    assert_eq!(r.status, Status::Error, "{r:?}");
    let e = r.error.clone().unwrap();
    assert_eq!(e.kind, "ModuleNotFoundError", "{r:?}");
    assert!(e.message.contains("no_such_module_here"), "{e:?}");
    assert!(e.message.contains(DIST_PACKAGES), "{e:?}");
    // Without package paths, the message says how to add some.
    let r = run_py(&supervisor(), "import no_such_module_here").await;
    let e = r.error.clone().unwrap();
    assert!(e.message.contains("[python] paths"), "{e:?}");
}

#[tokio::test]
async fn a_profile_with_a_bad_package_entry_is_refused_by_key() {
    let dir = tempfile::tempdir().unwrap();
    let base = std::fs::read_to_string(packages_profile(dir.path(), &[])).unwrap();
    let bad = dir.path().join("bad.toml");
    std::fs::write(
        &bad,
        base.replace("preload = []", "preload = [\"os; import x\"]"),
    )
    .unwrap();
    let e = cellbox::profiles::Profile::load(&bad.to_string_lossy()).unwrap_err();
    assert!(e.to_string().contains("python.preload[0]"), "{e}");
}
