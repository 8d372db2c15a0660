//! `ctl queue-cpus`: which guest CPUs send on each queue of a guest port, as the user says
//! (the guest's XPS map, `/sys/class/net/IF/queues/tx-N/xps_cpus`). Neither a virtio queue
//! nor its kick carries a CPU number, so the daemon cannot see which vCPU feeds a queue;
//! what it is told is shown beside that queue's counters (`ctl stats`, `ctl watch`), so
//! that a per-queue count reads as a per-vCPU one (docs/pipeline.md, "From per CPU to per
//! queue").

use std::collections::BTreeMap;
use std::num::ParseIntError;
use std::sync::Mutex;

/// Highest CPU number a list may name: Linux's NR_CPUS tops out at 8192.
const MAX_CPU: u32 = 8191;
/// Longest list kept for one queue, in bytes.
const MAX_LIST: usize = 256;

#[derive(Debug, thiserror::Error)]
pub enum QueueCpusError {
    #[error("bad mapping {0:?}: want QUEUE=CPUS, e.g. 0=0 or 1=2-3")]
    Syntax(String),
    #[error("bad queue number in {word:?}")]
    Queue {
        word: String,
        #[source]
        source: ParseIntError,
    },
    #[error("queue {queue} does not exist (the port has {queues})")]
    NoQueue { queue: usize, queues: usize },
    #[error("queue {0} is named twice")]
    Twice(usize),
    #[error("bad CPU list {0:?}: want CPU numbers up to {MAX_CPU} and ranges, e.g. 0,2-3")]
    Cpus(String),
    #[error("bad CPU number in {list:?}")]
    Cpu {
        list: String,
        #[source]
        source: ParseIntError,
    },
}

/// Each guest port's queues, the CPUs behind each as told (none until told).
#[derive(Debug, Default)]
pub struct QueueCpus(Mutex<BTreeMap<usize, Vec<Option<String>>>>);

impl QueueCpus {
    /// Replaces what port `port` (of `queues` queues) was told with `map`, words of
    /// QUEUE=CPUS; an empty `map` forgets it. Returns what the port now has.
    pub fn set(
        &self,
        port: usize,
        queues: usize,
        map: &[&str],
    ) -> Result<Vec<Option<String>>, QueueCpusError> {
        let mut cpus = vec![None; queues];
        for word in map {
            let (q, list) = word
                .split_once('=')
                .ok_or_else(|| QueueCpusError::Syntax(word.to_string()))?;
            let queue: usize = q.trim().parse().map_err(|source| QueueCpusError::Queue {
                word: word.to_string(),
                source,
            })?;
            let slot = cpus
                .get_mut(queue)
                .ok_or(QueueCpusError::NoQueue { queue, queues })?;
            if slot.is_some() {
                return Err(QueueCpusError::Twice(queue));
            }
            *slot = Some(cpu_list(list.trim())?);
        }
        let mut all = crate::sync::lock(&self.0);
        if map.is_empty() {
            all.remove(&port);
        } else {
            all.insert(port, cpus.clone());
        }
        Ok(cpus)
    }

    /// What port `port`'s queues were told, if anything.
    pub fn of(&self, port: usize) -> Option<Vec<Option<String>>> {
        crate::sync::lock(&self.0).get(&port).cloned()
    }
}

/// A CPU list as taskset and cgroups write it (`0`, `0,2-3`), checked.
fn cpu_list(list: &str) -> Result<String, QueueCpusError> {
    let bad = || QueueCpusError::Cpus(list.to_string());
    if list.is_empty() || list.len() > MAX_LIST {
        return Err(bad());
    }
    for part in list.split(',') {
        let (a, b) = part.split_once('-').unwrap_or((part, part));
        let cpu = |n: &str| {
            n.parse::<u32>().map_err(|source| QueueCpusError::Cpu {
                list: list.to_string(),
                source,
            })
        };
        let (a, b) = (cpu(a)?, cpu(b)?);
        if a > b || b > MAX_CPU {
            return Err(bad());
        }
    }
    Ok(list.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_map_is_kept_per_port_and_checked() {
        let q = QueueCpus::default();
        assert_eq!(q.of(0), None);
        let got = q.set(0, 4, &["0=0", "1=1", "3=2-3,5"]).unwrap();
        assert_eq!(
            got,
            [Some("0".into()), Some("1".into()), None, Some("2-3,5".into())]
        );
        assert_eq!(q.of(0), Some(got));
        assert_eq!(q.of(1), None);
        for (bad, why) in [
            ("4=0", "queue 4 does not exist"),
            ("x=0", "bad queue number"),
            ("0", "bad mapping"),
            ("0=", "bad CPU list"),
            ("0=3-1", "bad CPU list"),
            ("0=9000", "bad CPU list"),
            ("0=1;2", "bad CPU number"),
        ] {
            let e = q.set(0, 4, &[bad]).unwrap_err().to_string();
            assert!(e.contains(why), "{bad}: {e}");
        }
        assert!(q
            .set(0, 4, &["1=0", "1=1"])
            .unwrap_err()
            .to_string()
            .contains("twice"));
        // A refused map changed nothing; an empty one forgets.
        assert_eq!(q.of(0).unwrap()[3].as_deref(), Some("2-3,5"));
        q.set(0, 4, &[]).unwrap();
        assert_eq!(q.of(0), None);
    }
}
