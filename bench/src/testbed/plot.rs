//! SVG plots with `plotters` (SVG backend only: no font or system library;
//! text is written as SVG `<text>` and laid out with plotters' built-in
//! size estimate).

use std::path::{Path, PathBuf};

use plotters::prelude::*;

use super::analyze::CcResult;
use super::TestbedError;

fn err(path: &Path, e: impl std::fmt::Display) -> TestbedError {
    TestbedError::Plot(format!("{}: {e}", path.display()))
}

fn color(i: usize) -> RGBColor {
    // Distinct, print-friendly (Okabe-Ito).
    const C: [RGBColor; 8] = [
        RGBColor(0, 114, 178),
        RGBColor(213, 94, 0),
        RGBColor(0, 158, 115),
        RGBColor(204, 121, 167),
        RGBColor(230, 159, 0),
        RGBColor(86, 180, 233),
        RGBColor(0, 0, 0),
        RGBColor(240, 228, 66),
    ];
    C[i % C.len()]
}

/// Queue depth at the bottleneck over time, one line per CC, with K_min and
/// K_max. When `none` runs more
/// than twice as long as every other CC, the time axis stops after the others.
pub fn queue(
    path: &Path,
    results: &[CcResult],
    k_min: u64,
    k_max: u64,
) -> Result<(), TestbedError> {
    let root = SVGBackend::new(path, (960, 480)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(path, e))?;
    let end = |r: &CcResult| r.queue_series.last().map_or(0.0, |p| p.0);
    let all = results.iter().map(end).fold(0.0f64, f64::max).max(1e-3);
    let others = results
        .iter()
        .filter(|r| r.cc != "none")
        .map(end)
        .fold(0.0f64, f64::max);
    let (xmax, note) = if others > 0.0 && all > 2.0 * others {
        (
            others * 1.1,
            format!(" (none cut at {:.0} ms of {:.0})", others * 1.1, all),
        )
    } else {
        (all, String::new())
    };
    const FLOOR: f64 = 0.0;
    let ymax = results
        .iter()
        .flat_map(|r| r.queue_series.iter().map(|p| p.1))
        .max()
        .unwrap_or(0)
        .max(k_max) as f64
        / 1000.0
        * 1.05;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!("bottleneck queue, largest sample per bin{note}"),
            ("sans-serif", 18),
        )
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0f64..xmax, 0f64..ymax.max(1.0))
        .map_err(|e| err(path, e))?;
    chart
        .configure_mesh()
        .x_desc("time (ms)")
        .y_desc("queue (KB)")
        .draw()
        .map_err(|e| err(path, e))?;
    for (i, r) in results.iter().enumerate() {
        let c = color(i);
        chart
            .draw_series(LineSeries::new(
                r.queue_series
                    .iter()
                    .filter(|p| p.0 <= xmax)
                    .map(|&(t, q)| (t, (q as f64 / 1000.0).max(FLOOR))),
                c.stroke_width(2),
            ))
            .map_err(|e| err(path, e))?
            .label(r.cc.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(2)));
    }
    for (name, k) in [("K_min", k_min), ("K_max", k_max)] {
        let g = RGBColor(120, 120, 120);
        let y = (k as f64 / 1000.0).max(FLOOR);
        chart
            .draw_series(LineSeries::new([(0.0, y), (xmax, y)], g.stroke_width(1)))
            .map_err(|e| err(path, e))?
            .label(name)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], g.stroke_width(1)));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(|e| err(path, e))?;
    root.present().map_err(|e| err(path, e))?;
    Ok(())
}

