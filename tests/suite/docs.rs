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
        if text.contains("../shared") {
            problems.push(format!("{name} cites a file outside the repository"));
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
