//! The layers of docs/architecture.md ("Who may know what"), checked on the source: each
//! module of `src/` may name only the modules and the external crates its row allows. One
//! crate holds every layer (the note on issue 18 says why), so this test is what keeps an
//! import from running back up, as crate boundaries would.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// Which of the crate's own modules each top-level module may name (`crate::X`).
fn allowed_modules(module: &str) -> &'static [&'static str] {
    match module {
        // The lowest layer, and the modules every layer shares: they name none but `sync`.
        "sync" => &[],
        "wire" | "stats" | "stop" | "logging" | "unix_socket" => &["sync"],
        "device" => &["wire", "sync"],
        "pipeline" => &["wire", "stats", "sync"],
        "ports" => &[
            "wire",
            "device",
            "pipeline",
            "stats",
            "stop",
            "sync",
            "logging",
            "unix_socket",
        ],
        "control" => &[
            "wire",
            "device",
            "pipeline",
            "ports",
            "stats",
            "stop",
            "sync",
            "logging",
            "unix_socket",
        ],
        "config" => &[
            "wire",
            "device",
            "pipeline",
            "ports",
            "control",
            "stats",
            "sync",
            "logging",
            "unix_socket",
        ],
        // The top: starts everything.
        "daemon" | "lib" | "main" => &[
            "wire",
            "device",
            "pipeline",
            "ports",
            "control",
            "config",
            "daemon",
            "stats",
            "stop",
            "sync",
            "logging",
            "unix_socket",
        ],
        other => {
            panic!("module {other} is in no row of the layer table: add it here and to docs/architecture.md")
        }
    }
}

/// The crates only the vhost-user port may use: guest memory, vrings and the protocol.
const VHOST_CRATES: &[&str] = &["vhost_user_backend", "vhost", "virtio_queue", "vm_memory"];

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The source with comments and string literals blanked (a log line may name a crate).
fn code_only(src: &str) -> String {
    let mut out = String::with_capacity(src.len());
    let mut chars = src.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '/' if chars.peek() == Some(&'/') => {
                for c in chars.by_ref() {
                    if c == '\n' {
                        out.push('\n');
                        break;
                    }
                }
            }
            '"' => {
                let mut escaped = false;
                for c in chars.by_ref() {
                    if !escaped && c == '"' {
                        break;
                    }
                    escaped = !escaped && c == '\\';
                }
                out.push_str("\"\"");
            }
            // A char literal such as '"' must not open a string.
            '\'' => {
                let rest: String = chars.clone().take(3).collect();
                if rest.starts_with("\"'") || rest.starts_with("\\\"'") {
                    let skip = if rest.starts_with("\"'") { 2 } else { 3 };
                    for _ in 0..skip {
                        chars.next();
                    }
                    out.push_str("' '");
                } else {
                    out.push(c);
                }
            }
            _ => out.push(c),
        }
    }
    out
}

/// Every `NAME::` path start in `code` whose NAME is `crate` followed by a module, or an
/// external crate from `crates`.
fn named(code: &str, crates: &[&str]) -> (BTreeSet<String>, BTreeSet<String>) {
    let (mut modules, mut externals) = (BTreeSet::new(), BTreeSet::new());
    let bytes = code.as_bytes();
    let ident = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
    let mut i = 0;
    while i < bytes.len() {
        if ident(bytes[i]) && (i == 0 || (!ident(bytes[i - 1]) && bytes[i - 1] != b':')) {
            let start = i;
            while i < bytes.len() && ident(bytes[i]) {
                i += 1;
            }
            let word = &code[start..i];
            if code[i..].starts_with("::") {
                if word == "crate" {
                    let rest = &code[i + 2..];
                    let m: String = rest
                        .chars()
                        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                        .collect();
                    if !m.is_empty() {
                        modules.insert(m);
                    }
                } else if crates.contains(&word) {
                    externals.insert(word.to_string());
                }
            }
        } else {
            i += 1;
        }
    }
    (modules, externals)
}

#[test]
fn no_module_names_a_layer_above_it_and_only_the_vhost_user_port_names_the_vhost_crates() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    assert!(
        files.len() > 50,
        "found {} files under {}",
        files.len(),
        src.display()
    );
    let mut wrong = Vec::new();
    for f in &files {
        let rel = f.strip_prefix(&src).unwrap();
        let first = rel
            .components()
            .next()
            .unwrap()
            .as_os_str()
            .to_string_lossy()
            .to_string();
        let module = first.trim_end_matches(".rs").to_string();
        let code = code_only(&std::fs::read_to_string(f).unwrap());
        let (modules, externals) = named(&code, VHOST_CRATES);
        for m in modules.iter().filter(|m| **m != module) {
            if !allowed_modules(&module).contains(&m.as_str()) {
                wrong.push(format!(
                    "{}: names crate::{m}, above or beside {module}",
                    rel.display()
                ));
            }
        }
        if !rel.starts_with("ports/vhost_user") {
            for c in &externals {
                wrong.push(format!(
                    "{}: uses {c}, which only ports/vhost_user may",
                    rel.display()
                ));
            }
        }
    }
    assert!(wrong.is_empty(), "layer violations:\n{}", wrong.join("\n"));
}

/// The checker itself: it sees what it must and ignores comments and strings.
#[test]
fn the_checker_finds_paths_and_skips_comments_and_strings() {
    let code = code_only(
        "use crate::ports::tap; // crate::daemon\nlet s = \"vhost::x crate::config\"; let c = '\"'; vm_memory::GuestAddress(0); a::vhost::b;",
    );
    let (modules, externals) = named(&code, VHOST_CRATES);
    assert_eq!(modules.into_iter().collect::<Vec<_>>(), ["ports"]);
    assert_eq!(externals.into_iter().collect::<Vec<_>>(), ["vm_memory"]);
}