/// Per-flow goodput over time: one panel per CC, one line per flow.
pub fn rates(path: &Path, results: &[CcResult], bottleneck_gbps: f64) -> Result<(), TestbedError> {
    let n = results.len().max(1);
    let root = SVGBackend::new(path, (960, 260 * n as u32)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(path, e))?;
    let panels = root.split_evenly((n, 1));
    for (r, area) in results.iter().zip(panels.iter()) {
        let bins = r.rates.first().map_or(0, |x| x.1.len());
        let xmax = (bins as f64 * r.rate_bin_ms).max(1e-3);
        let ymax = r
            .rates
            .iter()
            .flat_map(|x| x.1.iter().copied())
            .fold(bottleneck_gbps, f64::max)
            * 1.1;
        let mut chart = ChartBuilder::on(area)
            .caption(
                format!("{}: goodput per flow ({:.2} ms bins)", r.cc, r.rate_bin_ms),
                ("sans-serif", 16),
            )
            .margin(10)
            .x_label_area_size(35)
            .y_label_area_size(55)
            .build_cartesian_2d(0f64..xmax, 0f64..ymax)
            .map_err(|e| err(path, e))?;
        chart
            .configure_mesh()
            .x_desc("time (ms)")
            .y_desc("Gbit/s")
            .draw()
            .map_err(|e| err(path, e))?;
        for (i, (label, v)) in r.rates.iter().enumerate() {
            let c = color(i);
            chart
                .draw_series(LineSeries::new(
                    v.iter()
                        .enumerate()
                        .map(|(k, &g)| ((k as f64 + 0.5) * r.rate_bin_ms, g)),
                    c.stroke_width(1),
                ))
                .map_err(|e| err(path, e))?
                .label(label.clone())
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 16, y)], c.stroke_width(2))
                });
        }
        if r.rates.len() <= 16 {
            chart
                .configure_series_labels()
                .position(SeriesLabelPosition::UpperRight)
                .background_style(WHITE.mix(0.85))
                .border_style(BLACK)
                .draw()
                .map_err(|e| err(path, e))?;
        }
    }
    root.present().map_err(|e| err(path, e))?;
    Ok(())
}

/// CDF of the judged flows' FCTs, one line per CC.
pub fn fct_cdf(path: &Path, results: &[CcResult]) -> Result<(), TestbedError> {
    let root = SVGBackend::new(path, (960, 480)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(path, e))?;
    let xmax = results
        .iter()
        .filter_map(|r| r.fcts_us.last().copied())
        .fold(0.0f64, f64::max)
        .max(1.0)
        * 1.05;
    let mut chart = ChartBuilder::on(&root)
        .caption("flow completion time CDF", ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0f64..xmax, 0f64..1.0f64)
        .map_err(|e| err(path, e))?;
    chart
        .configure_mesh()
        .x_desc("FCT (us)")
        .y_desc("fraction of flows")
        .draw()
        .map_err(|e| err(path, e))?;
    for (i, r) in results.iter().enumerate() {
        if r.fcts_us.is_empty() {
            continue;
        }
        let c = color(i);
        let n = r.fcts_us.len() as f64;
        let mut pts = vec![(0.0, 0.0)];
        for (k, &f) in r.fcts_us.iter().enumerate() {
            pts.push((f, k as f64 / n));
            pts.push((f, (k + 1) as f64 / n));
        }
        chart
            .draw_series(LineSeries::new(pts, c.stroke_width(2)))
            .map_err(|e| err(path, e))?
            .label(r.cc.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(2)));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(|e| err(path, e))?;
    root.present().map_err(|e| err(path, e))?;
    Ok(())
}

/// Draws the three plots into `dir`; returns the files written.
pub fn all(
    dir: &Path,
    results: &[CcResult],
    k_min: u64,
    k_max: u64,
    bottleneck_gbps: f64,
) -> Result<Vec<PathBuf>, TestbedError> {
    std::fs::create_dir_all(dir).map_err(|e| TestbedError::Io {
        path: dir.display().to_string(),
        err: e,
    })?;
    let q = dir.join("queue.svg");
    queue(&q, results, k_min, k_max)?;
    let r = dir.join("rates.svg");
    rates(&r, results, bottleneck_gbps)?;
    let mut out = vec![q, r];
    if results.iter().any(|r| !r.fcts_us.is_empty()) {
        let f = dir.join("fct_cdf.svg");
        fct_cdf(&f, results)?;
        out.push(f);
    }
    Ok(out)
}
