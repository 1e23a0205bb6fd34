//! Counters, histograms and the Prometheus text exposition of `GET /metrics` (auth:
//! `watch`). Metric names live here, in one place; they follow the Prometheus naming
//! conventions: counters end in `_total`, units are base units named as a suffix
//! (`_bytes`, `_seconds`), and a gauge never ends in `_total`. docs/operating.md, "Metrics", has the
//! table; `contrib/grafana/aep-relay.json` is a dashboard built on exactly these.

use std::fmt::Write as _;
use std::time::Duration;

/// Events ingested, by binding.
pub const INGESTED: &str = "aep_events_ingested_total";
/// Events (or batches) refused, by reason.
pub const REJECTED: &str = "aep_events_rejected_total";
/// Frames delivered to subscribers, by binding.
pub const DELIVERIES: &str = "aep_deliveries_total";
/// Events not delivered to a slow consumer, by `severity` (`debug`, `info`: nothing
/// above is ever dropped, AEP-0003 §8.4); one per Event and consumer.
pub const DROPPED: &str = "aep_dropped_events_total";
/// Consumers disconnected because a `notice`+ Event could not be queued.
pub const DISCONNECTS: &str = "aep_backpressure_disconnects_total";
/// Drops per live connection that had any (a counter per connection: it only grows
/// while the connection lives, and its series ends with it).
pub const CONN_DROPPED: &str = "aep_connection_dropped_events_total";
/// Open connections, by binding.
pub const CONNECTIONS: &str = "aep_connections";
/// Connections refused before their request was read, by reason (`max-connections`,
/// `per-ip`, `accept-rate`).
pub const REFUSED_CONNECTIONS: &str = "aep_connections_refused_total";
/// Live subscriptions.
pub const SUBSCRIPTIONS: &str = "aep_subscriptions";
/// Sessions held in the replay store.
pub const SESSIONS: &str = "aep_sessions";
/// Events held in the replay store.
pub const BUFFERED_EVENTS: &str = "aep_buffered_events";
/// Bytes of Events held in the replay store.
pub const BUFFERED_BYTES: &str = "aep_buffered_bytes";
/// Bytes queued for output across all connections.
pub const QUEUED_BYTES: &str = "aep_output_queued_bytes";
/// The memory budget in bytes (`--max-memory`); absent without one.
pub const MEMORY_BUDGET: &str = "aep_memory_budget_bytes";
/// Bytes the relay holds against its memory budget, by part (`events`, `records`,
/// `queues`, `connections`, `tls`, `deflate`).
pub const MEMORY_USED: &str = "aep_memory_used_bytes";
/// Consumers dropped because their output queues held the most of an exceeded memory
/// budget.
pub const MEMORY_DROPPED: &str = "aep_memory_dropped_consumers_total";
/// Events evicted from the replay store, by reason (`ring`: `--buffer`, `sessions`:
/// `--max-sessions`, `memory`: `--max-memory`).
pub const EVICTIONS: &str = "aep_evictions_total";
/// Seconds since start.
pub const UPTIME: &str = "aep_uptime_seconds";
/// Cluster mode: 1 for the relay's state (`connected`, `catching-up`, `degraded`).
pub const CLUSTER_STATE: &str = "aep_cluster_state";
/// Cluster mode: stream messages the relay's consumer has yet to deliver.
pub const CLUSTER_LAG: &str = "aep_cluster_lag_messages";
/// Cluster mode: Events ingested while degraded and not yet in the stream.
pub const CLUSTER_OUTBOX: &str = "aep_cluster_outbox_events";
/// Cluster mode: reconnections to the engine.
pub const CLUSTER_RECONNECTS: &str = "aep_cluster_reconnects_total";
/// Cluster mode: recreations of the relay's ordered consumer.
pub const CLUSTER_CONSUMER_RESETS: &str = "aep_cluster_consumer_resets_total";
/// Cluster mode: publishes the engine did not store.
pub const CLUSTER_PUBLISH_ERRORS: &str = "aep_cluster_publish_errors_total";
/// Histogram: seconds from an Event's fan-out to the write that carried it to a
/// consumer's socket, by binding (`sse`, `ws`); sampled, at most one delivery per
/// connection and write batch (see [`Histogram`]).
pub const DELIVERY_LATENCY: &str = "aep_delivery_latency_seconds";
/// Histogram: seconds from a `POST /events` request's first byte to its answer.
pub const POST_DURATION: &str = "aep_post_duration_seconds";

