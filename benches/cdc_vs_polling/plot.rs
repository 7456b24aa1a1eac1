//! Latency against rate for CDC and each polling interval, as SVG (no system fonts needed).

use std::path::Path;

use anyhow::{anyhow, Result};
use plotters::prelude::*;

use super::steady::Outcome;

const MODES: [&str; 4] = ["CDC", "poll 10 ms", "poll 100 ms", "poll 1 s"];

/// (achieved events/s, p50 ms, p99 ms).
type Point = (f64, f64, f64);

/// p99 (solid) and p50 (thin) commit-to-consumer latency over the achieved rate, one colour per
/// relay; single-event transactions only.
pub fn latency_vs_rate(path: &Path, steady: &[Outcome]) -> Result<()> {
    let series: Vec<(&str, Vec<Point>)> = MODES
        .iter()
        .map(|mode| {
            let mut points: Vec<Point> = steady
                .iter()
                .filter(|o| o.is_kafka() && o.mode == *mode && !o.rate.contains('×'))
                .filter_map(|o| o.delivery.as_ref()?.latency.map(|l| (o.achieved_per_s, l.p50, l.p99)))
                .collect();
            points.sort_by(|a, b| a.0.total_cmp(&b.0));
            (*mode, points)
        })
        .collect();
    let all = series.iter().flat_map(|(_, p)| p.iter());
    let (x_max, y_min, y_max) = all.fold((100.0f64, 1.0f64, 10.0f64), |(x, lo, hi), p| {
        (x.max(p.0), lo.min(p.1), hi.max(p.2))
    });
    let err = |e: &dyn std::fmt::Display| anyhow!("plotting {}: {e}", path.display());

    let root = SVGBackend::new(path, (960, 600)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "Commit-to-consumer latency vs event rate (p99 bold, p50 thin)",
            ("sans-serif", 20),
        )
        .margin(16)
        .x_label_area_size(48)
        .y_label_area_size(64)
        .build_cartesian_2d(
            (5.0..x_max * 1.5).log_scale(),
            ((y_min * 0.7).max(0.1)..y_max * 1.5).log_scale(),
        )
        .map_err(|e| err(&e))?;
    chart
        .configure_mesh()
        .x_desc("achieved events per second")
        .y_desc("latency, ms")
        .draw()
        .map_err(|e| err(&e))?;
    for (i, (mode, points)) in series.iter().enumerate() {
        if points.is_empty() {
            continue;
        }
        let color = Palette99::pick(i).to_rgba();
        chart
            .draw_series(LineSeries::new(
                points.iter().map(|p| (p.0, p.2)),
                color.stroke_width(3),
            ))
            .map_err(|e| err(&e))?
            .label(*mode)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 24, y)], color.stroke_width(3)));
        chart
            .draw_series(LineSeries::new(
                points.iter().map(|p| (p.0, p.1)),
                color.stroke_width(1),
            ))
            .map_err(|e| err(&e))?;
        chart
            .draw_series(points.iter().map(|p| Circle::new((p.0, p.2), 4, color.filled())))
            .map_err(|e| err(&e))?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(|e| err(&e))?;
    root.present().map_err(|e| err(&e))?;
    Ok(())
}
