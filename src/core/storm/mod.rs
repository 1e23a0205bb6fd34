//! Holding reconnection storms, sans-IO: the decisions that keep the reactor's one
//! thread answering while thousands of consumers come back at once.
//!
//! - [`Gate`]: whether an accepted connection is served or answered 503 with
//!   `Retry-After` before its request is read: the open connections per peer address
//!   (`max_connections_per_ip`) and a token bucket on accepts (`accept_rate`,
//!   `accept_burst`).
//! - [`Rng`]: the seeded randomness of the SSE `retry:` jitter (WHATWG HTML
//!   §9.2.6, "Server-sent events", the `retry` field) and of the order of the closes of
//!   a graceful shutdown, so that both are deterministic given a seed (virtual-time
//!   tests) and spread the consumers' reconnections out.
//!
//! Everything takes `now`; nothing here reads a clock.

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::{Duration, Instant};

/// The longest `Retry-After` the accept bucket gives, in seconds: past it a refused
/// peer is told to come back in this long however deep the backlog.
pub(crate) const MAX_RETRY_AFTER: u64 = 60;

/// The `Retry-After` of a refusal over `max_connections_per_ip`, in seconds: the peer's
/// own connections must close first, which a quick retry does not wait for.
pub(crate) const PER_IP_RETRY_AFTER: u64 = 5;

/// A small seeded generator (SplitMix64): cheap, and the same sequence for the same
/// seed. Not for secrets.
#[derive(Debug, Clone)]
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `0..=max`.
    pub(crate) fn up_to(&mut self, max: u64) -> u64 {
        if max == u64::MAX {
            return self.next_u64();
        }
        // The modulo bias is below 2^-40 for the spans used here (milliseconds).
        self.next_u64() % (max + 1)
    }

    /// Shuffles `items` in place (Fisher-Yates).
    pub(crate) fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            let j = self.up_to(i as u64) as usize;
            items.swap(i, j);
        }
    }
}

/// A token bucket on accepts: `rate` tokens a second, at most `burst` held; an accept
/// takes one. A refused accept is given a later slot, one `1/rate` after the previous
/// refused one, so the `Retry-After`s of a backlog spread its return over as many
/// seconds as the bucket needs to take it.
#[derive(Debug, Clone)]
pub(crate) struct Bucket {
    rate: f64,
    burst: f64,
    tokens: f64,
    at: Instant,
    /// The slot the next refused accept is given (never before `now`).
    next_slot: Instant,
}

impl Bucket {
    /// A full bucket (`rate` per second, `burst` at most; both at least 1).
    pub(crate) fn new(rate: u32, burst: u32, now: Instant) -> Bucket {
        let burst = f64::from(burst.max(1));
        Bucket {
            rate: f64::from(rate.max(1)),
            burst,
            tokens: burst,
            at: now,
            next_slot: now,
        }
    }

    /// Takes a token, or says in how many whole seconds (1 to [`MAX_RETRY_AFTER`]) the
    /// refused peer should come back.
    pub(crate) fn take(&mut self, now: Instant) -> Result<(), u64> {
        let dt = now.saturating_duration_since(self.at).as_secs_f64();
        self.at = now;
        self.tokens = (self.tokens + dt * self.rate).min(self.burst);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            return Ok(());
        }
        let step = Duration::from_secs_f64(1.0 / self.rate);
        let refill = Duration::from_secs_f64((1.0 - self.tokens) / self.rate);
        let slot = self.next_slot.max(now + refill);
        let wait = slot.saturating_duration_since(now);
        if wait < Duration::from_secs(MAX_RETRY_AFTER) {
            self.next_slot = slot + step;
        }
        // Whole seconds, rounded up (RFC 9110 §10.2.3: delay-seconds).
        let secs = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
        Err(secs.clamp(1, MAX_RETRY_AFTER))
    }
}

/// Why [`Gate::admit`] refused a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refused {
    /// The peer address has `max_connections_per_ip` open.
    PerIp(usize),
    /// The accept bucket is empty: come back in this many seconds.
    Rate(u64),
}

/// The accept gate: open connections per peer address and the accept bucket.
#[derive(Debug)]
pub(crate) struct Gate {
    /// Open connections by peer address; kept only with a per-address limit.
    per_ip: HashMap<IpAddr, usize>,
    max_per_ip: usize,
    bucket: Option<Bucket>,
}

impl Gate {
    /// A gate with no connection: `max_per_ip` 0 is no per-address limit, `rate` 0 no
    /// bucket.
    pub(crate) fn new(max_per_ip: usize, rate: u32, burst: u32, now: Instant) -> Gate {
        Gate {
            per_ip: HashMap::new(),
            max_per_ip,
            bucket: (rate > 0).then(|| Bucket::new(rate, burst, now)),
        }
    }

    /// Admits a connection from `ip` (then counted until [`Gate::release`]) or says
    /// why not. The per-address limit is judged first, so a peer over it spends no
    /// token of the others.
    pub(crate) fn admit(&mut self, ip: IpAddr, now: Instant) -> Result<(), Refused> {
        if self.max_per_ip > 0 {
            let open = self.per_ip.get(&ip).copied().unwrap_or(0);
            if open >= self.max_per_ip {
                return Err(Refused::PerIp(open));
            }
        }
        if let Some(b) = &mut self.bucket {
            b.take(now).map_err(Refused::Rate)?;
        }
        if self.max_per_ip > 0 {
            *self.per_ip.entry(ip).or_insert(0) += 1;
        }
        Ok(())
    }

    /// A connection from `ip` that [`Gate::admit`] admitted is gone.
    pub(crate) fn release(&mut self, ip: IpAddr) {
        if let Some(n) = self.per_ip.get_mut(&ip) {
            *n -= 1;
            if *n == 0 {
                self.per_ip.remove(&ip);
            }
        }
    }

    /// Addresses with a connection open (with a per-address limit; else 0).
    #[cfg(test)]
    pub(crate) fn addresses(&self) -> usize {
        self.per_ip.len()
    }
}

/// When each of `n` closes of a graceful shutdown happens, from `now`: evenly over
/// `window` (the first at `now`, the last before `now + window`). Which connection
/// gets which time is the caller's shuffle.
pub(crate) fn spread(now: Instant, window: Duration, n: usize) -> impl Iterator<Item = Instant> {
    (0..n).map(move |i| now + window.mul_f64(i as f64 / n.max(1) as f64))
}

#[cfg(test)]
mod tests;