/// Bucket bounds of [`DELIVERY_LATENCY`], in seconds: 100 µs to 10 s. A consumer that
/// keeps up is written in the turn its Events were fanned out (0 s, the reactor reads
/// the clock once per turn); the upper buckets are consumers whose sockets are full.
pub const DELIVERY_LATENCY_BUCKETS: [f64; 14] = [
    0.0001, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0,
];
/// Bucket bounds of [`POST_DURATION`], in seconds: 500 µs to 30 s (a body trickling in,
/// or, in cluster mode, the wait for the engine's acknowledgements, bounded by twice
/// the ack timeout plus a second).
pub const POST_DURATION_BUCKETS: [f64; 14] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0, 30.0,
];

/// A metric family's type (`# TYPE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Only grows (a `_total`).
    Counter,
    /// Goes up and down.
    Gauge,
    /// A [`Histogram`]: `_bucket`, `_sum` and `_count` series.
    Histogram,
}

impl Kind {
    fn as_str(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        }
    }
}

/// One metric family of `GET /metrics`: its name, type and help text.
#[derive(Debug, Clone, Copy)]
pub struct Family {
    /// The metric name (one of this module's constants).
    pub name: &'static str,
    /// Its type.
    pub kind: Kind,
    /// Its `# HELP` text.
    pub help: &'static str,
}

const fn family(name: &'static str, kind: Kind, help: &'static str) -> Family {
    Family { name, kind, help }
}

/// Every metric family, in the order `GET /metrics` lists them: the one place where a
/// metric's name, type and help are written. What each one's value is, the core says
/// ([`render`] asks it by name).
pub const FAMILIES: &[Family] = &[
    family(INGESTED, Kind::Counter, "Events ingested, by binding."),
    family(REJECTED, Kind::Counter, "Requests or Events refused, by reason."),
    family(DELIVERIES, Kind::Counter, "Frames delivered to subscribers, by binding."),
    family(DROPPED, Kind::Counter, "Events not delivered to slow consumers, by severity (AEP-0003 §8.4: debug past half of --max-output, info past three quarters)."),
    family(DISCONNECTS, Kind::Counter, "Consumers disconnected because a notice-or-above Event could not be queued."),
    family(REFUSED_CONNECTIONS, Kind::Counter, "Connections refused with 503 before their request was read, by reason: max-connections (--max-connections), per-ip (--max-connections-per-ip), accept-rate (--accept-rate, --accept-burst)."),
    family(CONN_DROPPED, Kind::Counter, "Events dropped toward each live connection that had drops (the series ends with the connection)."),
    family(CONNECTIONS, Kind::Gauge, "Open connections, by binding."),
    family(SUBSCRIPTIONS, Kind::Gauge, "Live subscriptions."),
    family(SESSIONS, Kind::Gauge, "Sessions held in the replay store, one per owning stream (source, session)."),
    family(BUFFERED_EVENTS, Kind::Gauge, "Events held in the replay store."),
    family(BUFFERED_BYTES, Kind::Gauge, "Bytes the Events held in the replay store retain (each Event's own bytes: a held Event never keeps its batch body alive)."),
    family(QUEUED_BYTES, Kind::Gauge, "Bytes queued for output across all connections."),
    family(MEMORY_BUDGET, Kind::Gauge, "The memory budget in bytes (--max-memory, or half the cgroup limit or physical memory)."),
    family(MEMORY_USED, Kind::Gauge, "Bytes held against the memory budget, by part (shared frames counted once; TLS and deflate state estimated)."),
    family(MEMORY_DROPPED, Kind::Counter, "Consumers dropped because their output queues held the most of an exceeded memory budget."),
    family(EVICTIONS, Kind::Counter, "Events evicted from the replay store, by reason: ring (--buffer), sessions (--max-sessions), memory (--max-memory)."),
    family(UPTIME, Kind::Gauge, "Seconds since start."),
    family(DELIVERY_LATENCY, Kind::Histogram, "Seconds from an Event's fan-out (its ingest; in cluster mode its arrival from the stream) to the write that carried it to the consumer's socket, by binding; sampled, at most one delivery per connection and write batch."),
    family(POST_DURATION, Kind::Histogram, "Seconds from a POST /events request's first byte to its answer (in cluster mode, the wait for the engine's acknowledgements included)."),
    family(CLUSTER_STATE, Kind::Gauge, "Cluster mode: 1 for the relay's state with the engine."),
    family(CLUSTER_LAG, Kind::Gauge, "Cluster mode: stream messages the consumer has yet to deliver."),
    family(CLUSTER_OUTBOX, Kind::Gauge, "Cluster mode: Events ingested while degraded, not yet in the stream."),
    family(CLUSTER_RECONNECTS, Kind::Counter, "Cluster mode: reconnections to the engine."),
    family(CLUSTER_CONSUMER_RESETS, Kind::Counter, "Cluster mode: recreations of the ordered consumer."),
    family(CLUSTER_PUBLISH_ERRORS, Kind::Counter, "Cluster mode: publishes the engine did not store."),
];

