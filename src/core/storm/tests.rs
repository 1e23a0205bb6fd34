//! The storm module's decisions, in virtual time.

use super::*;
use std::net::Ipv4Addr;

fn ip(last: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(10, 0, 0, last))
}

#[test]
fn rng_is_deterministic_and_bounded() {
    let (mut a, mut b) = (Rng::new(7), Rng::new(7));
    for _ in 0..1000 {
        let x = a.up_to(4000);
        assert_eq!(x, b.up_to(4000));
        assert!(x <= 4000);
    }
    let mut v: Vec<u32> = (0..100).collect();
    Rng::new(1).shuffle(&mut v);
    let mut w: Vec<u32> = (0..100).collect();
    Rng::new(1).shuffle(&mut w);
    assert_eq!(v, w);
    assert_ne!(v, (0..100).collect::<Vec<_>>());
    v.sort_unstable();
    assert_eq!(v, (0..100).collect::<Vec<_>>());
}

#[test]
fn bucket_takes_its_burst_then_refills_at_its_rate() {
    let t0 = Instant::now();
    let mut b = Bucket::new(10, 5, t0);
    for _ in 0..5 {
        assert_eq!(b.take(t0), Ok(()));
    }
    assert!(b.take(t0).is_err());
    // 100 ms is one token at 10 a second.
    let t1 = t0 + Duration::from_millis(100);
    assert_eq!(b.take(t1), Ok(()));
    assert!(b.take(t1).is_err());
    // Never more than the burst, however long it rested.
    let t2 = t1 + Duration::from_secs(3600);
    let taken = (0..100).take_while(|_| b.take(t2).is_ok()).count();
    assert_eq!(taken, 5);
}

#[test]
fn refused_accepts_are_told_to_come_back_spread_over_the_backlog() {
    let t0 = Instant::now();
    let mut b = Bucket::new(100, 100, t0);
    for _ in 0..100 {
        b.take(t0).unwrap();
    }
    let afters: Vec<u64> = (0..1000).map(|_| b.take(t0).unwrap_err()).collect();
    // 100 a second: the first hundred in 1 s, the next in 2 s, ..., the last in 10 s.
    assert_eq!(afters[0], 1);
    assert_eq!(afters[99], 1);
    assert_eq!(afters[100], 2);
    assert_eq!(*afters.last().unwrap(), 10);
    assert!(afters.windows(2).all(|w| w[0] <= w[1]));
    // A flood is capped.
    for _ in 0..10_000 {
        assert!(b.take(t0).unwrap_err() <= MAX_RETRY_AFTER);
    }
}

#[test]
fn gate_counts_per_address_and_judges_it_before_the_bucket() {
    let t0 = Instant::now();
    let mut g = Gate::new(2, 3, 3, t0);
    assert_eq!(g.admit(ip(1), t0), Ok(()));
    assert_eq!(g.admit(ip(1), t0), Ok(()));
    assert_eq!(g.admit(ip(1), t0), Err(Refused::PerIp(2)));
    assert_eq!(g.admit(ip(2), t0), Ok(()));
    // The bucket (3) is spent by the three admitted, not by the refused one.
    assert!(matches!(g.admit(ip(3), t0), Err(Refused::Rate(_))));
    g.release(ip(1));
    let t1 = t0 + Duration::from_secs(1);
    assert_eq!(g.admit(ip(1), t1), Ok(()));
    g.release(ip(1));
    g.release(ip(1));
    g.release(ip(2));
    assert_eq!(g.addresses(), 0);
}

#[test]
fn gate_without_limits_admits_everything() {
    let t0 = Instant::now();
    let mut g = Gate::new(0, 0, 0, t0);
    for i in 0..10_000 {
        assert_eq!(g.admit(ip((i % 7) as u8), t0), Ok(()));
    }
    assert_eq!(g.addresses(), 0);
}

#[test]
fn spread_covers_the_window_evenly() {
    let t0 = Instant::now();
    let w = Duration::from_secs(5);
    let at: Vec<Instant> = spread(t0, w, 10).collect();
    assert_eq!(at[0], t0);
    assert_eq!(at[5], t0 + Duration::from_millis(2500));
    assert!(at[9] < t0 + w);
    assert_eq!(spread(t0, w, 0).count(), 0);
}
