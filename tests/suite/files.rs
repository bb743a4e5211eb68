//! File tools: traversal attacks, special files, caps, .gitignore, search,
//! the workspace, and the tools called from cells under a policy.

use super::common::{bin, config};
use cellbox::files::{FileError, Files, FilesConfig};
use cellbox::{CellRequest, Language, Status, Supervisor};
use serde_json::{json, Value};
use std::os::unix::fs::symlink;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// `outside/secret.txt` beside `root/`, which has a .gitignore, a hidden
/// file, a nested directory, symlinks and a hard link out, a FIFO and a
/// sparse 10 GB file.
fn tree() -> (tempfile::TempDir, std::path::PathBuf) {
    let t = tempfile::tempdir().unwrap();
    let outside = t.path().join("outside");
    let root = t.path().join("root");
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::create_dir_all(root.join("src/deep")).unwrap();
    std::fs::create_dir_all(root.join("target")).unwrap();
    std::fs::write(outside.join("secret.txt"), "TOPSECRET\n").unwrap();
    std::fs::write(root.join(".gitignore"), "target/\n*.log\n").unwrap();
    std::fs::write(root.join("src/.gitignore"), "generated.rs\n").unwrap();
    std::fs::write(
        root.join("src/main.rs"),
        "fn main() {\n    println!(\"needle one\");\n}\n",
    )
    .unwrap();
    std::fs::write(root.join("src/generated.rs"), "needle generated\n").unwrap();
    std::fs::write(
        root.join("src/deep/lib.rs"),
        "pub fn f() {} // needle two\n",
    )
    .unwrap();
    std::fs::write(root.join("target/out.rs"), "needle in target\n").unwrap();
    std::fs::write(root.join("debug.log"), "needle in log\n").unwrap();
    std::fs::write(root.join(".hidden"), "needle hidden\n").unwrap();
    std::fs::write(root.join("bin.dat"), b"needle\0binary").unwrap();
    symlink(outside.join("secret.txt"), root.join("link_out")).unwrap();
    symlink(&outside, root.join("dir_out")).unwrap();
    symlink("src/main.rs", root.join("link_in")).unwrap();
    std::fs::hard_link(outside.join("secret.txt"), root.join("hard_out")).unwrap();
    nix::unistd::mkfifo(
        &root.join("fifo"),
        nix::sys::stat::Mode::from_bits_truncate(0o644),
    )
    .unwrap();
    let big = std::fs::File::create(root.join("big.bin")).unwrap();
    big.set_len(10 << 30).unwrap();
    (t, root)
}

fn files(root: &Path) -> Files {
    Files::open(&FilesConfig {
        roots: vec![root.to_owned()],
        ..FilesConfig::default()
    })
    .unwrap()
}

#[test]
fn files_traversal_is_refused_by_every_trick() {
    let (_t, root) = tree();
    let f = files(&root);
    let outside = root.parent().unwrap().join("outside/secret.txt");
    for (path, want) in [
        ("../outside/secret.txt", "outside"),
        ("src/../../outside/secret.txt", "outside"),
        (outside.to_str().unwrap(), "outside"),
        ("link_out", "outside"),
        ("dir_out/secret.txt", "outside"),
        ("/proc/self/root/etc/passwd", "outside"),
        ("hard_out", "hard links"),
    ] {
        let e = f.read_file(path, None, None).unwrap_err();
        assert!(
            matches!(e, FileError::Outside { .. } | FileError::Hardlinked { .. }),
            "{path}: {e}"
        );
        assert!(e.to_string().contains(want), "{path}: {e}");
    }
    // A symlink that stays inside is followed for a read.
    let v = f.read_file("link_in", None, None).unwrap();
    assert!(v["content"].as_str().unwrap().contains("needle one"));
    // Walks and searches neither follow symlinks nor report what is outside.
    let v = f.search_files("TOPSECRET", ".", None, 100).unwrap();
    assert_eq!(v["matches"], json!([]), "{v}");
    assert!(f.list_dir("dir_out", None).is_err());
}

