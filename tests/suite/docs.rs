//! The repository's documents hold together: every document a source file
//! cites exists in the repository, and the code cites the project's own
//! design document (`docs/architecture.md`) by sections it has.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Every file beneath `dir` whose name ends in one of `exts`.
fn files(dir: &Path, exts: &[&str], out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files(&path, exts, out);
        } else if exts
            .iter()
            .any(|e| path.extension().is_some_and(|x| x == *e))
        {
            out.push(path);
        }
    }
}

fn sources() -> Vec<PathBuf> {
    let mut out = Vec::new();
    for dir in ["src", "tests", "security-tests"] {
        files(
            &root().join(dir),
            &["rs", "py", "toml", "md", "sh"],
            &mut out,
        );
    }
    assert!(out.len() > 100, "found only {} source files", out.len());
    out
}

/// The `## N.` section numbers of docs/architecture.md.
fn architecture_sections() -> BTreeSet<u32> {
    let text = std::fs::read_to_string(root().join("docs/architecture.md")).unwrap();
    text.lines()
        .filter_map(|l| l.strip_prefix("## "))
        .filter_map(|l| l.split('.').next()?.parse().ok())
        .collect()
}

#[test]
fn every_cited_document_is_in_the_repository() {
    let sections = architecture_sections();
    assert!(sections.len() >= 9, "sections {sections:?}");
    let mut problems = Vec::new();
    let mut cited_sections = 0;
    for file in sources() {
        let text = std::fs::read_to_string(&file).unwrap();
        let name = file.strip_prefix(root()).unwrap().display().to_string();
        if name == "tests/suite/docs.rs" {
            continue; // this test spells the patterns it looks for
        }
        if text.contains("DESIGN §") || text.contains("DESIGN.md") {
            problems.push(format!("{name} cites DESIGN, which the repository lacks"));
        }
        // `../shared/...` is outside the repository unless it resolves to a
        // file in it, relative to the citing file (`tests/shared/`).
        for (at, _) in text.match_indices("../shared") {
            let rest = &text[at..];
            let end = rest
                .find(|c: char| !(c.is_ascii_alphanumeric() || "/-_.".contains(c)))
                .unwrap_or(rest.len());
            let cited = file.parent().unwrap().join(&rest[..end]);
            let inside = cited
                .canonicalize()
                .is_ok_and(|c| c.starts_with(root()) && c.is_file());
            if !inside {
                problems.push(format!("{name} cites a file outside the repository"));
            }
        }
        // `docs/NAME.md` and `docs/NAME.md §N` must exist.
        for (at, _) in text.match_indices("docs/") {
            let rest = &text[at..];
            let end = rest
                .find(|c: char| !(c.is_ascii_alphanumeric() || "/-_.".contains(c)))
                .unwrap_or(rest.len());
            let cited = rest[..end].trim_end_matches('.');
            if !cited.ends_with(".md") {
                continue;
            }
            if !root().join(cited).is_file() {
                problems.push(format!("{name} cites {cited}, which does not exist"));
            }
            if cited == "docs/architecture.md" {
                let after = rest[end..].trim_start();
                if let Some(num) = after.strip_prefix('§') {
                    let digits: String = num.chars().take_while(char::is_ascii_digit).collect();
                    cited_sections += 1;
                    match digits.parse::<u32>() {
                        Ok(n) if sections.contains(&n) => {}
                        _ => problems.push(format!(
                            "{name} cites docs/architecture.md §{digits}, which has no such section"
                        )),
                    }
                }
            }
        }
    }
    assert!(
        cited_sections > 5,
        "only {cited_sections} section citations found"
    );
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// The README stays a front page: under 20 KB, and its first commands are
/// the two CI and a newcomer run first, exactly as they were.
#[test]
fn the_readme_is_short_and_starts_with_its_two_commands() {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    assert!(
        readme.len() <= 20 * 1024,
        "README is {} bytes",
        readme.len()
    );
    let first: Vec<&str> = readme.lines().skip(3).take(2).collect();
    assert_eq!(
        first,
        [
            "cargo run --release -- run examples/hello.rhai    # run one sandboxed cell",
            "cargo test --profile test-release                 # run every test (unit, integration, security suite)",
        ]
    );
}

/// Every relative link of the README and of docs/ names a file that exists.
#[test]
fn every_relative_link_of_the_documents_resolves() {
    let mut docs = vec![root().join("README.md")];
    files(&root().join("docs"), &["md"], &mut docs);
    let mut problems = Vec::new();
    for doc in &docs {
        let text = std::fs::read_to_string(doc).unwrap();
        let dir = doc.parent().unwrap();
        for (at, _) in text.match_indices("](") {
            let rest = &text[at + 2..];
            let Some(end) = rest.find(')') else { continue };
            let target = rest[..end].split('#').next().unwrap_or("");
            if target.is_empty() || target.contains("://") || target.contains(' ') {
                continue;
            }
            let path = dir.join(target);
            if !path.exists() {
                problems.push(format!("{}: {target}", doc.display()));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// The shell commands of the README's `sh` blocks, comments cut.
fn readme_commands() -> Vec<String> {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let mut out = Vec::new();
    let mut in_sh = false;
    for line in readme.lines() {
        if line.starts_with("```") {
            in_sh = !in_sh && line == "```sh";
            continue;
        }
        if in_sh {
            let command = match line.find("  #") {
                Some(i) => &line[..i],
                None => line,
            };
            let command = command.trim();
            if !command.is_empty() {
                out.push(command.to_owned());
            }
        }
    }
    out
}

/// Every command in the README runs as written. `cellbox ...` lines (with
/// an `echo '...' |` in front, that text as stdin) run with the binary
/// this build made, from the repository's root, and must succeed.
/// Commands that build (`cargo install`, `cargo run --release`, `cargo
/// test`) take many minutes, so their arguments are checked instead:
/// `cargo install`'s against `cargo install --help` and the manifest,
/// `cargo run --release -- ARGS` by running `cellbox ARGS`, the test
/// profile against Cargo.toml. A command with no rule here fails the test.
#[test]
fn the_readmes_commands_run_as_written() {
    let commands = readme_commands();
    assert!(commands.len() >= 8, "{commands:?}");
    let manifest = std::fs::read_to_string(root().join("Cargo.toml")).unwrap();
    let run_cellbox = |args: &[String], stdin: Option<&str>, shown: &str| {
        use std::io::Write;
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_cellbox"))
            .args(args)
            .current_dir(root())
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut input = child.stdin.take().unwrap();
        if let Some(text) = stdin {
            writeln!(input, "{text}").unwrap();
        }
        drop(input);
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "{shown}: {}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    };
    for command in &commands {
        let (stdin, rest) = match command.strip_prefix("echo '") {
            Some(r) => {
                let (text, after) = r.split_once("' | ").expect("echo '...' | command");
                (Some(text), after)
            }
            None => (None, command.as_str()),
        };
        let words = shlex(rest);
        match words.iter().map(String::as_str).collect::<Vec<_>>()[..] {
            ["cellbox", ..] => run_cellbox(&words[1..], stdin, command),
            ["cargo", "run", "--release", "--", ..] => run_cellbox(&words[4..], stdin, command),
            ["cargo", "test", "--profile", profile] => {
                assert!(
                    manifest.contains(&format!("[profile.{profile}]")),
                    "{command}"
                );
            }
            ["cargo", "install", ref flags @ ..] => {
                let help = std::process::Command::new("cargo")
                    .args(["install", "--help"])
                    .output()
                    .unwrap();
                let help = String::from_utf8_lossy(&help.stdout).into_owned();
                for flag in flags.iter().filter(|f| f.starts_with("--")) {
                    assert!(
                        help.contains(flag),
                        "{command}: cargo install has no {flag}"
                    );
                }
                assert!(flags.contains(&"--path"), "{command}");
                assert!(manifest.contains("name = \"cellbox\""), "{command}");
            }
            _ => panic!("no rule to check the README command {command:?}"),
        }
    }
}

/// Words of a command line: single quotes group, as sh does.
fn shlex(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut word = String::new();
    let mut quoted = false;
    for c in line.chars() {
        match c {
            '\'' => quoted = !quoted,
            ' ' if !quoted => {
                if !word.is_empty() {
                    out.push(std::mem::take(&mut word));
                }
            }
            c => word.push(c),
        }
    }
    if !word.is_empty() {
        out.push(word);
    }
    out
}

/// Dotted names (`server.languages`) of every key in `v`, a TOML table.
fn keys(prefix: &str, v: &toml::Value, out: &mut Vec<String>) {
    if let toml::Value::Table(t) = v {
        for (k, v) in t {
            let name = if prefix.is_empty() {
                k.clone()
            } else {
                format!("{prefix}.{k}")
            };
            if prefix.is_empty() {
                keys(&name, v, out);
            } else {
                out.push(name);
            }
        }
    }
}

/// docs/configuration.md names every key the server's parser knows (each
/// key of its defaults, under its section), and the example it shows is
/// one the parser takes.
#[test]
fn the_configuration_reference_names_every_key() {
    let defaults = toml::Value::try_from(cellbox::serve::ServeConfig::default()).unwrap();
    let mut all = Vec::new();
    keys("", &defaults, &mut all);
    assert!(all.len() > 30, "{all:?}");
    let reference = std::fs::read_to_string(root().join("docs/configuration.md")).unwrap();
    let mut missing = Vec::new();
    for dotted in &all {
        let (section, key) = dotted.split_once('.').unwrap();
        let Some(at) = reference.find(&format!("## [{section}]")) else {
            missing.push(format!("section [{section}]"));
            continue;
        };
        let body = &reference[at..];
        let body = &body[..body[3..].find("\n## ").map_or(body.len(), |i| i + 3)];
        if !body.contains(&format!("{key} =")) && !body.contains(&format!("`{key}`")) {
            missing.push(dotted.clone());
        }
    }
    assert!(
        missing.is_empty(),
        "not in docs/configuration.md: {missing:?}"
    );
    let example = std::fs::read_to_string(root().join("examples/cellbox.toml")).unwrap();
    let c: cellbox::serve::ServeConfig = toml::from_str(&example).unwrap();
    c.validate().unwrap();

    // Every block of the reference is the example's own text, so the two
    // cannot drift apart.
    let mut blocks = 0;
    for block in reference.split("```toml\n").skip(1) {
        let block = &block[..block.find("```").unwrap()];
        assert!(
            example.contains(block),
            "this block of docs/configuration.md is not in examples/cellbox.toml:\n{block}"
        );
        blocks += 1;
    }
    assert!(blocks >= 10, "{blocks} toml blocks");
}

/// examples/cellbox.toml holds every section, and each value it sets is
/// the default, but in the sections it marks as examples (models, tools).
#[test]
fn the_example_config_holds_every_section_at_its_defaults() {
    let example = std::fs::read_to_string(root().join("examples/cellbox.toml")).unwrap();
    let example: toml::Value = toml::from_str(&example).unwrap();
    let defaults = toml::Value::try_from(cellbox::serve::ServeConfig::default()).unwrap();
    let (toml::Value::Table(example), toml::Value::Table(defaults)) = (example, defaults) else {
        panic!("not tables");
    };
    let sections: Vec<&String> = defaults.keys().collect();
    for section in &sections {
        assert!(
            example.contains_key(*section),
            "no [{section}] in the example"
        );
    }
    let mut differ = Vec::new();
    for (section, table) in &example {
        if section == "models" || section == "tools" {
            assert!(
                table.as_table().is_some_and(|t| !t.is_empty()),
                "the example declares no [{section}.NAME]"
            );
            continue;
        }
        let toml::Value::Table(table) = table else {
            panic!("[{section}] is not a table");
        };
        for (key, value) in table {
            // A profile left out is the built-in one of the language's name.
            let builtin = section == "profiles" && value.as_str() == Some(key.as_str());
            if defaults[section].get(key) != Some(value) && !builtin {
                differ.push(format!(
                    "{section}.{key} = {value} (default: {:?})",
                    defaults[section].get(key)
                ));
            }
        }
    }
    assert!(differ.is_empty(), "not the defaults: {differ:?}");
    let tools = example["tools"].as_table().unwrap();
    for kind in ["command", "http", "mcp"] {
        assert!(
            tools
                .values()
                .any(|t| t.get("kind").and_then(|k| k.as_str()) == Some(kind)),
            "no tool of kind {kind} in the example"
        );
    }
}

/// The speed log has one dated heading per entry (`## YYYY-MM-DD...`).
#[test]
fn every_speed_log_entry_has_a_dated_heading() {
    let log = std::fs::read_to_string(root().join("docs/speed-log.md")).unwrap();
    let headings: Vec<&str> = log.lines().filter(|l| l.starts_with("## ")).collect();
    assert!(headings.len() > 10, "{headings:?}");
    for h in &headings {
        let date = &h[3..h.len().min(13)];
        let ok = date.len() == 10
            && date.chars().enumerate().all(|(i, c)| {
                if i == 4 || i == 7 {
                    c == '-'
                } else {
                    c.is_ascii_digit()
                }
            });
        assert!(ok, "an undated heading: {h}");
    }
    assert!(
        !log.lines().any(|l| l.starts_with("**20")),
        "an entry begins with a bold date instead of a heading"
    );
}
