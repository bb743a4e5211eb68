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

/// The built-in python profile plus a `[python]` section with Debian's
/// package directory.
fn packages_profile(dir: &Path, preload: &[&str]) -> PathBuf {
    python_profile(dir, Path::new(DIST_PACKAGES), preload)
}

/// The built-in python profile plus a `[python]` section, written in `dir`.
fn python_profile(dir: &Path, packages: &Path, preload: &[&str]) -> PathBuf {
    let base = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/sandbox-profiles/python.toml"
    ))
    .unwrap();
    let preload: Vec<String> = preload.iter().map(|m| format!("{m:?}")).collect();
    let text = format!(
        "{base}\n[python]\npaths = [{packages:?}]\npreload = [{}]\n",
        preload.join(", ")
    );
    let path = dir.join("python-packages.toml");
    std::fs::write(&path, text).unwrap();
    path
}

/// A supervisor, with warm pools or not, its Python cells under `profile`.
fn with_profile(profile: &Path, warm: bool) -> Supervisor {
    Supervisor::builder()
        .worker_exe(bin())
        .warm(warm)
        .profile(Language::Python, profile.to_string_lossy())
        .build()
        .unwrap()
}

fn with_packages(dir: &Path, preload: &[&str], warm: bool) -> Supervisor {
    with_profile(&packages_profile(dir, preload), warm)
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

// ---------------------------------------------------------------- over MCP

mod over_mcp {
    use super::*;
    use rmcp::model::{CallToolRequestParams, CallToolResult};
    use rmcp::service::RunningService;
    use rmcp::transport::TokioChildProcess;
    use rmcp::{RoleClient, ServiceExt};
    use serde_json::Value;

    type Client = RunningService<RoleClient, ()>;

    async fn serve(args: &[&str]) -> Client {
        let mut cmd = tokio::process::Command::new(bin());
        cmd.arg("serve").args(args);
        let transport = TokioChildProcess::new(cmd).unwrap();
        ().serve(transport).await.unwrap()
    }

    async fn call(c: &Client, tool: &'static str, args: Value) -> CallToolResult {
        let Value::Object(m) = args else {
            panic!("arguments must be an object")
        };
        c.call_tool(CallToolRequestParams::new(tool).with_arguments(m))
            .await
            .unwrap()
    }

    fn text(r: &CallToolResult) -> String {
        r.content
            .iter()
            .filter_map(|c| c.as_text().map(|t| t.text.clone()))
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// The value of a Python cell that must succeed in session `id`.
    async fn python_value(c: &Client, id: &str, code: &str) -> Value {
        let r = call(
            c,
            "execute_code",
            json!({"session_id": id, "language": "python", "code": code}),
        )
        .await;
        assert_eq!(r.is_error, Some(false), "{}", text(&r));
        r.structured_content.unwrap()["value"].clone()
    }

    async fn session(c: &Client) -> String {
        let r = call(c, "create_session", json!({})).await;
        r.structured_content.unwrap()["session_id"]
            .as_str()
            .unwrap()
            .to_owned()
    }

    /// Uploads land in the session's scratch directory, so they count
    /// against its quota with the files its cells write: past it, an
    /// upload is refused with a clear error and nothing of it is left.
    #[tokio::test]
    async fn uploads_count_against_the_sessions_scratch_quota() {
        let c = serve(&["--session-scratch-bytes", "1048576"]).await;
        let id = session(&c).await;
        let chunk = "x".repeat(400 << 10);
        for name in ["a.txt", "b.txt"] {
            let r = call(
                &c,
                "upload_file",
                json!({"session_id": id, "path": name, "content": chunk}),
            )
            .await;
            assert_eq!(r.is_error, Some(false), "{name}: {}", text(&r));
        }
        let r = call(
            &c,
            "upload_file",
            json!({"session_id": id, "path": "c.txt", "content": chunk}),
        )
        .await;
        assert_eq!(r.is_error, Some(true), "a third 400 KiB fits in 1 MiB?");
        let why = text(&r);
        assert!(why.contains("c.txt"), "{why}");
        assert!(
            why.contains("scratch space is full"),
            "the error does not say the session is full: {why}"
        );
        // What was written of it is given back (the file is left empty),
        // and the session carries on: a cell frees room, and the upload
        // then fits.
        let code = "import os\nleft = {n: os.path.getsize(n) for n in os.listdir('.')}\n\
                    os.remove('a.txt')\nleft";
        assert_eq!(
            python_value(&c, &id, code).await,
            json!({"a.txt": 400 << 10, "b.txt": 400 << 10, "c.txt": 0})
        );
        let r = call(
            &c,
            "upload_file",
            json!({"session_id": id, "path": "c.txt", "content": chunk}),
        )
        .await;
        assert_eq!(r.is_error, Some(false), "{}", text(&r));
    }

    #[tokio::test]
    async fn files_go_in_and_out_of_a_session() {
        let c = serve(&[]).await;
        let names: Vec<String> = c
            .list_all_tools()
            .await
            .unwrap()
            .into_iter()
            .map(|t| t.name.to_string())
            .collect();
        for t in ["upload_file", "download_file", "list_files"] {
            assert!(names.iter().any(|n| n == t), "{t} not in {names:?}");
        }
        let id = session(&c).await;
        let r = call(
            &c,
            "upload_file",
            json!({"session_id": id, "path": "data/in.txt", "content": "hello from the client"}),
        )
        .await;
        assert_eq!(r.is_error, Some(false), "{}", text(&r));
        let r = call(
            &c,
            "upload_file",
            json!({"session_id": id, "path": "blob.bin", "content": "AAH/", "encoding": "base64"}),
        )
        .await;
        assert_eq!(r.is_error, Some(false), "{}", text(&r));
        // The next cell reads both, and writes a file of its own.
        let code = "a = open('data/in.txt').read()\nb = list(open('blob.bin', 'rb').read())\n\
                    open('out.bin', 'wb').write(bytes([0, 159, 146, 150]))\n\
                    open('note.txt', 'w').write(a.upper())\n[a, b]";
        assert_eq!(
            python_value(&c, &id, code).await,
            json!(["hello from the client", [0, 1, 255]])
        );
        let r = call(
            &c,
            "download_file",
            json!({"session_id": id, "path": "note.txt"}),
        )
        .await;
        let v = r.structured_content.clone().unwrap();
        assert_eq!(v["encoding"], "utf-8", "{v}");
        assert_eq!(v["content"], "HELLO FROM THE CLIENT");
        let r = call(
            &c,
            "download_file",
            json!({"session_id": id, "path": "out.bin"}),
        )
        .await;
        let v = r.structured_content.clone().unwrap();
        assert_eq!(v["encoding"], "base64", "{v}");
        assert_eq!(
            decode_b64(v["content"].as_str().unwrap()),
            [0, 159, 146, 150]
        );
        let r = call(&c, "list_files", json!({"session_id": id})).await;
        let v = r.structured_content.clone().unwrap();
        let entries: Vec<(String, String)> = v["entries"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| {
                (
                    e["name"].as_str().unwrap().to_owned(),
                    e["type"].as_str().unwrap().to_owned(),
                )
            })
            .filter(|(n, _)| !n.starts_with('.'))
            .collect();
        let want: Vec<(String, String)> = [
            ("blob.bin", "file"),
            ("data", "directory"),
            ("note.txt", "file"),
            ("out.bin", "file"),
        ]
        .iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect();
        assert_eq!(entries, want, "{v}");
        let r = call(&c, "list_files", json!({"session_id": id, "path": "data"})).await;
        assert_eq!(r.structured_content.unwrap()["entries"][0]["size"], 21);
    }

    /// Answers that grow with what a tenant's cells made stay within the
    /// 960 KiB a result may take, as written: a 512 KiB file of control
    /// characters (six bytes each as JSON text, 3 MiB) comes back whole as
    /// base64; a listing of 3000 files named by 240 control characters
    /// (1000 are listed, each name twice, six bytes a character) and a list
    /// of sessions naming 40,000 long variables are cut to fit and say so.
    /// The controls: what the cells made is far larger than the answers.
    #[tokio::test]
    async fn session_tool_answers_fit_the_result_maximum() {
        const MAX: usize = cellbox::serve::fit::MAX_RESULT_BYTES;
        let wire = |r: &CallToolResult| serde_json::to_vec(r).unwrap().len();
        let c = serve(&[]).await;
        let id = session(&c).await;
        let code = "import os\nopen('ctl.txt', 'w').write('\\x01' * (512 << 10))\n\
                    os.mkdir('many')\nfor i in range(3000):\n    \
                    open('many/' + '\\x01' * 240 + '%05d' % i, 'w').close()\n\
                    globals().update({'v%060d' % i: 0 for i in range(40000)})\n\
                    len(os.listdir('many'))";
        assert_eq!(python_value(&c, &id, code).await, json!(3000));

        let r = call(
            &c,
            "download_file",
            json!({"session_id": id, "path": "ctl.txt"}),
        )
        .await;
        assert_eq!(r.is_error, Some(false), "{}", text(&r));
        assert!(wire(&r) <= MAX, "download: {} bytes", wire(&r));
        let v = r.structured_content.clone().unwrap();
        assert_eq!(v["encoding"], "base64", "{}", text(&r));
        assert_eq!(
            decode_b64(v["content"].as_str().unwrap()),
            vec![1u8; 512 << 10]
        );
        // Control: as text, the same file takes far more.
        let as_text = serde_json::to_vec(&"\u{1}".repeat(512 << 10))
            .unwrap()
            .len();
        assert!(as_text > 3 * MAX, "{as_text}");

        let r = call(&c, "list_files", json!({"session_id": id, "path": "many"})).await;
        assert_eq!(r.is_error, Some(false), "{}", text(&r));
        assert!(wire(&r) <= MAX, "list_files: {} bytes", wire(&r));
        let v = r.structured_content.clone().unwrap();
        let listed = v["entries"].as_array().unwrap().len();
        assert!((1..3000).contains(&listed), "{listed}");
        assert!(v["cut_to_fit"].is_string(), "{v:.300}");

        let r = call(&c, "list_sessions", json!({})).await;
        assert_eq!(r.is_error, Some(false), "{}", text(&r));
        assert!(wire(&r) <= MAX, "list_sessions: {} bytes", wire(&r));
        let v = r.structured_content.clone().unwrap();
        assert!(v["cut_to_fit"].is_string(), "{v:.300}");
        assert_eq!(v["sessions"][0]["session_id"], json!(id), "{v:.300}");
        let names = v["sessions"][0]["variables"].as_array().unwrap().len();
        assert!((1..40000).contains(&names), "{names}");
        c.cancel().await.unwrap();
    }

    #[tokio::test]
    async fn bad_file_requests_get_clear_errors() {
        let c = serve(&["--max-output", "4096"]).await;
        let id = session(&c).await;
        // A cell makes a symlink out of the directory.
        let r = call(
            &c,
            "execute_code",
            json!({"session_id": id, "language": "python",
                   "code": "import os\nos.symlink('/etc/passwd', 'link')\nos.symlink('/tmp', 'dirlink')"}),
        )
        .await;
        assert_eq!(r.is_error, Some(false), "{}", text(&r));
        let big = "x".repeat((4 << 20) + 1);
        let cases: Vec<(&'static str, Value, &str)> = vec![
            (
                "upload_file",
                json!({"session_id": id, "path": "../x", "content": "a"}),
                "'..' is not allowed",
            ),
            (
                "upload_file",
                json!({"session_id": id, "path": "/etc/x", "content": "a"}),
                "an absolute path",
            ),
            (
                "upload_file",
                json!({"session_id": id, "path": "link", "content": "a"}),
                "symlink",
            ),
            (
                "upload_file",
                json!({"session_id": id, "path": "dirlink/x", "content": "a"}),
                "symlink",
            ),
            (
                "upload_file",
                json!({"session_id": id, "path": "big", "content": big}),
                "max_upload_bytes",
            ),
            (
                "upload_file",
                json!({"session_id": id, "path": "b", "content": "!!", "encoding": "base64"}),
                "invalid base64",
            ),
            (
                "upload_file",
                json!({"session_id": id, "path": "b", "content": "a", "encoding": "latin-1"}),
                "unknown encoding",
            ),
            (
                "download_file",
                json!({"session_id": id, "path": "link"}),
                "symlink",
            ),
            (
                "download_file",
                json!({"session_id": id, "path": "../../etc/passwd"}),
                "'..' is not allowed",
            ),
            (
                "download_file",
                json!({"session_id": id, "path": "missing"}),
                "not found",
            ),
            (
                "list_files",
                json!({"session_id": id, "path": "dirlink"}),
                "symlink",
            ),
            (
                "list_files",
                json!({"session_id": "s-nonesuch"}),
                "no session",
            ),
            (
                "download_file",
                json!({"session_id": "s-nonesuch", "path": "a"}),
                "no session",
            ),
        ];
        for (tool, args, want) in cases {
            let r = call(&c, tool, args.clone()).await;
            let t = text(&r);
            assert_eq!(r.is_error, Some(true), "{tool} {args:.200}: {t}");
            assert!(t.contains(want), "{tool}: {t:?} should say {want:?}");
        }
        // Nothing was written through the symlinks.
        let r = call(
            &c,
            "execute_code",
            json!({"session_id": id, "language": "python",
                   "code": "import os\nsorted(n for n in os.listdir('.') if not n.startswith('.'))"}),
        )
        .await;
        assert_eq!(
            r.structured_content.unwrap()["value"],
            json!(["dirlink", "link"])
        );
    }

    #[tokio::test]
    async fn a_rich_value_is_image_content() {
        let c = serve(&[]).await;
        let code = "class P:\n    def _repr_png_(self):\n        return b'\\x89PNG\\r\\n\\x1a\\n' + bytes(30)\nP()";
        let r = call(
            &c,
            "execute_code",
            json!({"language": "python", "code": code}),
        )
        .await;
        assert_eq!(r.is_error, Some(false), "{}", text(&r));
        let content = serde_json::to_value(&r.content).unwrap();
        let image = content
            .as_array()
            .unwrap()
            .iter()
            .find(|b| b["type"] == "image")
            .unwrap_or_else(|| panic!("no image content: {content}"));
        assert_eq!(image["mimeType"], "image/png");
        assert_eq!(
            &decode_b64(image["data"].as_str().unwrap())[..8],
            b"\x89PNG\r\n\x1a\n"
        );
        let s = r.structured_content.unwrap();
        let index = s["display"][0]["content_index"].as_u64().unwrap() as usize;
        assert_eq!(content[index]["type"], "image", "{s}");
        assert!(s["display"][0].get("data").is_none(), "sent once: {s}");
    }
}

/// A zygote whose preloaded module takes longer to import than a zygote may
/// take to answer a spawn (one second by default) forks its first cell once
/// the import is over: the wait for that spawn's answer is not charged with
/// the import, the zygote is not taken for a stalled one, and the session's
/// live namespace is there from its first cell. A cell whose own limit
/// passes while the zygote imports ends `timeout`, and says why; the pool's
/// status meanwhile shows the zygote alive but not serving.
#[tokio::test]
async fn a_slow_preload_is_waited_for_and_the_zygote_not_taken_for_stalled() {
    let dir = tempfile::tempdir().unwrap();
    // Its import lasts until the test opens the gate (30 s at most).
    std::fs::write(
        dir.path().join("cellbox_slow_import.py"),
        "import os, time\n\
         gate = os.path.join(os.path.dirname(__file__), 'gate')\n\
         end = time.monotonic() + 30\n\
         while not os.path.exists(gate) and time.monotonic() < end:\n    time.sleep(0.05)\n\
         LOADED = True\n",
    )
    .unwrap();
    let profile = python_profile(dir.path(), dir.path(), &["cellbox_slow_import"]);
    let sup = with_profile(&profile, true);
    let mut hurried = cellbox::CellRequest::new(Language::Python, "1");
    hurried.limits.timeout_ms = Some(500);
    let r = sup.run(hurried, SessionConfig::default()).await;
    assert_eq!(r.status, Status::Timeout, "{r:?}");
    let message = r
        .error
        .as_ref()
        .map(|e| e.message.clone())
        .unwrap_or_default();
    assert!(message.contains("zygote"), "{r:?}");
    // Still importing: alive, not yet serving, not stalled.
    zygotes_are(&sup, false).await;
    // The import ends 1.5 s into the next cell: longer than a zygote may
    // take to answer a spawn, which must not be charged with it.
    let gate = dir.path().join("gate");
    let opener = std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_millis(1500));
        std::fs::write(gate, "").unwrap();
    });
    let s = sup.session(SessionConfig::default()).unwrap();
    let r = py_in(
        &s,
        "import sys\nn = 1\nsys.modules['cellbox_slow_import'].LOADED",
    )
    .await;
    assert_eq!(r.status, Status::Ok, "{r:?}");
    assert_eq!(r.value, json!(true), "not preloaded: {r:?}");
    assert!(r.notes.is_empty(), "{r:?}");
    assert_eq!(r.state, Some(cellbox::StateOutcome::Kept), "{r:?}");
    assert!(hygiene(&r).contains("zygote"), "{r:?}");
    let r = py_in(&s, "n + 1").await;
    assert_eq!(r.value, json!(2), "{r:?}");
    // A cell of another session is forked from the same zygote.
    let r = run_py(&sup, "import sys\n'cellbox_slow_import' in sys.modules").await;
    assert_eq!(r.value, json!(true), "{r:?}");
    assert!(hygiene(&r).contains("zygote"), "{r:?}");
    opener.join().unwrap();
    zygotes_are(&sup, true).await;
}

