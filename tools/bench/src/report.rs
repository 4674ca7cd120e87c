//! Results: every run of every measurement is kept, and a figure is reported as the median of
//! its runs beside the runs themselves (the machine is shared and noisy; the spread matters).

use std::collections::BTreeMap;
use std::path::Path;

use serde::Serialize;

/// One measured value of one run.
#[derive(Debug, Clone)]
pub struct Sample {
    /// Which build was measured ("" unless two are compared).
    pub build: String,
    pub workload: String,
    pub params: String,
    pub metric: &'static str,
    pub unit: &'static str,
    pub value: f64,
}

/// A row of the result table: one metric of one configuration, over all runs.
#[derive(Debug, Serialize)]
pub struct Row {
    pub build: String,
    pub workload: String,
    pub params: String,
    pub metric: &'static str,
    pub unit: &'static str,
    pub median: f64,
    pub runs: Vec<f64>,
}

#[derive(Default)]
pub struct Results {
    samples: Vec<Sample>,
}

/// Collects the samples of one measurement under its workload and parameters.
pub struct Recorder<'a> {
    results: &'a mut Results,
    build: String,
    workload: String,
    params: String,
}

impl Recorder<'_> {
    pub fn put(&mut self, metric: &'static str, unit: &'static str, value: f64) {
        let build = match self.build.is_empty() {
            true => String::new(),
            false => format!("{} ", self.build),
        };
        println!(
            "  {build}{:<10} {:<22} {:<22} {} {unit}",
            self.workload,
            self.params,
            metric,
            fmt(value)
        );
        self.results.samples.push(Sample {
            build: self.build.clone(),
            workload: self.workload.clone(),
            params: self.params.clone(),
            metric,
            unit,
            value,
        });
    }
}

impl Results {
    /// A recorder for the measurements of `build` ("" unless two builds are compared).
    pub fn recorder_for(&mut self, build: &str, workload: &str, params: String) -> Recorder<'_> {
        Recorder {
            results: self,
            build: build.to_string(),
            workload: workload.to_string(),
            params,
        }
    }

    /// Rows in the order their first sample was taken, each with the median of its runs.
    pub fn rows(&self) -> Vec<Row> {
        let mut order = Vec::new();
        type Key<'a> = (String, String, String, &'a str);
        let mut runs: BTreeMap<Key, (&str, Vec<f64>)> = BTreeMap::new();
        for s in &self.samples {
            let key = (
                s.build.clone(),
                s.workload.clone(),
                s.params.clone(),
                s.metric,
            );
            let entry = runs.entry(key.clone()).or_insert_with(|| {
                order.push(key);
                (s.unit, Vec::new())
            });
            entry.1.push(s.value);
        }
        order
            .into_iter()
            .map(|key| {
                let (unit, values) = runs.remove(&key).expect("collected above");
                Row {
                    median: median(&values),
                    build: key.0,
                    workload: key.1,
                    params: key.2,
                    metric: key.3,
                    unit,
                    runs: values,
                }
            })
            .collect()
    }

    /// The table as Markdown (it goes straight into docs/benchmarks.md).
    pub fn table(&self) -> String {
        let mut out = String::from(
            "| workload | parameters | metric | median | unit | runs |\n|---|---|---|---:|---|---|\n",
        );
        for r in self.rows() {
            let runs: Vec<String> = r.runs.iter().map(|v| fmt(*v)).collect();
            out += &format!(
                "| {} | {} | {} | {} | {} | {} |\n",
                r.workload,
                r.params,
                r.metric,
                fmt(r.median),
                r.unit,
                runs.join(" / ")
            );
        }
        out
    }

    /// Two builds side by side (`a` the old, `b` the new): each metric's medians, their ratio
    /// b ÷ a, and the runs of each.
    pub fn compare_table(&self, a: &str, b: &str) -> String {
        let rows = self.rows();
        let mut out = format!(
            "| workload | parameters | metric | {a} | {b} | {b} ÷ {a} | unit | runs {a} | runs {b} |\n\
             |---|---|---|---:|---:|---:|---|---|---|\n"
        );
        let find = |build: &str, r: &Row| {
            rows.iter().find(|x| {
                x.build == build
                    && x.workload == r.workload
                    && x.params == r.params
                    && x.metric == r.metric
            })
        };
        let runs = |r: Option<&Row>| {
            r.map(|r| {
                r.runs
                    .iter()
                    .map(|v| fmt(*v))
                    .collect::<Vec<_>>()
                    .join(" / ")
            })
            .unwrap_or_default()
        };
        for r in rows.iter().filter(|r| r.build == a) {
            let other = find(b, r);
            let med_b = other.map_or(f64::NAN, |o| o.median);
            out += &format!(
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
                r.workload,
                r.params,
                r.metric,
                fmt(r.median),
                fmt(med_b),
                ratio(r.median, med_b),
                r.unit,
                runs(Some(r)),
                runs(other)
            );
        }
        out
    }

    pub fn write_json(&self, path: &Path, machine: &Machine) -> anyhow::Result<()> {
        #[derive(Serialize)]
        struct Doc<'a> {
            machine: &'a Machine,
            rows: Vec<Row>,
        }
        let doc = Doc {
            machine,
            rows: self.rows(),
        };
        std::fs::write(path, serde_json::to_string_pretty(&doc)?)?;
        Ok(())
    }
}

