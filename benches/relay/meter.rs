//! What a run cost: throughput, and the CPU of the relay, of PostgreSQL,
//! of RabbitMQ and of the whole machine, read from /proc.

use std::time::Instant;

/// CPU seconds used so far by every process with this command name,
/// counting the children they have reaped (PostgreSQL's ended backends).
fn cpu_seconds_of(command: &str) -> f64 {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return 0.0;
    };
    let mut ticks = 0.0;
    for entry in entries.flatten() {
        let path = entry.path();
        let is_match = std::fs::read_to_string(path.join("comm")).is_ok_and(|c| c.trim() == command);
        if !is_match {
            continue;
        }
        let stat = std::fs::read_to_string(path.join("stat")).unwrap_or_default();
        let after = stat.rsplit_once(") ").map(|(_, rest)| rest).unwrap_or("");
        // utime, stime, cutime, cstime: fields 14 to 17 of the line.
        ticks += after
            .split_whitespace()
            .skip(11)
            .take(4)
            .filter_map(|v| v.parse::<f64>().ok())
            .sum::<f64>();
    }
    ticks / 100.0
}

/// CPU seconds of the servers the relay depends on, to tell which one
/// limits a run: PostgreSQL and RabbitMQ (the Erlang VM).
#[derive(Debug, Clone, Copy, Default)]
struct ServerCpu {
    postgres: f64,
    rabbitmq: f64,
    /// Busy and total CPU time of the whole machine (all cores).
    machine_busy: f64,
    machine_total: f64,
}

impl ServerCpu {
    fn now() -> Self {
        // The first line of /proc/stat: user nice system idle iowait irq
        // softirq steal …, in ticks, summed over all cores.
        let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
        let ticks: Vec<f64> = stat
            .lines()
            .next()
            .unwrap_or("")
            .split_whitespace()
            .skip(1)
            .take(8)
            .filter_map(|v| v.parse().ok())
            .collect();
        let total: f64 = ticks.iter().sum();
        let idle = ticks.get(3).copied().unwrap_or(0.0) + ticks.get(4).copied().unwrap_or(0.0);
        Self {
            postgres: cpu_seconds_of("postgres"),
            rabbitmq: cpu_seconds_of("beam.smp"),
            machine_busy: total - idle,
            machine_total: total,
        }
    }

    fn since(self, earlier: Self) -> Self {
        Self {
            postgres: self.postgres - earlier.postgres,
            rabbitmq: self.rabbitmq - earlier.rabbitmq,
            machine_busy: self.machine_busy - earlier.machine_busy,
            machine_total: self.machine_total - earlier.machine_total,
        }
    }
}

/// Throughput of one run and what it cost the servers.
#[derive(Debug, Clone, Copy)]
pub struct Run {
    pub events_per_second: f64,
    pub seconds: f64,
    /// CPU used by PostgreSQL and RabbitMQ during the run, in % of a core.
    pub postgres_percent: f64,
    pub rabbitmq_percent: f64,
    /// Share of the whole machine's CPU time that was busy, in %.
    pub machine_busy_percent: f64,
}

/// Measures a run from its start.
pub struct Meter {
    started: Instant,
    servers: ServerCpu,
}

impl Meter {
    pub fn start() -> Self {
        Self {
            started: Instant::now(),
            servers: ServerCpu::now(),
        }
    }

    pub fn finish(self, events: usize) -> Run {
        let seconds = self.started.elapsed().as_secs_f64();
        let used = ServerCpu::now().since(self.servers);
        Run {
            events_per_second: events as f64 / seconds,
            seconds,
            postgres_percent: used.postgres / seconds * 100.0,
            rabbitmq_percent: used.rabbitmq / seconds * 100.0,
            machine_busy_percent: used.machine_busy / used.machine_total.max(1.0) * 100.0,
        }
    }
}

/// Peak RSS (KiB) and CPU seconds of a process, from /proc.
pub fn proc_usage(pid: u32) -> (u64, f64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let peak_kib = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0);
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the parenthesised command name; utime and stime are the
    // 14th and 15th fields of the line.
    let after = stat.rsplit_once(") ").map(|(_, rest)| rest).unwrap_or("");
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks: f64 = fields.get(11).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0)
        + fields.get(12).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (peak_kib, ticks / 100.0)
}
