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
/// Connections refused at the connection limit.
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
    /// Connections refused at the limit.
    pub refused_connections: u64,
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

/// Builds Prometheus text format 0.0.4.
#[derive(Debug, Default)]
pub struct Exposition {
    out: String,
}

impl Exposition {
    /// Starts a metric family with its help text and type (`counter`, `gauge` or
    /// `histogram`).
    pub fn family(&mut self, name: &str, kind: &str, help: &str) -> &mut Self {
        let _ = writeln!(self.out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        self
    }

    /// One sample; `labels` are `(name, value)` pairs (values escaped here).
    pub fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: f64) -> &mut Self {
        self.line(name, "", labels, None, value)
    }

    /// The samples of histogram `name` with `labels` (its family started with
    /// [`Exposition::family`]): one cumulative `_bucket` per bound and `+Inf`, then
    /// `_sum` and `_count`.
    pub fn histogram<const N: usize>(
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
    pub fn finish(self) -> String {
        self.out
    }
}
