//! Frames for the tests of this folder's files, built field by field.

pub const SRC: [u8; 4] = [10, 0, 0, 1];
pub const DST: [u8; 4] = [10, 0, 1, 2];

pub fn eth(ty: u16, l3: &[u8]) -> Vec<u8> {
    let mut f = vec![0x02, 0, 0, 0, 0, 2, 0x02, 0, 0, 0, 0, 1];
    f.extend_from_slice(&ty.to_be_bytes());
    f.extend_from_slice(l3);
    f
}

pub fn ipv4(ihl_opts: &[u8], proto: u8, frag: u16, l4: &[u8]) -> Vec<u8> {
    let hl = 20 + ihl_opts.len();
    let mut ip = vec![0x40 | (hl / 4) as u8, 0];
    ip.extend_from_slice(&((hl + l4.len()) as u16).to_be_bytes());
    ip.extend_from_slice(&[0, 1]);
    ip.extend_from_slice(&frag.to_be_bytes());
    ip.extend_from_slice(&[64, proto, 0xbe, 0xef]);
    ip.extend_from_slice(&SRC);
    ip.extend_from_slice(&DST);
    ip.extend_from_slice(ihl_opts);
    ip.extend_from_slice(l4);
    ip
}

pub fn udp(payload: &[u8], check: u16) -> Vec<u8> {
    let mut u = vec![0x0f, 0xa0, 0x13, 0x88];
    u.extend_from_slice(&((8 + payload.len()) as u16).to_be_bytes());
    u.extend_from_slice(&check.to_be_bytes());
    u.extend_from_slice(payload);
    u
}
