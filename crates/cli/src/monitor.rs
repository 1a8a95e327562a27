//! `sqlite-bpe monitor`: a running process's Buffer Manager counters, live, as perfmon shows
//! SQL Server's. Reads what the process's engine publishes about once a second
//! (`bpe_core::published`); never attaches to the process.

use anyhow::{bail, Context};
use bpe_core::published::{self, Sample};
use std::collections::VecDeque;
use std::time::{Duration, Instant};

#[derive(clap::Args, Debug)]
pub struct MonitorArgs {
    /// The process to watch; without it, list the processes that have an engine.
    #[arg(long)]
    pub pid: Option<i32>,
    /// Print one sample (rates over the next publication interval) and exit.
    #[arg(long)]
    pub once: bool,
    /// Print JSON instead of a table (with --once, or for the list).
    #[arg(long)]
    pub json: bool,
}

/// cntr_type values (SQL Server's) of the kinds that need their base or a rate.
const FRACTION: i64 = 537003264;
const AVERAGE: i64 = 1073874176;
const BASE: i64 = 1073939712;

/// One counter as the monitor shows it.
#[derive(Clone, Debug, PartialEq)]
pub struct Shown {
    pub name: String,
    pub value: i64,
    /// Per second over the interval, for cumulative counters.
    pub per_second: Option<f64>,
    /// Over the interval where its base moved (else since start), for ratios and averages.
    pub ratio: Option<f64>,
}

/// The counters of `now`, with rates and ratios over the interval since `before`.
pub fn shown(before: &Sample, now: &Sample) -> Vec<Shown> {
    let seconds = now.time_ms.saturating_sub(before.time_ms) as f64 / 1000.0;
    let prev = |name: &str| before.value(name).unwrap_or(0);
    now.counters
        .iter()
        .filter(|(_, kind, _)| *kind != BASE)
        .map(|(name, kind, value)| {
            let delta = (value - prev(name)) as f64;
            let per_second = (published::is_cumulative(*kind) && seconds > 0.0)
                .then(|| delta.max(0.0) / seconds);
            let ratio = matches!(*kind, FRACTION | AVERAGE).then(|| {
                let base_name = format!("{name} base");
                let base = now.value(&base_name).unwrap_or(0);
                let base_delta = base - prev(&base_name);
                let scale = if *kind == FRACTION { 100.0 } else { 1.0 };
                if base_delta > 0 {
                    scale * delta / base_delta as f64
                } else if base > 0 {
                    scale * *value as f64 / base as f64
                } else if *kind == FRACTION {
                    100.0
                } else {
                    0.0
                }
            });
            Shown {
                name: name.clone(),
                value: *value,
                per_second,
                ratio,
            }
        })
        .collect()
}

/// The latency histograms' quantiles over the interval from `before` to `now` (since the
/// start if nothing was recorded in it), for the header: "extension reads p50 32 µs, p99 64 µs".
pub fn latency_line(before: &Sample, now: &Sample) -> String {
    let us = |ns: u64| {
        if ns < 2_000 {
            format!("{ns} ns")
        } else {
            format!("{} µs", ns / 1000)
        }
    };
    now.histograms
        .iter()
        .filter_map(|h| {
            let interval = before.histogram(&h.name).map_or(h.clone(), |b| h.since(b));
            let h = if interval.count() > 0 { &interval } else { h };
            let (p50, p99) = (h.quantile_ns(0.5)?, h.quantile_ns(0.99)?);
            Some(format!("{}: p50 < {}, p99 < {}", h.name, us(p50), us(p99)))
        })
        .collect::<Vec<_>>()
        .join("   ")
}

/// The process's command line, for the list and the header. A process started through
/// `/proc/self/exe` (the benchmarks' and the demo's configurations re-run their own program that
/// way) shows that as its first word, in every process: the executable it names is read instead.
fn command_of(pid: i32) -> String {
    let mut words: Vec<String> = std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|b| {
            b.split(|&c| c == 0)
                .filter(|a| !a.is_empty())
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect()
        })
        .unwrap_or_default();
    if let Some(first) = words.first_mut() {
        if first.starts_with("/proc/") {
            if let Some(name) = executable_of(pid) {
                *first = name;
            }
        }
    }
    words.join(" ")
}

/// The process's executable: its path (without the kernel's " (deleted)" once a rebuild replaced
/// it), or, where the link cannot be read, its name (`comm`).
fn executable_of(pid: i32) -> Option<String> {
    if let Ok(path) = std::fs::read_link(format!("/proc/{pid}/exe")) {
        let path = path.to_string_lossy();
        return Some(path.strip_suffix(" (deleted)").unwrap_or(&path).to_string());
    }
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .ok()
        .map(|s| s.trim_end().to_string())
        .filter(|s| !s.is_empty())
}

