//! The layers of docs/architecture.md ("Layers"), checked on the source as the compiler sees
//! it: every file of `src/` is parsed (syn), and every path it names, in `use` items, in
//! code and in macro arguments, is resolved to the file that defines it. Then:
//! - a file names only the rows and external crates its row allows ([`ROWS`]);
//! - no two files name each other, directly or round a longer circle (an import from a
//!   folder's `mod.rs`, which re-exports its files, counts as naming that `mod.rs`);
//! - the table in docs/architecture.md is the one enforced here;
//! - no file has more than 600 lines before its tests, and no function more than 80.
//!
//! One crate holds every layer (docs/architecture.md says why), so this test is what keeps
//! an import from running back up, as crate boundaries would.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use proc_macro2::{TokenStream, TokenTree};
use syn::visit::Visit;

/// A row of the layer table: the files it holds (a path prefix under `src/`), the rows
/// whose files it may name, and the external crates it may use beside [`EVERYWHERE`].
struct Row {
    name: &'static str,
    prefixes: &'static [&'static str],
    may_name: &'static [&'static str],
    crates: &'static [&'static str],
}

/// External crates any row may use: errors and logging.
const EVERYWHERE: &[&str] = &["thiserror", "log"];

/// The layer table, lowest row first. docs/architecture.md shows the same table.
const ROWS: &[Row] = &[
    Row {
        name: "sync",
        prefixes: &["sync.rs"],
        may_name: &[],
        crates: &[],
    },
    Row {
        name: "wire",
        prefixes: &["wire/"],
        may_name: &["sync"],
        crates: &["zerocopy", "serde"],
    },
    Row {
        name: "shared",
        prefixes: &[
            "stats.rs",
            "counter.rs",
            "histogram.rs",
            "stop.rs",
            "logging.rs",
            "unix_socket.rs",
        ],
        may_name: &["sync"],
        crates: &["serde", "env_logger", "libc", "nix", "socket2", "tempfile"],
    },
    Row {
        name: "device",
        prefixes: &["device/"],
        may_name: &["wire", "sync"],
        crates: &[
            "virtio_bindings",
            "ahash",
            "arc_swap",
            "serde",
            "crc32c",
            "zerocopy",
        ],
    },
    Row {
        name: "pipeline",
        prefixes: &["pipeline/"],
        may_name: &["wire", "shared", "sync"],
        // vm_memory for `VolatileSlice` only: the part of a burst frame still in the
        // sender's guest memory (pipeline/packet.rs), copied and never read for a decision.
        crates: &[
            "ahash",
            "arc_swap",
            "arrayvec",
            "crc32c",
            "ipnet",
            "serde",
            "vm_memory",
            "crossbeam_queue",
        ],
    },
    Row {
        name: "ports",
        prefixes: &["ports/mod.rs", "ports/arena.rs", "ports/poll.rs"],
        may_name: &["shared", "sync"],
        crates: &["nix"],
    },
    Row {
        name: "tap",
        prefixes: &["ports/tap.rs"],
        may_name: &["ports", "pipeline", "wire", "shared", "sync"],
        crates: &["libc", "vmm_sys_util"],
    },
    Row {
        name: "vhost_user",
        prefixes: &["ports/vhost_user/"],
        may_name: &["ports", "device", "pipeline", "wire", "shared", "sync"],
        crates: &[
            "vhost",
            "vhost_user_backend",
            "virtio_queue",
            "vm_memory",
            "vmm_sys_util",
            "virtio_bindings",
            "arc_swap",
            "arrayvec",
            "libc",
            "tempfile",
        ],
    },
    Row {
        name: "control",
        prefixes: &["control/", "config.rs", "cli.rs"],
        may_name: &[
            "ports",
            "tap",
            "vhost_user",
            "device",
            "pipeline",
            "wire",
            "shared",
            "sync",
        ],
        crates: &[
            "serde",
            "serde_json",
            "httparse",
            "mio",
            "comfy_table",
            "socket2",
            "libc",
            "nix",
            "clap",
            "clap_complete",
            "clap_mangen",
            "ipnet",
            "arc_swap",
            "pcap_file",
        ],
    },
    Row {
        name: "daemon",
        prefixes: &["daemon.rs", "main.rs", "lib.rs"],
        may_name: &[
            "control",
            "ports",
            "tap",
            "vhost_user",
            "device",
            "pipeline",
            "wire",
            "shared",
            "sync",
        ],
        crates: &[
            "signal_hook",
            "sd_notify",
            "libc",
            "nix",
            "env_logger",
            "clap",
            "clap_complete",
            "clap_mangen",
        ],
    },
];

