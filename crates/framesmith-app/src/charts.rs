//! Line charts shared by the train and monitor panels.

use egui::{Color32, Ui};
use egui_plot::{Legend, Line, Plot, PlotPoints};

use super::theme;

/// Most points drawn per series; longer series are thinned evenly (the last point always kept).
pub const MAX_POINTS: usize = 2000;

/// One named series.
pub struct Series {
    pub name: &'static str,
    pub color: Color32,
    pub points: Vec<[f64; 2]>,
}

/// Draws a titled chart of `series`; `include_y` keeps a value (e.g. the memory total) in view.
pub fn chart_ui(ui: &mut Ui, id: &str, y_label: &str, series: Vec<Series>, include_y: Option<f64>) {
    let mut plot = Plot::new(id)
        .height(theme::CHART_HEIGHT)
        .legend(Legend::default())
        .y_axis_label(y_label.to_owned())
        .allow_scroll(false)
        .include_y(0.0);
    if let Some(y) = include_y {
        plot = plot.include_y(y);
    }
    plot.show(ui, |plot_ui| {
        for s in series {
            let points = PlotPoints::from(thin(s.points, MAX_POINTS));
            plot_ui.line(Line::new(s.name, points).color(s.color));
        }
    });
}

/// Keeps at most `max` points, evenly spaced, always including the last.
pub fn thin(points: Vec<[f64; 2]>, max: usize) -> Vec<[f64; 2]> {
    if points.len() <= max || max < 2 {
        return points;
    }
    let stride = points.len().div_ceil(max - 1);
    let last = points.len() - 1;
    let mut out: Vec<[f64; 2]> = points.iter().step_by(stride).copied().collect();
    if out.last() != points.get(last) {
        out.push(points[last]);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thin_keeps_short_series_and_bounds_long_ones() {
        let short: Vec<[f64; 2]> = (0..10).map(|i| [i as f64, 0.0]).collect();
        assert_eq!(thin(short.clone(), 100), short);
        let long: Vec<[f64; 2]> = (0..10_001).map(|i| [i as f64, 0.0]).collect();
        let thinned = thin(long, 100);
        assert!(thinned.len() <= 101, "{}", thinned.len());
        assert_eq!(thinned.first().unwrap()[0], 0.0);
        assert_eq!(thinned.last().unwrap()[0], 10_000.0);
    }
}