/// Labels of one sample: `(name, value)` pairs (values are escaped when rendered).
pub type Labels = Vec<(&'static str, String)>;

/// The samples of one family, as the core reports them to [`render`].
#[derive(Debug)]
pub enum Samples<'a> {
    /// Plain values (counters, gauges), each with its labels.
    Values(Vec<(Labels, f64)>),
    /// Histograms, each with its labels.
    Histograms(Vec<(Labels, &'a Histogram<14>)>),
}

impl<'a> Samples<'a> {
    /// One value without labels.
    pub fn one(value: f64) -> Self {
        Samples::Values(vec![(Vec::new(), value)])
    }

    /// One value per value of `label`.
    pub fn by<V: Into<String>>(
        label: &'static str,
        values: impl IntoIterator<Item = (V, f64)>,
    ) -> Self {
        Samples::Values(
            values
                .into_iter()
                .map(|(v, n)| (vec![(label, v.into())], n))
                .collect(),
        )
    }

    /// One histogram per value of `label`.
    pub fn histograms(
        label: &'static str,
        values: impl IntoIterator<Item = (&'static str, &'a Histogram<14>)>,
    ) -> Self {
        Samples::Histograms(
            values
                .into_iter()
                .map(|(v, h)| (vec![(label, v.to_string())], h))
                .collect(),
        )
    }
}

/// The Prometheus text (format 0.0.4) of every family of [`FAMILIES`] for which
/// `samples` returns some (`None` leaves a family out: a feature that is off), in the
/// table's order: `# HELP`, `# TYPE`, then its samples.
pub fn render<'a>(mut samples: impl FnMut(&Family) -> Option<Samples<'a>>) -> String {
    let mut x = Exposition::default();
    for f in FAMILIES {
        let Some(s) = samples(f) else {
            continue;
        };
        x.family(f.name, f.kind.as_str(), f.help);
        match s {
            Samples::Values(v) => {
                for (labels, value) in &v {
                    x.sample(f.name, &borrowed(labels), *value);
                }
            }
            Samples::Histograms(v) => {
                for (labels, h) in &v {
                    x.histogram(f.name, &borrowed(labels), h);
                }
            }
        }
    }
    x.finish()
}

fn borrowed(labels: &Labels) -> Vec<(&str, &str)> {
    labels.iter().map(|(k, v)| (*k, v.as_str())).collect()
}

/// A Prometheus histogram with `N` fixed bucket bounds (seconds), held as counts per
/// bucket (not cumulative: the exposition sums them). Observing is a scan of `N`
/// bounds and three additions: no allocation, no clock (the caller measures with the
/// `now` it was given).
#[derive(Debug, Clone)]
pub struct Histogram<const N: usize> {
    bounds: &'static [f64; N],
    /// Observations in `(bounds[i-1], bounds[i]]`; above the last bound only in `count`.
    buckets: [u64; N],
    count: u64,
    sum: f64,
}

impl<const N: usize> Histogram<N> {
    /// An empty histogram over `bounds` (ascending).
    pub const fn new(bounds: &'static [f64; N]) -> Self {
        Histogram {
            bounds,
            buckets: [0; N],
            count: 0,
            sum: 0.0,
        }
    }

    /// Counts one observation of `d`.
    pub fn observe(&mut self, d: Duration) {
        let s = d.as_secs_f64();
        if let Some(i) = self.bounds.iter().position(|&b| s <= b) {
            self.buckets[i] += 1;
        }
        self.count += 1;
        self.sum += s;
    }

    /// Observations so far.
    pub fn count(&self) -> u64 {
        self.count
    }
}

/// Counters and histograms the core keeps.
#[derive(Debug, Clone)]
pub struct Metrics {
    /// Events ingested over HTTP POST (and by an embedding host's `Core::ingest`).
    pub ingested_http: u64,
    /// Events ingested from WebSocket emitters (commands included).
    pub ingested_ws: u64,
    /// Events ingested from a JSONL source (`--stdin`, `--ingest-file`).
    pub ingested_jsonl: u64,
    /// Refusals by error code (`invalid-event`, `too-many-events`, …).
    pub rejected: Vec<(&'static str, u64)>,
    /// Connections refused at `max_connections`.
    pub refused_connections: u64,
    /// Connections refused at `max_connections_per_ip`.
    pub refused_per_ip: u64,
    /// Connections refused by the accept bucket (`accept_rate`).
    pub refused_accept_rate: u64,
    /// [`DELIVERY_LATENCY`] of SSE consumers.
    pub latency_sse: Histogram<14>,
    /// [`DELIVERY_LATENCY`] of WebSocket consumers.
    pub latency_ws: Histogram<14>,
    /// [`POST_DURATION`].
    pub post_duration: Histogram<14>,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            ingested_http: 0,
            ingested_ws: 0,
            ingested_jsonl: 0,
            rejected: Vec::new(),
            refused_connections: 0,
            refused_per_ip: 0,
            refused_accept_rate: 0,
            latency_sse: Histogram::new(&DELIVERY_LATENCY_BUCKETS),
            latency_ws: Histogram::new(&DELIVERY_LATENCY_BUCKETS),
            post_duration: Histogram::new(&POST_DURATION_BUCKETS),
        }
    }
}