/// The external crates the package depends on, by the name code uses.
fn dependencies() -> BTreeSet<String> {
    let toml = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml")).unwrap();
    let deps = toml.split("[dependencies]").nth(1).unwrap();
    let deps = deps.split("\n[").next().unwrap();
    deps.lines()
        .filter_map(|l| l.split_once('=').map(|(k, _)| k.trim().replace('-', "_")))
        .filter(|k| !k.is_empty() && !k.starts_with('#'))
        .collect()
}

fn row_of(rel: &str) -> &'static Row {
    ROWS.iter()
        .find(|r| {
            r.prefixes
                .iter()
                .any(|p| rel == *p || (p.ends_with('/') && rel.starts_with(p)))
        })
        .unwrap_or_else(|| {
            panic!("src/{rel} is in no row of the layer table: add it to ROWS and to docs/architecture.md")
        })
}

/// A file of `src/`: its path under `src/` and the module path it defines.
struct SrcFile {
    rel: String,
    module: Vec<String>,
    text: String,
}

fn src_files() -> Vec<SrcFile> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for e in std::fs::read_dir(dir).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                walk(&p, out);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut paths = Vec::new();
    walk(&src, &mut paths);
    paths.sort();
    paths
        .into_iter()
        .map(|p| {
            let rel = p.strip_prefix(&src).unwrap().to_string_lossy().to_string();
            let mut module: Vec<String> = rel.trim_end_matches(".rs").split('/').map(String::from).collect();
            if module.last().is_some_and(|m| m == "mod" || m == "lib") {
                module.pop();
            }
            SrcFile {
                rel,
                module,
                text: std::fs::read_to_string(&p).unwrap(),
            }
        })
        .collect()
}

/// Every path a file names: crate-relative module paths resolved to absolute ones, and the
/// external crates it uses.
#[derive(Default)]
struct Named {
    internal: BTreeSet<Vec<String>>,
    external: BTreeSet<String>,
}

struct Collector<'a> {
    deps: &'a BTreeSet<String>,
    /// Every module a file of `src/` defines: a relative `use child::X` names one.
    modules: &'a BTreeSet<Vec<String>>,
    /// The module the code being visited is in (inline `mod` blocks pushed).
    module: Vec<String>,
    /// The main binary names the library by its crate name.
    is_main: bool,
    named: Named,
}

impl Collector<'_> {
    /// Records a path given as its segments, as seen from the current module.
    fn path(&mut self, segs: &[String]) {
        let Some(first) = segs.first() else { return };
        let mut abs: Vec<String> = match first.as_str() {
            "crate" => Vec::new(),
            "dpaa_vnic" if self.is_main => Vec::new(),
            "self" => self.module.clone(),
            "super" => {
                let mut m = self.module.clone();
                let mut rest = segs;
                while rest.first().is_some_and(|s| s == "super") {
                    m.pop();
                    rest = &rest[1..];
                }
                m.extend(rest.iter().cloned());
                self.named.internal.insert(m);
                return;
            }
            f if self.deps.contains(f) => {
                self.named.external.insert(f.to_string());
                return;
            }
            f => {
                let mut child = self.module.clone();
                child.push(f.to_string());
                if !self.modules.contains(&child) {
                    return;
                }
                child
            }
        };
        abs.extend(segs[1..].iter().cloned());
        self.named.internal.insert(abs);
    }

    fn use_tree(&mut self, prefix: &mut Vec<String>, t: &syn::UseTree) {
        match t {
            syn::UseTree::Path(p) => {
                prefix.push(p.ident.to_string());
                self.use_tree(prefix, &p.tree);
                prefix.pop();
            }
            syn::UseTree::Name(n) => {
                let mut v = prefix.clone();
                if n.ident != "self" {
                    v.push(n.ident.to_string());
                }
                self.path(&v);
            }
            syn::UseTree::Rename(r) => {
                let mut v = prefix.clone();
                if r.ident != "self" {
                    v.push(r.ident.to_string());
                }
                self.path(&v);
            }
            syn::UseTree::Glob(_) => self.path(&prefix.clone()),
            syn::UseTree::Group(g) => {
                for t in &g.items {
                    self.use_tree(prefix, t);
                }
            }
        }
    }

    /// Paths inside macro arguments, which syn leaves as tokens: `a::b` sequences.
    fn tokens(&mut self, ts: TokenStream) {
        let toks: Vec<TokenTree> = ts.into_iter().collect();
        let mut i = 0;
        while i < toks.len() {
            match &toks[i] {
                TokenTree::Group(g) => self.tokens(g.stream()),
                TokenTree::Ident(id) => {
                    let mut segs = vec![id.to_string()];
                    let mut j = i;
                    while let (
                        Some(TokenTree::Punct(a)),
                        Some(TokenTree::Punct(b)),
                        Some(TokenTree::Ident(n)),
                    ) = (toks.get(j + 1), toks.get(j + 2), toks.get(j + 3))
                    {
                        if a.as_char() != ':' || b.as_char() != ':' {
                            break;
                        }
                        segs.push(n.to_string());
                        j += 3;
                    }
                    let preceded = i >= 2
                        && matches!((&toks[i - 1], &toks[i - 2]), (TokenTree::Punct(a), TokenTree::Punct(b)) if a.as_char() == ':' && b.as_char() == ':');
                    if segs.len() > 1 && !preceded {
                        self.path(&segs);
                    }
                    i = j;
                }
                _ => {}
            }
            i += 1;
        }
    }
}