#[test]
fn files_special_and_huge_files() {
    let (_t, root) = tree();
    let f = files(&root);
    // The FIFO is refused without being opened for reading (an open for
    // reading would block here: nobody writes to it).
    let e = f.read_file("fifo", None, None).unwrap_err();
    assert!(
        matches!(e, FileError::NotRegular { kind: "FIFO", .. }),
        "{e}"
    );
    let e = f.read_file("/dev/null", None, None).unwrap_err();
    assert!(matches!(e, FileError::Outside { .. }), "{e}");
    let e = f.read_file("src", None, None).unwrap_err();
    assert!(
        matches!(
            e,
            FileError::NotRegular {
                kind: "directory",
                ..
            }
        ),
        "{e}"
    );
    // 10 GB (sparse): the first max_read_bytes are read and found binary.
    let v = f.read_file("big.bin", None, None).unwrap();
    assert_eq!(v["binary"], true);
    assert_eq!(v["size"], 10u64 << 30);
    let v = f.read_file("bin.dat", None, None).unwrap();
    assert_eq!(v["binary"], true);
    // A long text file is truncated at the cap, and says so.
    std::fs::write(root.join("long.txt"), "x".repeat(3000)).unwrap();
    let small = Files::open(&FilesConfig {
        roots: vec![root.clone()],
        max_read_bytes: 1000,
        ..FilesConfig::default()
    })
    .unwrap();
    let v = small.read_file("long.txt", None, None).unwrap();
    assert_eq!(v["truncated"], true);
    assert_eq!(v["content"].as_str().unwrap().len(), 1000);
    // Line ranges are 1-based and inclusive.
    let v = f.read_file("src/main.rs", Some(2), Some(3)).unwrap();
    assert_eq!(v["content"], "    println!(\"needle one\");\n}\n");
    assert_eq!(v["total_lines"], 3);
}

