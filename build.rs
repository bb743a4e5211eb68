//! Compile the built-in sandbox profiles into JSON, which loads several
//! times faster than their TOML source: `cellbox exec` loads one on every
//! run. The TOML files stay the source of truth (a unit test checks that
//! both forms give the same profile).

use std::path::Path;

fn main() {
    let out = match std::env::var_os("OUT_DIR") {
        Some(d) => std::path::PathBuf::from(d),
        None => panic!("OUT_DIR is not set"),
    };
    println!("cargo:rerun-if-changed=sandbox-profiles");
    for name in ["rhai", "python", "shell"] {
        let src = Path::new("sandbox-profiles").join(format!("{name}.toml"));
        println!("cargo:rerun-if-changed={}", src.display());
        let text = std::fs::read_to_string(&src)
            .unwrap_or_else(|e| panic!("failed to read {}: {e}", src.display()));
        // A profile that is not valid TOML fails here; its keys and values
        // are checked when the JSON form is loaded (and by the unit tests).
        let value: toml::Value =
            toml::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", src.display()));
        let json =
            serde_json::to_string(&value).unwrap_or_else(|e| panic!("{}: {e}", src.display()));
        let dest = out.join(format!("{name}.json"));
        std::fs::write(&dest, json)
            .unwrap_or_else(|e| panic!("failed to write {}: {e}", dest.display()));
    }
}
