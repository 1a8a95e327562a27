//! `--plot FILE.png|FILE.svg`: the configurations as bars (seconds, or transactions per minute for
//! the time-boxed `oltp`; log scale), then one panel
//! per configuration with its Buffer Manager counters over time, like the perfmon charts of the
//! published experiments.
//!
//! Text needs a TrueType font: the first of a few Debian fonts found at run time is registered
//! with plotters' ab_glyph backend (no fontconfig). Without one, the chart is drawn without text.

use crate::report::BenchReport;
use crate::sampler::Sample;
use anyhow::Context;
use plotters::coord::Shift;
use plotters::prelude::*;
use std::path::Path;

const FONTS: [&str; 4] = [
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
    "/usr/share/fonts/truetype/noto/NotoSans-Regular.ttf",
    "/usr/share/fonts/truetype/freefont/FreeSans.ttf",
];

fn register_font() -> bool {
    static ONCE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ONCE.get_or_init(|| {
        for f in FONTS {
            if let Ok(bytes) = std::fs::read(f) {
                let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
                if plotters::style::register_font("sans-serif", FontStyle::Normal, bytes).is_ok() {
                    return true;
                }
            }
        }
        eprintln!(
            "no TrueType font found (apt-get install fonts-dejavu-core): plotting without text"
        );
        false
    })
}

/// Height of the bar chart: one row per configuration, names on the left.
fn bars_height(r: &BenchReport) -> u32 {
    (140 + 42 * r.configs.len() as u32).max(300)
}

/// Configurations with a time series of bpe's counters to draw: not stock SQLite's (named
/// `stock` or `stock_*`), whose samples are all zero (the counters are the engine's).
fn with_series(r: &BenchReport) -> Vec<&crate::report::ConfigResult> {
    r.configs
        .iter()
        .filter(|c| !c.series.is_empty() && !c.name.starts_with("stock"))
        .collect()
}

pub fn draw(r: &BenchReport, path: &Path) -> anyhow::Result<()> {
    let text = register_font();
    let panels = with_series(r).len().div_ceil(2) as u32;
    let size = (1200, bars_height(r) + 260 * panels);
    let svg = path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("svg"));
    if svg {
        let root = SVGBackend::new(path, size).into_drawing_area();
        draw_on(&root, r, text)?;
        root.present().context("writing the SVG")?;
    } else {
        let root = BitMapBackend::new(path, size).into_drawing_area();
        draw_on(&root, r, text)?;
        root.present().context("writing the PNG")?;
    }
    Ok(())
}

type Res = anyhow::Result<()>;

fn draw_on<DB: DrawingBackend>(root: &DrawingArea<DB, Shift>, r: &BenchReport, text: bool) -> Res
where
    DB::ErrorType: 'static,
{
    root.fill(&WHITE).map_err(err)?;
    let (top, bottom) = root.split_vertically(bars_height(r));
    bars(&top, r, text)?;
    let drawn = with_series(r);
    let panels = drawn.len().div_ceil(2);
    if panels > 0 {
        let areas = bottom.split_evenly((panels, 2));
        for (c, area) in drawn.into_iter().zip(areas.iter()) {
            series(area, &c.name, &c.series, text)?;
        }
    }
    Ok(())
}

fn err<E: std::fmt::Debug>(e: E) -> anyhow::Error {
    anyhow::anyhow!("plotting: {e:?}")
}

fn bars<DB: DrawingBackend>(area: &DrawingArea<DB, Shift>, r: &BenchReport, text: bool) -> Res
where
    DB::ErrorType: 'static,
{
    let n = r.configs.len().max(1);
    // Every oltp configuration runs for the same time: what differs is the throughput; every
    // autocommit configuration too: what differs is the time per lookup.
    let per_minute = r.benchmark == "oltp";
    let per_lookup = r.benchmark == "autocommit";
    let (unit, value): (&str, fn(&crate::report::ConfigResult) -> f64) = if per_minute {
        ("transactions per minute", |c| {
            c.operations as f64 * 60.0 / c.seconds.max(1e-9)
        })
    } else if per_lookup {
        ("µs per lookup (mean)", |c| {
            c.seconds * 1e6 / c.operations.max(1) as f64
        })
    } else {
        ("seconds", |c| c.seconds)
    };
    let label = |v: f64| {
        if per_minute {
            format!("{v:.0}")
        } else if per_lookup {
            format!("{v:.1}")
        } else {
            crate::report::fmt_duration(v)
        }
    };
    let max = r.configs.iter().map(value).fold(0.001, f64::max);
    let min = r.configs.iter().map(value).fold(max, f64::min);
    let lo = (min / 3.0).max(1e-4);
    let names: Vec<String> = r.configs.iter().map(|c| c.name.clone()).collect();
    let mut b = ChartBuilder::on(area);
    b.margin(20);
    if text {
        let d = &r.storage.data_device;
        b.caption(
            format!(
                "sqlite-bpe bench {}: {unit} per configuration (log scale), data device {}",
                r.benchmark, d.name
            ),
            ("sans-serif", 24),
        )
        .x_label_area_size(40)
        .y_label_area_size(250);
    }
    // One horizontal bar per configuration, the first on top, names on the left (they are too
    // long to sit side by side under vertical bars).
    let row = |i: usize| (n - 1 - i) as f64;
    let mut chart = b
        .build_cartesian_2d((lo..max * 3.0).log_scale(), -0.5f64..(n as f64 - 0.5))
        .map_err(err)?;
    if text {
        chart
            .configure_mesh()
            .disable_y_mesh()
            .y_labels(n)
            .y_label_formatter(&|y| {
                let i = y.round();
                if (y - i).abs() < 0.01 && i >= 0.0 && (i as usize) < n {
                    names.get(n - 1 - i as usize).cloned().unwrap_or_default()
                } else {
                    String::new()
                }
            })
            .x_desc(unit)
            .x_label_formatter(&|v| log_tick_label(*v))
            .light_line_style(WHITE)
            .label_style(("sans-serif", 15))
            .draw()
            .map_err(err)?;
    }
    for (i, c) in r.configs.iter().enumerate() {
        let y = row(i);
        let v = value(c).max(lo);
        let color = Palette99::pick(i).to_rgba();
        chart
            .draw_series(std::iter::once(Rectangle::new(
                [(lo, y - 0.35), (v, y + 0.35)],
                color.filled(),
            )))
            .map_err(err)?;
        if text {
            chart
                .draw_series(std::iter::once(Text::new(
                    label(value(c)),
                    (v * 1.08, y + 0.2),
                    ("sans-serif", 16),
                )))
                .map_err(err)?;
        }
    }
    Ok(())
}

