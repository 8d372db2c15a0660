//! `dpaa-vnic qemu-args`: what QEMU, or libvirt, needs to attach a guest to one of the
//! daemon's sockets, in either attachment, printed rather than looked up in the docs
//! (docs/running-with-qemu.md and docs/libvirt.md say why each piece is there).

use std::fmt::Write as _;
use std::path::Path;

use thiserror::Error;

use crate::cli::{Attach, LibvirtPart, QemuArgsArgs, MAX_QUEUE_PAIRS};

#[derive(Debug, Error, PartialEq, Eq)]
pub enum QemuArgsError {
    #[error("--queues {0}: from 1 to {MAX_QUEUE_PAIRS}")]
    Queues(u16),
    #[error("--memory {0:?}: a size as QEMU writes it, e.g. 512M or 2G")]
    Memory(String),
    #[error("--socket {0:?}: not a path QEMU and libvirt can be given (it must be absolute UTF-8)")]
    Socket(String),
    #[error(
        "--libvirt=interface: libvirt has no element for the device attachment's device; \
         --libvirt prints its <qemu:commandline>"
    )]
    NoInterface,
}

/// The chardev, netdev and device id the arguments use.
const ID: &str = "vnic0";

/// The QEMU arguments (one option and its value per line, each line but the last ending in
/// a backslash, ready to paste into a shell command), or libvirt's XML pieces.
pub fn render(a: &QemuArgsArgs) -> Result<String, QemuArgsError> {
    if a.queues == 0 || a.queues > MAX_QUEUE_PAIRS {
        return Err(QemuArgsError::Queues(a.queues));
    }
    if !valid_size(&a.memory) {
        return Err(QemuArgsError::Memory(a.memory.clone()));
    }
    let socket = socket(&a.socket)?;
    if let Some(part) = a.libvirt {
        return libvirt(a, socket, part);
    }
    let lines = qemu(a, socket);
    Ok(lines.join(" \\\n") + "\n")
}

/// `512M`, `2G`, `1048576`: digits, then at most one of QEMU's suffixes.
fn valid_size(s: &str) -> bool {
    let digits = s.trim_end_matches(['K', 'M', 'G', 'T', 'k', 'm', 'g', 't']);
    s.len() - digits.len() <= 1 && !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit())
}

fn socket(p: &Path) -> Result<&str, QemuArgsError> {
    match p.to_str() {
        Some(s) if p.is_absolute() => Ok(s),
        _ => Err(QemuArgsError::Socket(p.display().to_string())),
    }
}

/// QEMU's option syntax: a comma inside a value is written twice.
fn opt(v: &str) -> String {
    v.replace(',', ",,")
}

fn qemu(a: &QemuArgsArgs, socket: &str) -> Vec<String> {
    let mut chardev = format!("-chardev socket,id={ID},path={}", opt(socket));
    match (a.client, a.attach) {
        // The daemon connects (its --client): QEMU listens, and must not wait for it.
        (true, _) => chardev.push_str(",server=on,wait=off"),
        // QEMU comes back after the daemon restarts (QEMU 9.2; older: reconnect=1). Not in
        // the device attachment: QEMU 11.1's test device then fails at start.
        (false, Attach::Net) => chardev.push_str(",reconnect-ms=1000"),
        (false, Attach::Device) => {}
    }
    let mut lines = vec![
        format!("-object memory-backend-memfd,id=mem,size={},share=on", a.memory),
        "-machine memory-backend=mem".to_string(),
        chardev,
    ];
    let q = a.queues;
    match a.attach {
        Attach::Net => {
            lines.push(format!("-netdev vhost-user,id={ID},chardev={ID},queues={q}"));
            let mut dev = format!("-device virtio-net-pci,netdev={ID},mac={}", a.mac);
            if q > 1 {
                // One vector per queue, the control queue's and the config change's.
                let _ = write!(dev, ",mq=on,vectors={}", 2 * u32::from(q) + 2);
            }
            lines.push(dev);
        }
        Attach::Device => lines.push(format!(
            "-device vhost-user-test-device-pci,chardev={ID},virtio-id=1,num_vqs={},config_size=24,vq_size=256",
            2 * u32::from(q) + 1
        )),
    }
    lines
}

/// XML text: the five characters XML reserves, escaped.
fn xml(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('\'', "&apos;")
        .replace('"', "&quot;")
}

/// The guest memory a vhost-user backend can map.
const MEMORY_BACKING: &str =
    "<memoryBacking>\n  <source type='memfd'/>\n  <access mode='shared'/>\n</memoryBacking>\n";

/// The net attachment's `<interface>` element.
fn interface(a: &QemuArgsArgs, socket: &str) -> String {
    // libvirt's mode is QEMU's side: 'client' when the daemon listens.
    let (mode, reconnect) = if a.client {
        ("server", "")
    } else {
        ("client", "\n    <reconnect enabled='yes' timeout='1'/>\n  ")
    };
    format!(
        "<interface type='vhostuser'>\n  <mac address='{}'/>\n  \
         <source type='unix' path='{}' mode='{mode}'>{reconnect}</source>\n  \
         <model type='virtio'/>\n  <driver queues='{}'/>\n</interface>\n",
        a.mac,
        xml(socket),
        a.queues
    )
}

