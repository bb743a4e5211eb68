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
    assert_eq!(r.value, json!(["1", "module://_cellbox_backend"]), "{r:?}");
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

fn decode_b64(data: &str) -> Vec<u8> {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD
        .decode(data)
        .unwrap_or_else(|e| panic!("not base64 ({e}): {data:.80}"))
}

/// The PNG signature, then an IHDR chunk: (width, height).
fn png_size(png: &[u8]) -> (u32, u32) {
    assert!(png.len() > 33, "{} bytes", png.len());
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n", "not a PNG signature");
    assert_eq!(&png[8..12], &13u32.to_be_bytes(), "IHDR length");
    assert_eq!(&png[12..16], b"IHDR");
    let w = u32::from_be_bytes(png[16..20].try_into().unwrap());
    let h = u32::from_be_bytes(png[20..24].try_into().unwrap());
    (w, h)
}

const FIGURES: &str = "import matplotlib.pyplot as plt\n\
    plt.plot([1, 2, 3], [1, 4, 9])\nplt.show()\n\
    fig = plt.figure(figsize=(2, 1))\nplt.bar([1, 2], [3, 4])\n\
    'drawn'";

#[tokio::test]
async fn matplotlib_figures_come_back_as_png() {
    require_package("matplotlib", "python3-matplotlib");
    let dir = tempfile::tempdir().unwrap();
    for warm in [false, true] {
        let sup = with_packages(dir.path(), &[], warm);
        let s = sup.session(SessionConfig::default()).unwrap();
        let r = py_in(&s, FIGURES).await;
        assert_eq!(r.status, Status::Ok, "warm={warm}: {r:?}");
        assert_eq!(hygiene(&r).contains("Python zygote"), warm, "{r:?}");
        assert_eq!(r.value, json!("drawn"));
        // plt.show() sent the first figure; the second was left open.
        assert_eq!(r.display.len(), 2, "{:?}", r.display_dropped);
        assert!(r.display.iter().all(|d| d.mime == "image/png"));
        assert_eq!(png_size(&decode_b64(&r.display[0].data)), (640, 480));
        assert_eq!(png_size(&decode_b64(&r.display[1].data)), (200, 100));
        assert!(r.display_dropped.is_empty(), "{r:?}");
        // Closed once shown: the next cell shows nothing more.
        let r = py_in(
            &s,
            "import matplotlib.pyplot as plt\nlen(plt.get_fignums())",
        )
        .await;
        assert_eq!(r.value, json!(0), "{r:?}");
        assert!(r.display.is_empty(), "{r:?}");
    }
}

const RICH: &str = r#"
class Table:
    def _repr_html_(self):
        return "<table><tr><td>1</td></tr></table>"
    def _repr_markdown_(self):
        return "| a |\n|---|\n| 1 |"
    def _repr_png_(self):
        return b"\x89PNG\r\n\x1a\n" + b"\0" * 40
Table()
"#;

#[tokio::test]
async fn rich_reprs_of_the_last_value_are_displayed() {
    let r = run_py(&supervisor(), RICH).await;
    assert_eq!(r.status, Status::Ok, "{r:?}");
    let mimes: Vec<_> = r.display.iter().map(|d| d.mime.as_str()).collect();
    assert_eq!(mimes, ["image/png", "text/html", "text/markdown"], "{r:?}");
    assert_eq!(&decode_b64(&r.display[0].data)[..4], b"\x89PNG");
    assert_eq!(r.display[1].data, "<table><tr><td>1</td></tr></table>");
    assert!(
        r.value_repr
            .as_deref()
            .unwrap_or("")
            .contains("Table object"),
        "{r:?}"
    );
    // A failing _repr_html_ is said, and the cell still succeeds.
    let r = run_py(
        &supervisor(),
        "class Bad:\n    def _repr_html_(self):\n        raise ValueError('no')\nBad()",
    )
    .await;
    assert_eq!(r.status, Status::Ok, "{r:?}");
    assert!(r.display.is_empty());
    assert!(r.display_dropped[0].reason.contains("ValueError"), "{r:?}");
}

#[tokio::test]
async fn display_items_are_capped_and_what_was_left_out_is_said() {
    let sup = supervisor();
    let limits = cellbox::Limits {
        max_display_bytes: 3000,
        max_display_item_bytes: 2000,
        ..cellbox::Limits::default()
    };
    let config = SessionConfig {
        limits,
        ..SessionConfig::default()
    };
    let s = sup.session(config).unwrap();
    let code = "class H:\n    def __init__(self, n): self.n = n\n    def _repr_html_(self): return 'x' * self.n\n";
    let r = py_in(&s, &format!("{code}H(2500)")).await;
    assert_eq!(r.status, Status::Ok, "{r:?}");
    assert!(r.display.is_empty(), "{r:?}");
    assert_eq!(r.display_dropped.len(), 1, "{r:?}");
    assert_eq!(r.display_dropped[0].bytes, 2500);
    assert!(
        r.display_dropped[0]
            .reason
            .contains("max_display_item_bytes (2000)"),
        "{r:?}"
    );
    // Within the item cap, over the total: the second one goes.
    let r = py_in(
        &s,
        &format!("{code}class Two:\n    def _repr_html_(self): return 'h' * 1800\n    def _repr_markdown_(self): return 'm' * 1800\nTwo()"),
    )
    .await;
    assert_eq!(r.display.len(), 1, "{r:?}");
    assert_eq!(r.display[0].mime, "text/html");
    assert!(
        r.display_dropped[0]
            .reason
            .contains("max_display_bytes (3000)"),
        "{r:?}"
    );
}