fn series<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    name: &str,
    s: &[Sample],
    text: bool,
) -> Res
where
    DB::ErrorType: 'static,
{
    let t_max = s.last().map_or(1.0, |x| x.t).max(0.001);
    let y_max = s
        .iter()
        .flat_map(|x| {
            [
                x.page_reads_per_s,
                x.ext_page_reads_per_s,
                x.ext_page_writes_per_s,
            ]
        })
        .fold(10.0, f64::max)
        * 1.1;
    let mut b = ChartBuilder::on(area);
    b.margin(12);
    if text {
        b.caption(
            format!("{name}: pages/s (lines), L1 hit % (grey, right axis)"),
            ("sans-serif", 17),
        )
        .x_label_area_size(30)
        .y_label_area_size(60)
        .right_y_label_area_size(40);
    }
    let mut chart = b
        .build_cartesian_2d(0f64..t_max, 0f64..y_max)
        .map_err(err)?
        .set_secondary_coord(0f64..t_max, 0f64..100.0);
    if text {
        chart
            .configure_mesh()
            .x_desc("seconds")
            .light_line_style(WHITE)
            .label_style(("sans-serif", 13))
            .draw()
            .map_err(err)?;
        chart
            .configure_secondary_axes()
            .label_style(("sans-serif", 13))
            .draw()
            .map_err(err)?;
    }
    type Line = (&'static str, RGBColor, fn(&Sample) -> f64);
    let lines: [Line; 3] = [
        ("Page reads/sec", RED, |x| x.page_reads_per_s),
        ("Extension page reads/sec", BLUE, |x| x.ext_page_reads_per_s),
        ("Extension page writes/sec", GREEN, |x| {
            x.ext_page_writes_per_s
        }),
    ];
    for (label, color, f) in lines {
        let drawn = chart
            .draw_series(LineSeries::new(
                s.iter().map(|x| (x.t, f(x))),
                color.stroke_width(2),
            ))
            .map_err(err)?;
        if text {
            drawn
                .label(label)
                .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], color));
        }
    }
    chart
        .draw_secondary_series(LineSeries::new(
            s.iter().map(|x| (x.t, x.hit_ratio_percent)),
            RGBColor(150, 150, 150).stroke_width(1),
        ))
        .map_err(err)?;
    if text {
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .background_style(WHITE.mix(0.6))
            .border_style(BLACK)
            .label_font(("sans-serif", 13))
            .draw()
            .map_err(err)?;
    }
    Ok(())
}

/// A log axis's tick label: plotters puts a tick at every multiple of each power of ten, and
/// nine labels a decade overlap, so only 1, 2 and 5 times a power of ten are named. Ticks come
/// from floating-point steps, so a value within 1 % of a named one is named as that one.
fn log_tick_label(v: f64) -> String {
    if !(v.is_finite() && v > 0.0) {
        return String::new();
    }
    let decade = 10f64.powf(v.log10().floor());
    let lead = v / decade;
    let Some(l) = [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .find(|l| (lead - l).abs() < 0.01)
    else {
        return String::new();
    };
    let v = (l * decade).round();
    match v {
        v if v >= 1e6 => format!("{}M", v / 1e6),
        v if v >= 1e3 => format!("{}k", v / 1e3),
        v => format!("{v}"),
    }
}

#[cfg(test)]
mod tests {
    use super::log_tick_label;

    #[test]
    fn a_log_axis_names_one_two_and_five_of_each_decade() {
        let labels: Vec<String> = [10_000.0, 20_000.0, 30_000.0, 50_000.0, 70_000.0, 100_000.0]
            .into_iter()
            .map(log_tick_label)
            .collect();
        assert_eq!(labels, ["10k", "20k", "", "50k", "", "100k"]);
        assert_eq!(log_tick_label(2_000_000.0), "2M");
        assert_eq!(log_tick_label(5.0), "5");
        assert_eq!(log_tick_label(0.0), "");
        assert_eq!(log_tick_label(99_999.99), "100k");
        assert_eq!(log_tick_label(999_999.999_9), "1M");
        assert_eq!(log_tick_label(f64::NAN), "");
    }
}