impl<'ast> Visit<'ast> for Collector<'_> {
    fn visit_item_use(&mut self, u: &'ast syn::ItemUse) {
        self.use_tree(&mut Vec::new(), &u.tree);
    }

    fn visit_item_mod(&mut self, m: &'ast syn::ItemMod) {
        if m.content.is_some() {
            self.module.push(m.ident.to_string());
            syn::visit::visit_item_mod(self, m);
            self.module.pop();
        }
    }

    fn visit_path(&mut self, p: &'ast syn::Path) {
        let segs: Vec<String> = p.segments.iter().map(|s| s.ident.to_string()).collect();
        if p.leading_colon.is_none() && segs.len() > 1 {
            self.path(&segs);
        }
        syn::visit::visit_path(self, p);
    }

    fn visit_macro(&mut self, m: &'ast syn::Macro) {
        self.tokens(m.tokens.clone());
        syn::visit::visit_macro(self, m);
    }
}

fn names(f: &SrcFile, deps: &BTreeSet<String>, modules: &BTreeSet<Vec<String>>) -> Named {
    let ast = syn::parse_file(&f.text).unwrap_or_else(|e| panic!("src/{}: {e}", f.rel));
    let mut c = Collector {
        deps,
        modules,
        module: f.module.clone(),
        is_main: f.rel == "main.rs",
        named: Named::default(),
    };
    if c.is_main {
        c.module = Vec::new();
    }
    c.visit_file(&ast);
    c.named
}

fn modules(files: &[SrcFile]) -> BTreeSet<Vec<String>> {
    files
        .iter()
        .filter(|f| f.rel != "main.rs")
        .map(|f| f.module.clone())
        .collect()
}

/// The file whose module holds `path` (the longest module prefix that is a file), if any.
fn file_of<'a>(path: &[String], files: &'a [SrcFile]) -> Option<&'a SrcFile> {
    (1..=path.len())
        .rev()
        .find_map(|n| files.iter().find(|f| f.rel != "main.rs" && f.module == path[..n]))
}

#[test]
fn every_file_names_only_what_its_row_allows() {
    let files = src_files();
    let deps = dependencies();
    let modules = modules(&files);
    assert!(files.len() > 50, "found {} files", files.len());
    let mut wrong = Vec::new();
    for f in &files {
        let row = row_of(&f.rel);
        let named = names(f, &deps, &modules);
        for p in &named.internal {
            let Some(target) = file_of(p, &files) else {
                continue;
            };
            let to = row_of(&target.rel);
            if to.name != row.name && !row.may_name.contains(&to.name) {
                wrong.push(format!(
                    "src/{} ({}) names {} in src/{} ({})",
                    f.rel,
                    row.name,
                    p.join("::"),
                    target.rel,
                    to.name
                ));
            }
        }
        for c in &named.external {
            if !EVERYWHERE.contains(&c.as_str()) && !row.crates.contains(&c.as_str()) {
                wrong.push(format!("src/{} ({}) uses the crate {c}", f.rel, row.name));
            }
        }
    }
    assert!(wrong.is_empty(), "layer violations:\n{}", wrong.join("\n"));
}