/// What the figures were measured on.
#[derive(Debug, Serialize)]
pub struct Machine {
    pub cpus: usize,
    pub memory_gib: f64,
    pub cpu_model: String,
    pub kernel: String,
    pub runs: usize,
    pub started: String,
}

impl Machine {
    pub fn probe(runs: usize) -> Machine {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu_model = cpuinfo
            .lines()
            .find_map(|l| l.strip_prefix("model name"))
            .map(|l| l.trim_start_matches([' ', '\t', ':']).to_string())
            .unwrap_or_default();
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        let mem_kib: f64 = meminfo
            .lines()
            .find_map(|l| l.strip_prefix("MemTotal:"))
            .and_then(|l| l.split_whitespace().next()?.parse().ok())
            .unwrap_or(0.0);
        let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
        Machine {
            cpus: std::thread::available_parallelism().map_or(0, |n| n.get()),
            memory_gib: (mem_kib / 1024.0 / 1024.0 * 10.0).round() / 10.0,
            cpu_model,
            kernel: kernel.trim().to_string(),
            runs,
            started: humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string(),
        }
    }
}

/// `b ÷ a` as "×1.23", or "-" when it means nothing.
fn ratio(a: f64, b: f64) -> String {
    if a == 0.0 || !a.is_finite() || !b.is_finite() {
        return "-".into();
    }
    let r = b / a;
    if r >= 10.0 {
        format!("×{r:.0}")
    } else {
        format!("×{r:.2}")
    }
}

pub fn median(values: &[f64]) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// Big numbers with thousands separators, small ones with a useful number of decimals.
pub fn fmt(v: f64) -> String {
    if !v.is_finite() {
        return "-".into();
    }
    if v.abs() >= 100.0 {
        let n = v.round() as i64;
        let digits = n.unsigned_abs().to_string();
        let mut out = String::new();
        for (i, c) in digits.chars().enumerate() {
            if i > 0 && (digits.len() - i).is_multiple_of(3) {
                out.push(',');
            }
            out.push(c);
        }
        return if n < 0 { format!("-{out}") } else { out };
    }
    if v.abs() >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_and_even_runs() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        assert!(median(&[]).is_nan());
    }

    #[test]
    fn numbers_are_readable() {
        assert_eq!(fmt(1_234_567.4), "1,234,567");
        assert_eq!(fmt(-1234.0), "-1,234");
        assert_eq!(fmt(12.34), "12.3");
        assert_eq!(fmt(0.5), "0.50");
    }

    #[test]
    fn rows_keep_first_seen_order_and_take_medians() {
        let mut r = Results::default();
        for run in 0..3 {
            r.recorder_for("", "schedule", "in_flight=1".into()).put(
                "rate",
                "/s",
                10.0 + run as f64,
            );
            r.recorder_for("", "batch", "size=100".into()).put(
                "rate",
                "/s",
                100.0 * (3 - run) as f64,
            );
        }
        let rows = r.rows();
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0].workload, "schedule");
        assert_eq!(rows[0].median, 11.0);
        assert_eq!(rows[1].runs, vec![300.0, 200.0, 100.0]);
        assert_eq!(rows[1].median, 200.0);
    }

    #[test]
    fn two_builds_side_by_side() {
        let mut r = Results::default();
        for (build, v) in [("old", 10.0), ("new", 25.0), ("old", 12.0), ("new", 30.0)] {
            r.recorder_for(build, "fire", "1/s".into())
                .put("rate", "/s", v);
        }
        let t = r.compare_table("old", "new");
        assert!(
            t.contains(
                "| fire | 1/s | rate | 11.0 | 27.5 | ×2.50 | /s | 10.0 / 12.0 | 25.0 / 30.0 |"
            ),
            "{t}"
        );
        assert_eq!(ratio(0.0, 1.0), "-");
    }
}