/// Bytes in MiB (2^20 bytes), the unit of every memory figure the monitor shows: `sp_configure
/// 'max server memory (MB)'` and `BPE_MAX_SERVER_MEMORY_MB` count megabytes of 2^20 bytes too.
pub fn mib(bytes: i64) -> f64 {
    bytes as f64 / 1048576.0
}

/// The live view's memory gauge label: `used / max MiB`, to one decimal as in the list.
pub fn memory_label(used: i64, max: i64) -> String {
    format!("{:.1} / {:.1} MiB", mib(used), mib(max))
}

fn read_live(pid: i32) -> anyhow::Result<Sample> {
    published::read(pid).with_context(|| match published::refusal() {
        Some(why) => format!("process {pid}'s counters are not read: {why}"),
        None => format!(
            "process {pid} publishes no sqlite-bpe counters (not running, no engine yet, or \
             another user's); `sqlite-bpe monitor` lists the ones that do"
        ),
    })
}

/// Says on stderr why no counters are read at all, if this user's counters directory is there
/// but not this user's alone (another user may have made it first: nothing is published or
/// read there).
fn warn_if_refused() {
    if let Some(why) = published::refusal() {
        eprintln!("sqlite-bpe monitor: no counters are read: {why}");
    }
}

/// The next sample after `after` (published about once a second), within a few seconds.
fn next_sample(pid: i32, after: &Sample) -> anyhow::Result<Sample> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let s = read_live(pid)?;
        if s.time_ms > after.time_ms {
            return Ok(s);
        }
        if Instant::now() >= deadline {
            bail!("process {pid} stopped publishing its counters");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

pub fn run(args: &MonitorArgs) -> anyhow::Result<()> {
    match args.pid {
        None => list(args.json),
        Some(pid) if args.once || args.json => once(pid, args.json),
        Some(pid) => live(pid),
    }
}

fn list(json: bool) -> anyhow::Result<()> {
    warn_if_refused();
    let all = published::list();
    if json {
        let rows: Vec<_> = all
            .iter()
            .map(|s| {
                serde_json::json!({
                    "pid": s.pid, "command": command_of(s.pid), "state": s.state,
                    "memory_bytes": s.value("Memory used bytes"),
                    "max_server_memory_bytes": s.value("Max server memory bytes"),
                })
            })
            .collect();
        println!("{}", serde_json::to_string_pretty(&rows)?);
        return Ok(());
    }
    if all.is_empty() {
        println!("no process of this user has a sqlite-bpe engine");
        return Ok(());
    }
    println!(
        "{:>8}  {:>10}  {:>10}  {:<32}  command",
        "pid", "memory MiB", "max MiB", "extension"
    );
    for s in &all {
        let mb = |n: &str| mib(s.value(n).unwrap_or(0));
        println!(
            "{:>8}  {:>10.1}  {:>10.1}  {:<32}  {}",
            s.pid,
            mb("Memory used bytes"),
            mb("Max server memory bytes"),
            s.state,
            command_of(s.pid)
        );
    }
    Ok(())
}

fn once(pid: i32, json: bool) -> anyhow::Result<()> {
    let a = read_live(pid)?;
    let b = next_sample(pid, &a)?;
    let rows = shown(&a, &b);
    if json {
        let counters: Vec<_> = rows
            .iter()
            .map(|r| {
                serde_json::json!({
                    "name": r.name, "value": r.value,
                    "per_second": r.per_second, "ratio": r.ratio,
                })
            })
            .collect();
        let out = serde_json::json!({
            "pid": pid, "time_ms": b.time_ms, "state": b.state,
            "interval_s": (b.time_ms - a.time_ms) as f64 / 1000.0,
            "counters": counters,
            "histograms": b.histograms.iter().map(|h| {
                let interval = a.histogram(&h.name).map_or(h.clone(), |earlier| h.since(earlier));
                serde_json::json!({
                    "name": h.name, "buckets_ns_log2": h.buckets,
                    "interval_p50_ns": interval.quantile_ns(0.5),
                    "interval_p99_ns": interval.quantile_ns(0.99),
                })
            }).collect::<Vec<_>>(),
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(());
    }
    println!("process {pid}: {}  ({})", command_of(pid), b.state);
    for r in &rows {
        println!("{}", format_row(r));
    }
    let latency = latency_line(&a, &b);
    if !latency.is_empty() {
        println!("{latency}");
    }
    Ok(())
}

fn format_row(r: &Shown) -> String {
    let extra = match (r.per_second, r.ratio) {
        (Some(rate), _) => format!("{rate:>12.1} /s"),
        (_, Some(ratio)) => format!("{ratio:>12.2}"),
        _ => String::new(),
    };
    format!("{:<42} {:>16} {}", r.name, r.value, extra)
}

/// Counters drawn as sparklines in the live view: their rates over the last minutes.
const CHARTED: [&str; 5] = [
    "Page lookups/sec",
    "Page reads/sec",
    "Extension page reads/sec",
    "Extension page writes/sec",
    "Lazy writes/sec",
];

/// The live view: rates over time, hit ratio, memory and extension use, all counters; `q` quits.
fn live(pid: i32) -> anyhow::Result<()> {
    use ratatui::crossterm::event::{self, Event, KeyCode};
    let mut last = read_live(pid)?;
    let mut history: Vec<VecDeque<u64>> = vec![VecDeque::new(); CHARTED.len()];
    let mut rows: Vec<Shown> = shown(&last, &last);
    let mut latency = latency_line(&last, &last);
    let command = command_of(pid);
    let mut terminal = ratatui::init();
    let result = (|| -> anyhow::Result<()> {
        loop {
            terminal.draw(|f| draw(f, pid, &command, &last, &rows, &latency, &history))?;
            if event::poll(Duration::from_millis(200))? {
                if let Event::Key(k) = event::read()? {
                    if matches!(k.code, KeyCode::Char('q') | KeyCode::Esc) {
                        return Ok(());
                    }
                }
            }
            let Some(now) = published::read(pid) else {
                bail!("process {pid} has exited or stopped publishing");
            };
            if now.time_ms > last.time_ms {
                rows = shown(&last, &now);
                latency = latency_line(&last, &now);
                for (h, name) in history.iter_mut().zip(CHARTED) {
                    let rate = rows.iter().find(|r| r.name == name);
                    h.push_back(rate.and_then(|r| r.per_second).unwrap_or(0.0) as u64);
                    if h.len() > 600 {
                        h.pop_front();
                    }
                }
                last = now;
            }
        }
    })();
    ratatui::restore();
    result
}

fn draw(
    f: &mut ratatui::Frame,
    pid: i32,
    command: &str,
    now: &Sample,
    rows: &[Shown],
    latency: &str,
    history: &[VecDeque<u64>],
) {
    use ratatui::layout::{Constraint, Layout};
    use ratatui::widgets::{Block, Gauge, Paragraph, Row, Sparkline, Table};
    let ratio = |name: &str| rows.iter().find(|r| r.name == name).and_then(|r| r.ratio);
    let value = |name: &str| now.value(name).unwrap_or(0);
    let [header, gauges, charts, table] = Layout::vertical([
        Constraint::Length(3),
        Constraint::Length(3),
        Constraint::Length(3 * CHARTED.len() as u16),
        Constraint::Min(5),
    ])
    .areas(f.area());
    let data_us = ratio("Page avg read time (us)").unwrap_or(0.0);
    f.render_widget(
        Paragraph::new(format!(
            "sqlite-bpe monitor  pid {pid}  {}  read time: data file {data_us:.0} µs\n{latency}\n{}   (q quits)",
            now.state, command
        )),
        header,
    );
    let [hit, memory, ext] = Layout::horizontal([Constraint::Ratio(1, 3); 3]).areas(gauges);
    let hit_ratio = ratio("Buffer cache hit ratio").unwrap_or(100.0);
    f.render_widget(
        Gauge::default()
            .block(Block::bordered().title("Buffer cache hit ratio"))
            .percent(hit_ratio.clamp(0.0, 100.0) as u16)
            .label(format!("{hit_ratio:.1} %")),
        hit,
    );
    let (used, max) = (value("Memory used bytes"), value("Max server memory bytes"));
    f.render_widget(
        Gauge::default()
            .block(Block::bordered().title("Memory / max server memory"))
            .ratio((used as f64 / max.max(1) as f64).clamp(0.0, 1.0))
            .label(memory_label(used, max)),
        memory,
    );
    let in_use = value("Extension in use as percentage");
    let read_us = ratio("Extension avg read time (us)").unwrap_or(0.0);
    f.render_widget(
        Gauge::default()
            .block(Block::bordered().title("Extension in use"))
            .percent(in_use.clamp(0, 100) as u16)
            .label(format!("{in_use} %, reads {read_us:.0} µs")),
        ext,
    );
    let chart_areas = Layout::vertical([Constraint::Length(3); CHARTED.len()]).split(charts);
    for ((name, h), area) in CHARTED.iter().zip(history).zip(chart_areas.iter()) {
        let data: Vec<u64> = h.iter().copied().collect();
        let latest = data.last().copied().unwrap_or(0);
        f.render_widget(
            Sparkline::default()
                .block(Block::bordered().title(format!("{name}: {latest}")))
                .data(&data[data.len().saturating_sub(area.width as usize)..]),
            *area,
        );
    }
    let table_rows = rows.iter().map(|r| {
        let extra = match (r.per_second, r.ratio) {
            (Some(rate), _) => format!("{rate:.1} /s"),
            (_, Some(ratio)) => format!("{ratio:.2}"),
            _ => String::new(),
        };
        Row::new(vec![r.name.clone(), r.value.to_string(), extra])
    });
    f.render_widget(
        Table::new(
            table_rows,
            [
                Constraint::Length(42),
                Constraint::Length(18),
                Constraint::Length(16),
            ],
        )
        .header(Row::new(vec!["counter", "value", "rate / ratio"]))
        .block(Block::bordered().title("Buffer Manager")),
        table,
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(time_ms: u64, counters: &[(&str, i64, i64)]) -> Sample {
        Sample {
            pid: 1,
            started: 1,
            time_ms,
            state: String::new(),
            counters: counters
                .iter()
                .map(|&(n, k, v)| (n.to_string(), k, v))
                .collect(),
            histograms: Vec::new(),
        }
    }

    #[test]
    fn latency_quantiles_are_taken_over_the_interval() {
        use bpe_core::HistogramSnapshot;
        let h = |buckets: Vec<u64>| HistogramSnapshot {
            name: "Extension read time".into(),
            buckets,
        };
        let mut a = sample(1_000, &[]);
        a.histograms = vec![h(vec![0; 40])];
        a.histograms[0].buckets[14] = 1_000; // 1,000 reads of 16-32 µs before the interval
        let mut b = a.clone();
        b.histograms[0].buckets[21] = 10; // then 10 of 2-4 ms
        assert_eq!(
            latency_line(&a, &b),
            "Extension read time: p50 < 4194 µs, p99 < 4194 µs"
        );
        // Nothing in the interval: since the start.
        assert_eq!(
            latency_line(&a, &a),
            "Extension read time: p50 < 32 µs, p99 < 32 µs"
        );
        assert_eq!(latency_line(&sample(1, &[]), &sample(2, &[])), "");
    }

    #[test]
    fn memory_is_shown_in_mib_in_the_view_as_in_the_list() {
        // 16 MiB of max server memory (sp_configure's 16 MB) is 16.0 everywhere, not "17 MB".
        assert_eq!(memory_label(16 << 20, 16 << 20), "16.0 / 16.0 MiB");
        assert_eq!(memory_label(3 << 19, 128 << 20), "1.5 / 128.0 MiB");
        assert_eq!(format!("{:.1}", mib(16 << 20)), "16.0");
    }

    #[test]
    fn rates_ratios_and_averages_are_taken_over_the_interval() {
        let cumulative = 272696576;
        let a = sample(
            1_000,
            &[
                ("Page lookups/sec", cumulative, 100),
                ("Buffer cache hit ratio", FRACTION, 50),
                ("Buffer cache hit ratio base", BASE, 100),
                ("Extension avg read time (us)", AVERAGE, 1_000),
                ("Extension avg read time (us) base", BASE, 10),
                ("Memory used bytes", 65792, 7),
            ],
        );
        let b = sample(
            3_000,
            &[
                ("Page lookups/sec", cumulative, 300),
                ("Buffer cache hit ratio", FRACTION, 200),
                ("Buffer cache hit ratio base", BASE, 300),
                ("Extension avg read time (us)", AVERAGE, 1_300),
                ("Extension avg read time (us) base", BASE, 20),
                ("Memory used bytes", 65792, 9),
            ],
        );
        let s = shown(&a, &b);
        let get = |n: &str| s.iter().find(|r| r.name == n).unwrap().clone();
        assert_eq!(get("Page lookups/sec").per_second, Some(100.0));
        // 150 hits of 200 lookups in the interval, not 200 of 300 since start.
        assert_eq!(get("Buffer cache hit ratio").ratio, Some(75.0));
        assert_eq!(get("Extension avg read time (us)").ratio, Some(30.0));
        let memory = get("Memory used bytes");
        assert_eq!(
            (memory.value, memory.per_second, memory.ratio),
            (9, None, None)
        );
        assert!(s.iter().all(|r| !r.name.ends_with(" base")));
    }
}