/// Strongly connected sets of files that name each other, found by Tarjan's algorithm.
fn circles(edges: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct T<'a> {
        edges: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on: BTreeSet<&'a str>,
        out: Vec<Vec<String>>,
    }
    fn visit<'a>(t: &mut T<'a>, v: &'a str) {
        let i = t.index.len();
        t.index.insert(v, i);
        t.low.insert(v, i);
        t.stack.push(v);
        t.on.insert(v);
        for w in t.edges.get(v).into_iter().flatten() {
            let w = w.as_str();
            if !t.index.contains_key(w) {
                visit(t, w);
                let lw = t.low[w];
                let lv = t.low.get_mut(v).unwrap();
                *lv = (*lv).min(lw);
            } else if t.on.contains(w) {
                let iw = t.index[w];
                let lv = t.low.get_mut(v).unwrap();
                *lv = (*lv).min(iw);
            }
        }
        if t.low[v] == t.index[v] {
            let mut scc = Vec::new();
            while let Some(w) = t.stack.pop() {
                t.on.remove(w);
                scc.push(w.to_string());
                if w == v {
                    break;
                }
            }
            if scc.len() > 1 {
                scc.sort();
                t.out.push(scc);
            }
        }
    }
    let mut t = T {
        edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        out: Vec::new(),
    };
    for v in edges.keys() {
        if !t.index.contains_key(v.as_str()) {
            visit(&mut t, v);
        }
    }
    t.out
}

#[test]
fn no_two_files_name_each_other() {
    let files = src_files();
    let deps = dependencies();
    let modules = modules(&files);
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for f in files.iter().filter(|f| f.rel != "main.rs") {
        let out = edges.entry(f.rel.clone()).or_default();
        for p in &names(f, &deps, &modules).internal {
            if let Some(t) = file_of(p, &files) {
                if t.rel != f.rel {
                    out.insert(t.rel.clone());
                }
            }
        }
    }
    let found = circles(&edges);
    assert!(
        found.is_empty(),
        "files that name each other (import siblings directly, not through their mod.rs):\n{}",
        found
            .iter()
            .map(|c| c.join(" <-> "))
            .collect::<Vec<_>>()
            .join("\n")
    );
}

/// No file names its own folder's `mod.rs`, or an enclosing folder's: it names the file
/// that defines what it needs (the `mod.rs` re-exports are for the layers above).
#[test]
fn no_import_runs_back_up_to_a_mod_rs() {
    let files = src_files();
    let deps = dependencies();
    let modules = modules(&files);
    let mut wrong = Vec::new();
    for f in files.iter().filter(|f| f.rel != "main.rs") {
        let dir = f.rel.rsplit_once('/').map_or("", |(d, _)| d);
        for p in &names(f, &deps, &modules).internal {
            let Some(t) = file_of(p, &files) else { continue };
            let up = t
                .rel
                .strip_suffix("mod.rs")
                .is_some_and(|d| dir.starts_with(d.trim_end_matches('/')));
            if t.rel != f.rel && up {
                wrong.push(format!(
                    "src/{} names {} through src/{}",
                    f.rel,
                    p.join("::"),
                    t.rel
                ));
            }
        }
    }
    assert!(wrong.is_empty(), "imports running back up:\n{}", wrong.join("\n"));
}