fn libvirt(a: &QemuArgsArgs, socket: &str, part: LibvirtPart) -> Result<String, QemuArgsError> {
    match (part, a.attach) {
        (LibvirtPart::Memory, _) => return Ok(MEMORY_BACKING.into()),
        (LibvirtPart::Interface, Attach::Net) => return Ok(interface(a, socket)),
        (LibvirtPart::Interface, Attach::Device) => return Err(QemuArgsError::NoInterface),
        (LibvirtPart::All, _) => {}
    }
    let mut out = format!("<!-- In <domain>: guest memory the daemon can map. -->\n{MEMORY_BACKING}");
    match a.attach {
        Attach::Net => {
            out.push_str("<!-- In <devices>. -->\n");
            out.push_str(&interface(a, socket));
        }
        Attach::Device => {
            // libvirt has no element for QEMU's vhost-user test device (docs/libvirt.md).
            out.push_str(
                "<!-- In <domain xmlns:qemu='http://libvirt.org/schemas/domain/qemu/1.0'>: \
                 libvirt has no element for this device. -->\n<qemu:commandline>\n",
            );
            for line in qemu(a, socket).iter().skip(2) {
                for part in line.splitn(2, ' ') {
                    let _ = writeln!(out, "  <qemu:arg value='{}'/>", xml(part));
                }
            }
            out.push_str("</qemu:commandline>\n");
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn args(attach: Attach) -> QemuArgsArgs {
        QemuArgsArgs {
            attach,
            socket: PathBuf::from("/run/vnic0.sock"),
            queues: 2,
            mac: "52:54:00:d0:aa:01".parse().unwrap(),
            memory: "1G".into(),
            client: false,
            libvirt: None,
        }
    }

    #[test]
    fn net_and_device_arguments_are_the_documented_ones() {
        assert_eq!(
            render(&args(Attach::Net)).unwrap(),
            "-object memory-backend-memfd,id=mem,size=1G,share=on \\\n\
             -machine memory-backend=mem \\\n\
             -chardev socket,id=vnic0,path=/run/vnic0.sock,reconnect-ms=1000 \\\n\
             -netdev vhost-user,id=vnic0,chardev=vnic0,queues=2 \\\n\
             -device virtio-net-pci,netdev=vnic0,mac=52:54:00:d0:aa:01,mq=on,vectors=6\n"
        );
        let mut d = args(Attach::Device);
        d.client = true;
        d.socket = PathBuf::from("/run/a,b.sock");
        let out = render(&d).unwrap();
        assert!(
            out.contains("-chardev socket,id=vnic0,path=/run/a,,b.sock,server=on,wait=off \\\n"),
            "{out}"
        );
        assert!(out.ends_with(
            "-device vhost-user-test-device-pci,chardev=vnic0,virtio-id=1,num_vqs=5,config_size=24,vq_size=256\n"
        ));
    }

    #[test]
    fn libvirt_pieces_escape_what_xml_reserves() {
        let mut a = args(Attach::Net);
        a.libvirt = Some(LibvirtPart::All);
        a.socket = PathBuf::from("/run/o'neil&co.sock");
        let out = render(&a).unwrap();
        assert!(
            out.contains("path='/run/o&apos;neil&amp;co.sock' mode='client'"),
            "{out}"
        );
        assert!(out.contains("<driver queues='2'/>"));
        a.attach = Attach::Device;
        let out = render(&a).unwrap();
        assert!(out.contains("<qemu:arg value='-device'/>"), "{out}");
        assert!(!out.contains("-netdev"));
    }

    /// Each piece alone is what the whole holds of it: `virsh attach-device` takes the
    /// interface as it is, `virsh edit` the memoryBacking.
    #[test]
    fn libvirt_pieces_alone() {
        let mut a = args(Attach::Net);
        a.libvirt = Some(LibvirtPart::All);
        let all = render(&a).unwrap();
        a.libvirt = Some(LibvirtPart::Interface);
        let nic = render(&a).unwrap();
        assert!(
            nic.starts_with("<interface type='vhostuser'>") && nic.ends_with("</interface>\n"),
            "{nic}"
        );
        a.libvirt = Some(LibvirtPart::Memory);
        let mem = render(&a).unwrap();
        assert!(
            mem.starts_with("<memoryBacking>") && mem.ends_with("</memoryBacking>\n"),
            "{mem}"
        );
        assert!(all.contains(&nic) && all.contains(&mem));
        a.attach = Attach::Device;
        a.libvirt = Some(LibvirtPart::Interface);
        assert_eq!(render(&a), Err(QemuArgsError::NoInterface));
    }

    #[test]
    fn bad_values_are_refused() {
        let mut a = args(Attach::Net);
        a.queues = 32;
        assert_eq!(render(&a), Err(QemuArgsError::Queues(32)));
        let mut a = args(Attach::Net);
        for m in ["", "1GG", "G", "1.5G", "1G,share=off"] {
            a.memory = m.into();
            assert_eq!(render(&a), Err(QemuArgsError::Memory(m.into())), "{m}");
        }
        let mut a = args(Attach::Net);
        a.socket = PathBuf::from("vnic0.sock");
        assert!(matches!(render(&a), Err(QemuArgsError::Socket(_))));
    }
}