impl Metrics {
    /// Counts one refusal with `code`.
    pub fn reject(&mut self, code: &'static str) {
        match self.rejected.iter_mut().find(|(c, _)| *c == code) {
            Some((_, n)) => *n += 1,
            None => self.rejected.push((code, 1)),
        }
    }
}

/// Builds Prometheus text format 0.0.4 ([`render`] drives it).
#[derive(Debug, Default)]
struct Exposition {
    out: String,
}

impl Exposition {
    /// Starts a metric family with its help text and type (`counter`, `gauge` or
    /// `histogram`).
    fn family(&mut self, name: &str, kind: &str, help: &str) -> &mut Self {
        let _ = writeln!(self.out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        self
    }

    /// One sample; `labels` are `(name, value)` pairs (values escaped here).
    fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: f64) -> &mut Self {
        self.line(name, "", labels, None, value)
    }

    /// The samples of histogram `name` with `labels` (its family started with
    /// [`Exposition::family`]): one cumulative `_bucket` per bound and `+Inf`, then
    /// `_sum` and `_count`.
    fn histogram<const N: usize>(
        &mut self,
        name: &str,
        labels: &[(&str, &str)],
        h: &Histogram<N>,
    ) -> &mut Self {
        let mut cumulative = 0u64;
        for (bound, n) in h.bounds.iter().zip(h.buckets) {
            cumulative += n;
            let le = bound.to_string();
            self.line(name, "_bucket", labels, Some(&le), cumulative as f64);
        }
        self.line(name, "_bucket", labels, Some("+Inf"), h.count as f64)
            .line(name, "_sum", labels, None, h.sum)
            .line(name, "_count", labels, None, h.count as f64)
    }

    /// `{name}{suffix}{labels,le="…"} value`.
    fn line(
        &mut self,
        name: &str,
        suffix: &str,
        labels: &[(&str, &str)],
        le: Option<&str>,
        value: f64,
    ) -> &mut Self {
        self.out.push_str(name);
        self.out.push_str(suffix);
        let le = le.map(|v| ("le", v));
        let mut all = labels.iter().copied().chain(le).peekable();
        if all.peek().is_some() {
            self.out.push('{');
            for (i, (k, v)) in all.enumerate() {
                if i > 0 {
                    self.out.push(',');
                }
                let v = v
                    .replace('\\', "\\\\")
                    .replace('"', "\\\"")
                    .replace('\n', "\\n");
                let _ = write!(self.out, "{k}=\"{v}\"");
            }
            self.out.push('}');
        }
        let _ = writeln!(self.out, " {value}");
        self
    }

    /// The text.
    fn finish(self) -> String {
        self.out
    }
}