#[test]
fn files_search_and_list_respect_gitignore_and_hidden() {
    let (_t, root) = tree();
    let f = files(&root);
    let v = f.search_files("needle", ".", None, 100).unwrap();
    let mut paths: Vec<&str> = v["matches"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["path"].as_str().unwrap())
        .collect();
    paths.sort();
    // Not: target/ and *.log (.gitignore), src/generated.rs (src/.gitignore),
    // .hidden, bin.dat (binary), link_in (a symlink), the FIFO, big.bin.
    assert_eq!(paths, vec!["src/deep/lib.rs", "src/main.rs"], "{v}");
    assert!(v["matches"][0]["line"].as_u64().is_some());
    let v = f.search_files("needle", "src", Some("*.rs"), 1).unwrap();
    assert_eq!(v["matches"].as_array().unwrap().len(), 1);
    assert_eq!(v["truncated"], true);
    let v = f.list_dir(".", None).unwrap();
    let names: Vec<&str> = v["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["path"].as_str().unwrap())
        .collect();
    assert!(
        names.contains(&"src") && names.contains(&"fifo"),
        "{names:?}"
    );
    assert!(
        !names.contains(&"target") && !names.contains(&".hidden") && !names.contains(&"debug.log"),
        "{names:?}"
    );
    let v = f.list_dir(".", Some("**/*.rs")).unwrap();
    let mut names: Vec<&str> = v["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["path"].as_str().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, vec!["src/deep/lib.rs", "src/main.rs"]);
    assert!(matches!(
        f.search_files("(", ".", None, 10),
        Err(FileError::Pattern(_))
    ));
}

#[test]
fn files_search_of_millions_of_matching_lines_is_capped() {
    let t = tempfile::tempdir().unwrap();
    std::fs::write(t.path().join("many.txt"), "hit\n".repeat(2_000_000)).unwrap();
    let f = files(t.path());
    let v = f.search_files("hit", ".", None, 5000).unwrap();
    assert_eq!(v["matches"].as_array().unwrap().len(), 1000);
    assert_eq!(v["truncated"], true);
}

/// A search over many files (searched a chunk at a time on several
/// threads) answers in walk order, as a search of one file after another
/// would: sorted paths, depth first, lines in order, and a search that
/// stops at its limit counts only the files up to the one that filled it.
#[test]
fn files_search_of_many_files_answers_in_walk_order() {
    let t = tempfile::tempdir().unwrap();
    let mut expected = Vec::new();
    for d in 0..7 {
        let dir = t.path().join(format!("d{d}"));
        std::fs::create_dir_all(&dir).unwrap();
        for f in 0..150 {
            let name = format!("d{d}/f{f:03}.txt");
            // Every third file has two hits, one file in each directory is
            // too large, and the others have none.
            if f == 77 {
                std::fs::write(t.path().join(&name), "hit\n".repeat(40)).unwrap();
            } else if f % 3 == 0 {
                std::fs::write(t.path().join(&name), "a\nhit 1\nb\nhit 2\n").unwrap();
                expected.push((name.clone(), 2u64));
                expected.push((name, 4u64));
            } else {
                std::fs::write(t.path().join(&name), "nothing here\n").unwrap();
            }
        }
    }
    let f = Files::open(&FilesConfig {
        roots: vec![t.path().to_path_buf()],
        max_search_file_bytes: 100,
        ..FilesConfig::default()
    })
    .unwrap();
    let got = |v: &Value| -> Vec<(String, u64)> {
        v["matches"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| {
                (
                    m["path"].as_str().unwrap().to_owned(),
                    m["line"].as_u64().unwrap(),
                )
            })
            .collect()
    };
    let v = f.search_files("^hit", ".", None, 1000).unwrap();
    assert_eq!(got(&v), expected, "{v}");
    assert_eq!(v["truncated"], false);
    assert_eq!(v["files_searched"], 7 * 149);
    assert_eq!(v["skipped_large"], 7);
    // 401 matches: the 201st file with hits fills it on its first line.
    // Files before it: d0..d3 (4 x 150, each with one large file) and
    // d4/f000..d4/f003 ... counted from the walk order itself.
    let v = f.search_files("^hit", ".", None, 401).unwrap();
    assert_eq!(got(&v), expected[..401].to_vec(), "{v}");
    assert_eq!(v["truncated"], true);
    let last = &expected[400].0;
    let (d, n): (u64, u64) = (last[1..2].parse().unwrap(), last[4..7].parse().unwrap());
    let large = d + u64::from(n > 77);
    assert_eq!(v["skipped_large"], large, "{v}");
    assert_eq!(v["files_searched"], d * 150 + n + 1 - large, "{v}");
    // With a glob, only the matching files, still in order.
    let v = f
        .search_files("^hit", "d2", Some("f0[0-4]?.txt"), 1000)
        .unwrap();
    let want: Vec<(String, u64)> = expected
        .iter()
        .filter(|(p, _)| p.starts_with("d2/f0") && p.as_bytes()[5] <= b'4')
        .cloned()
        .collect();
    assert_eq!(got(&v), want, "{v}");
}

/// A directory is swapped for a symlink to the outside, over and over,
/// while the tree is searched and listed: nothing outside is ever returned.
#[test]
fn files_walk_race_with_symlink_swap_never_leaves_the_root() {
    let t = tempfile::tempdir().unwrap();
    let root = t.path().join("root");
    let outside = t.path().join("outside");
    std::fs::create_dir_all(root.join("d")).unwrap();
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::write(root.join("d/inside.txt"), "INSIDE\n").unwrap();
    std::fs::write(outside.join("inside.txt"), "TOPSECRET\n").unwrap();
    std::fs::write(outside.join("only_outside.txt"), "TOPSECRET\n").unwrap();
    let f = files(&root);
    let stop = Arc::new(AtomicBool::new(false));
    let swapper = {
        let (stop, root, outside) = (stop.clone(), root.clone(), outside.clone());
        std::thread::spawn(move || {
            let mut swaps = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let _ = std::fs::rename(root.join("d"), root.join("d.real"));
                let _ = symlink(&outside, root.join("d"));
                let _ = std::fs::remove_file(root.join("d"));
                let _ = std::fs::rename(root.join("d.real"), root.join("d"));
                swaps += 1;
            }
            swaps
        })
    };
    let mut seen_inside = 0;
    for _ in 0..2000 {
        let v = f.search_files(".", ".", None, 100).unwrap();
        let s = v.to_string();
        assert!(!s.contains("TOPSECRET"), "{s}");
        seen_inside += s.contains("INSIDE") as u32;
        let v = f.list_dir(".", Some("**")).unwrap().to_string();
        assert!(!v.contains("only_outside"), "{v}");
        if let Ok(v) = f.read_file("d/inside.txt", None, None) {
            assert_eq!(v["content"], "INSIDE\n");
        }
    }
    stop.store(true, Ordering::Relaxed);
    assert!(swapper.join().unwrap() > 0);
    assert!(seen_inside > 0);
}

#[test]
fn files_workspace_write_and_edit() {
    let (t, root) = tree();
    let ws = t.path().join("ws");
    std::fs::create_dir(&ws).unwrap();
    std::fs::hard_link(
        root.parent().unwrap().join("outside/secret.txt"),
        ws.join("hard"),
    )
    .unwrap();
    symlink(root.parent().unwrap().join("outside"), ws.join("out")).unwrap();
    let f = Files::open(&FilesConfig {
        roots: vec![root.clone()],
        workspace: Some(ws.clone()),
        max_write_bytes: 100,
        ..FilesConfig::default()
    })
    .unwrap();
    // Two roots: paths start with the root's name.
    let v = f.write_file("ws/a/b/new.txt", "hello world\n").unwrap();
    assert_eq!(v["path"], "ws/a/b/new.txt");
    assert_eq!(
        std::fs::read_to_string(ws.join("a/b/new.txt")).unwrap(),
        "hello world\n"
    );
    f.edit_file("ws/a/b/new.txt", "world", "there").unwrap();
    assert_eq!(
        std::fs::read_to_string(ws.join("a/b/new.txt")).unwrap(),
        "hello there\n"
    );
    f.write_file("ws/two.txt", "x x").unwrap();
    assert!(matches!(
        f.edit_file("ws/two.txt", "x", "y"),
        Err(FileError::EditMatch { count: 2, .. })
    ));
    assert!(matches!(
        f.edit_file("ws/two.txt", "z", "y"),
        Err(FileError::EditMatch { count: 0, .. })
    ));
    assert!(matches!(
        f.write_file("root/x.txt", "no"),
        Err(FileError::ReadOnly { .. })
    ));
    assert!(matches!(
        f.write_file("ws/big.txt", &"y".repeat(101)),
        Err(FileError::TooLarge { .. })
    ));
    assert!(matches!(
        f.write_file("ws/hard", "pwned"),
        Err(FileError::Hardlinked { .. })
    ));
    assert!(matches!(
        f.write_file("ws/out/secret.txt", "pwned"),
        Err(FileError::Symlink { .. })
    ));
    assert!(matches!(
        f.write_file("ws/../outside/x", "pwned"),
        Err(FileError::Outside { .. })
    ));
    assert!(matches!(
        f.read_file("nope/x", None, None),
        Err(FileError::UnknownRoot { .. })
    ));
    assert_eq!(
        std::fs::read_to_string(root.parent().unwrap().join("outside/secret.txt")).unwrap(),
        "TOPSECRET\n"
    );
    assert!(!root.parent().unwrap().join("outside/x").exists());
    assert_eq!(
        f.read_file("root/src/main.rs", Some(1), Some(1)).unwrap()["content"],
        "fn main() {\n"
    );
}

fn tools_supervisor(root: &Path) -> Supervisor {
    let mut b = Supervisor::builder().worker_exe(bin());
    for cap in cellbox::tools::host_capabilities(&FilesConfig {
        roots: vec![root.to_owned()],
        ..FilesConfig::default()
    })
    .unwrap()
    {
        b = b.capability(cap).unwrap();
    }
    b.build().unwrap()
}

/// A Python cell searches, reads and aggregates under a policy; each call is
/// recorded; a tool outside the policy is absent from the cell's names, and
/// called through `capabilities` it is denied with a catchable error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_tools_from_python_and_rhai_cells_under_policy() {
    let (_t, root) = tree();
    let sup = tools_supervisor(&root);
    let code = r#"
hits = search_files("needle", glob="*.rs")
reads = [read_file(m["path"]) for m in hits["matches"]]
ctx = aggregate_context(reads + [hits], "needle two", 60)
try:
    list_dir(".")
    absent = False
except NameError:
    absent = True
try:
    capabilities.list_dir(".")
    denied = None
except PermissionError as e:
    denied = str(e)
try:
    read_file("../outside/secret.txt")
    outside = None
except RuntimeError as e:
    outside = str(e)
{"n": len(hits["matches"]), "top": ctx["included"][0]["source"], "tokens": ctx["tokens"],
 "absent": absent, "denied": denied, "outside": outside}
"#;
    let r = sup
        .run(
            CellRequest::new(Language::Python, code),
            config(&["search_files", "read_file", "aggregate_context"]),
        )
        .await;
    assert_eq!(r.status, Status::Ok, "{r:?}");
    let v: &Value = &r.value;
    assert_eq!(v["n"], 2);
    assert_eq!(v["top"], "src/deep/lib.rs:1-1", "{v}");
    assert!(v["tokens"].as_u64().unwrap() <= 60);
    assert_eq!(v["absent"], true, "{v}");
    assert!(v["denied"].as_str().unwrap().contains("not allowed"), "{v}");
    assert!(
        v["outside"].as_str().unwrap().contains("outside the root"),
        "{v}"
    );
    let caps: Vec<(&str, &str)> = r
        .calls
        .iter()
        .map(|c| (c.cap.as_str(), c.outcome.as_str()))
        .collect();
    assert!(caps.contains(&("list_dir", "denied")), "{caps:?}");
    assert!(caps.contains(&("read_file", "failed")), "{caps:?}");
    assert_eq!(
        caps.iter().filter(|c| **c == ("read_file", "ok")).count(),
        2
    );

    let r = sup
        .run(
            CellRequest::new(Language::Rhai, r#"read_file("src/main.rs", 1, 1).content"#),
            config(&["read_file"]),
        )
        .await;
    assert_eq!(r.status, Status::Ok, "{r:?}");
    assert_eq!(r.value, json!("fn main() {\n"));
}

/// `cellbox run --config` offers the file tools of the file's `[files]` to
/// the cell, as `serve` does, under the file's policy.
#[test]
fn files_tools_from_cellbox_run_with_a_config_file() {
    let t = tempfile::tempdir().unwrap();
    let root = t.path().join("proj");
    std::fs::create_dir(&root).unwrap();
    std::fs::write(root.join("notes.txt"), "alpha\nbeta\n").unwrap();
    std::fs::write(t.path().join("secret"), "no").unwrap();
    let cfg = t.path().join("cellbox.toml");
    std::fs::write(
        &cfg,
        format!(
            "[server]\npython = \"/usr/bin/python3\"\n\
             [policy]\nallow = [\"read_file\"]\n\
             [files]\nroots = [{:?}]\n",
            root.to_str().unwrap()
        ),
    )
    .unwrap();
    let code = "print(read_file('notes.txt', start_line=2)['content'], end='')\n\
                try:\n    read_file('../secret')\nexcept Exception as e:\n    print('refused:', e)\n\
                try:\n    list_dir('.')\nexcept Exception as e:\n    print('denied:', type(e).__name__)\n";
    let out = super::common::cellbox(
        &[
            "run",
            "--config",
            cfg.to_str().unwrap(),
            "--lang",
            "python",
            "-",
        ],
        Some(code),
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let mut lines = stdout.lines();
    assert_eq!(lines.next(), Some("beta"), "{stdout}");
    let refused = lines.next().unwrap_or_default();
    assert!(
        refused.starts_with("refused:") && refused.contains("outside the root"),
        "{stdout}"
    );
    assert!(
        lines.next().unwrap_or_default().starts_with("denied:"),
        "{stdout}"
    );
}