/// A zygote that dies importing its preload modules makes `start_pools`
/// fail and say so, instead of returning as if the pool took cells. A cell
/// after it still runs, in a fresh worker.
#[tokio::test]
async fn a_zygote_dying_in_its_preload_fails_start_pools() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("cellbox_fatal_import.py"),
        "import os\nos._exit(3)\n",
    )
    .unwrap();
    let profile = python_profile(dir.path(), dir.path(), &["cellbox_fatal_import"]);
    let sup = with_profile(&profile, true);
    let err = sup.start_pools().await.unwrap_err().to_string();
    assert!(
        err.contains("exited before it served") && err.contains("preload"),
        "{err}"
    );
    let mut cell = cellbox::CellRequest::new(Language::Python, "1");
    cell.limits.timeout_ms = Some(10_000);
    let r = sup.run(cell, SessionConfig::default()).await;
    assert_eq!(r.status, Status::Ok, "{r:?}");
    assert_eq!(r.value, json!(1), "{r:?}");
    assert!(!hygiene(&r).contains("zygote"), "{r:?}");
}

/// Every zygote of the pool is alive and not stalled, and serves or not
/// as `serving` says; a zygote that is to serve may still be taking back
/// the fork of a cell that just ended, so that is waited for (a while).
async fn zygotes_are(sup: &Supervisor, serving: bool) {
    let t0 = std::time::Instant::now();
    loop {
        let pools = sup.pool_status().await;
        let ok = !pools.python.is_empty()
            && pools
                .python
                .iter()
                .all(|z| z.alive && z.serving == serving && !z.stalled);
        if ok {
            return;
        }
        assert!(
            serving && t0.elapsed() < std::time::Duration::from_secs(10),
            "{pools:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// A live session keeps numpy arrays (and a view sharing one's memory)
/// between cells and rolls them back whole, and a matplotlib figure made in
/// one cell can be drawn on and shown in a later one, with both packages
/// imported ahead of time by the zygote.
#[tokio::test]
async fn numpy_arrays_and_figures_live_across_cells_with_preloaded_packages() {
    require_package("numpy", "python3-numpy");
    require_package("matplotlib", "python3-matplotlib");
    let dir = tempfile::tempdir().unwrap();
    let sup = with_packages(dir.path(), &["numpy", "matplotlib.pyplot"], true);
    let s = sup.session(SessionConfig::default()).unwrap();
    let r = py_in(
        &s,
        "import sys\nready = 'numpy' in sys.modules and 'matplotlib.pyplot' in sys.modules\n\
         import numpy as np\na = np.arange(1_000_000, dtype=np.float64)\nview = a[::2]\nready",
    )
    .await;
    assert_eq!(r.status, Status::Ok, "{r:?}");
    assert_eq!(r.value, json!(true), "not preloaded: {r:?}");
    assert_eq!(r.state, Some(cellbox::StateOutcome::Kept), "{r:?}");
    let r = py_in(&s, "a *= 2\nfloat(view[1])").await;
    assert_eq!(r.value, json!(4.0), "{r:?}");
    let r = py_in(&s, "a[:] = -1\nraise RuntimeError('undo me')").await;
    assert_eq!(r.state, Some(cellbox::StateOutcome::RolledBack), "{r:?}");
    let r = py_in(&s, "[float(a.sum()), view.base is a, float(view[1])]").await;
    assert_eq!(r.value, json!([999_999_000_000.0, true, 4.0]), "{r:?}");
    let r = py_in(
        &s,
        "import matplotlib.pyplot as plt\nfig, ax = plt.subplots(figsize=(2, 1))\n\
         ax.plot(a[:10])\nplt.close(fig)\n'kept'",
    )
    .await;
    assert_eq!(r.value, json!("kept"), "{r:?}");
    assert!(r.display.is_empty(), "{r:?}");
    // The figure object lives on: drawn on again and rendered a cell later.
    let r = py_in(
        &s,
        "import io\nax.plot(view[:10])\nbuf = io.BytesIO()\nfig.savefig(buf, format='png')\n\
         [buf.getvalue()[:4] == b'\\x89PNG', len(ax.lines), [float(x) for x in fig.get_size_inches()]]",
    )
    .await;
    assert_eq!(r.value, json!([true, 2, [2.0, 1.0]]), "{r:?}");
}
