//! The git revision the binary is built from, for `ctl info` and `dpaa_vnic_build_info`:
//! `git describe --always` (the commit HEAD names) when building in a checkout, "unknown" otherwise (a
//! crate from a tarball, a package build without git).

use std::process::Command;

fn main() {
    let revision = Command::new("git")
        .args(["describe", "--always", "--abbrev=12"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=DPAA_VNIC_REVISION={revision}");
    // Again when HEAD moves (a checkout, a commit); not on every edit.
    for f in [".git/HEAD", ".git/packed-refs"] {
        println!("cargo:rerun-if-changed={f}");
    }
    if let Ok(head) = std::fs::read_to_string(".git/HEAD") {
        if let Some(r) = head.strip_prefix("ref: ") {
            println!("cargo:rerun-if-changed=.git/{}", r.trim());
        }
    }
}