/// A folder's `mod.rs` (and the crate root) only declares its modules and re-exports: what
/// a file of the folder needs from another, it names in that file, so no import runs back
/// up to the folder's front door.
#[test]
fn a_mod_rs_only_declares_and_reexports() {
    let mut wrong = Vec::new();
    for f in src_files()
        .iter()
        .filter(|f| f.rel.ends_with("mod.rs") || f.rel == "lib.rs")
    {
        let ast = syn::parse_file(&f.text).unwrap();
        for item in &ast.items {
            let ok = match item {
                syn::Item::Mod(m) => m.content.is_none(),
                syn::Item::Use(_) => true,
                _ => false,
            };
            if !ok {
                use quote::ToTokens;
                let text = item.to_token_stream().to_string();
                wrong.push(format!("src/{}: {}", f.rel, &text[..text.len().min(60)]));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "items that belong in a file of their own:\n{}",
        wrong.join("\n")
    );
}

/// The table in docs/architecture.md, as (row, may name, crates) cells.
fn documented_table() -> Vec<(String, String, String)> {
    let doc =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/architecture.md")).unwrap();
    let start = doc
        .find("| row | files | may name | crates |")
        .expect("docs/architecture.md has the layer table");
    doc[start..]
        .lines()
        .skip(2)
        .take_while(|l| l.starts_with('|'))
        .map(|l| {
            let cells: Vec<String> = l
                .trim_matches('|')
                .split('|')
                .map(|c| c.trim().replace('`', ""))
                .collect();
            (cells[0].clone(), cells[2].clone(), cells[3].clone())
        })
        .collect()
}

#[test]
fn the_documented_table_is_the_enforced_one() {
    let want: Vec<(String, String, String)> = ROWS
        .iter()
        .map(|r| {
            let list = |v: &[&str]| {
                if v.is_empty() {
                    "-".to_string()
                } else {
                    v.join(", ")
                }
            };
            (r.name.to_string(), list(r.may_name), list(r.crates))
        })
        .collect();
    assert_eq!(
        documented_table(),
        want,
        "docs/architecture.md's layer table differs from tests/layers.rs"
    );
}

/// Lines of a file before its `#[cfg(test)]` module.
fn lines_before_tests(text: &str) -> usize {
    text.lines()
        .take_while(|l| !l.starts_with("#[cfg(test)]"))
        .count()
}

/// Every function's length in lines: free functions, methods, and those in test modules.
struct Lengths(Vec<(String, usize)>);

impl<'ast> Visit<'ast> for Lengths {
    fn visit_item_fn(&mut self, f: &'ast syn::ItemFn) {
        let n = lines(&f.block);
        self.0.push((f.sig.ident.to_string(), n));
        syn::visit::visit_item_fn(self, f);
    }

    fn visit_impl_item_fn(&mut self, f: &'ast syn::ImplItemFn) {
        let n = lines(&f.block);
        self.0.push((f.sig.ident.to_string(), n));
        syn::visit::visit_impl_item_fn(self, f);
    }
}

fn lines(b: &syn::Block) -> usize {
    use syn::spanned::Spanned;
    let s = b.span();
    s.end().line - s.start().line + 1
}

#[test]
fn files_and_functions_stay_short() {
    let mut long = Vec::new();
    for f in src_files() {
        let n = lines_before_tests(&f.text);
        if n > 600 {
            long.push(format!("src/{}: {n} lines before its tests", f.rel));
        }
        let ast = syn::parse_file(&f.text).unwrap();
        let mut l = Lengths(Vec::new());
        l.visit_file(&ast);
        for (name, n) in l.0.into_iter().filter(|(_, n)| *n > 80) {
            long.push(format!("src/{}: fn {name} is {n} lines", f.rel));
        }
    }
    assert!(
        long.is_empty(),
        "too long (600 lines a file, 80 a function):\n{}",
        long.join("\n")
    );
}

/// The checker itself: it sees `use` groups, `super` chains, paths in code and in macro
/// arguments, and nothing in comments or strings.
#[test]
fn the_checker_sees_every_form_of_path() {
    let deps: BTreeSet<String> = ["vm_memory".to_string(), "vhost".to_string()].into();
    let f = SrcFile {
        rel: "ports/x/y.rs".into(),
        module: vec!["ports".into(), "x".into(), "y".into()],
        text: r#"
            use crate::{device, wire::ip};
            use super::super::tap::TapPort; // crate::daemon
            use w::Inner;
            fn f() { let s = "crate::config"; vm_memory::GuestAddress(0); debug!("{}", crate::stats::X); }
            mod inner { use super::super::z; }
        "#
        .into(),
    };
    let modules: BTreeSet<Vec<String>> = [vec![
        "ports".to_string(),
        "x".to_string(),
        "y".to_string(),
        "w".to_string(),
    ]]
    .into();
    let n = names(&f, &deps, &modules);
    let got: Vec<String> = n.internal.iter().map(|p| p.join("::")).collect();
    assert_eq!(
        got,
        [
            "device",
            "ports::tap::TapPort",
            "ports::x::y::w::Inner",
            "ports::x::z",
            "stats::X",
            "wire::ip"
        ]
    );
    assert_eq!(n.external.into_iter().collect::<Vec<_>>(), ["vm_memory"]);
}
