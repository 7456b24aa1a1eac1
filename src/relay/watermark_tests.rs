use super::*;
use proptest::prelude::*;

#[test]
fn confirms_only_after_every_event_of_the_transaction() {
    let mut w = AckWatermark::new(Lsn(100));
    let t = w.begin().unwrap();
    w.event_sent(t, 10).unwrap();
    w.event_sent(t, 10).unwrap();
    w.commit(t, Lsn(200)).unwrap();
    assert_eq!(w.confirmed(), Lsn(100));
    w.acked(t, 10).unwrap();
    assert_eq!(w.confirmed(), Lsn(100));
    w.acked(t, 10).unwrap();
    assert_eq!(w.confirmed(), Lsn(200));
    assert!(w.is_idle());
    assert_eq!(w.in_flight_bytes(), 0);
}

#[test]
fn later_transaction_acked_first_waits_for_the_earlier_one() {
    let mut w = AckWatermark::new(Lsn(0));
    let a = w.begin().unwrap();
    w.event_sent(a, 1).unwrap();
    w.commit(a, Lsn(10)).unwrap();
    let b = w.begin().unwrap();
    w.event_sent(b, 1).unwrap();
    w.commit(b, Lsn(20)).unwrap();
    w.acked(b, 1).unwrap();
    assert_eq!(w.confirmed(), Lsn(0));
    w.acked(a, 1).unwrap();
    assert_eq!(w.confirmed(), Lsn(20));
}

#[test]
fn out_of_order_acks_stay_counted_until_confirmed() {
    let mut w = AckWatermark::new(Lsn(0));
    let a = w.begin().unwrap();
    w.event_sent(a, 1).unwrap();
    w.commit(a, Lsn(10)).unwrap();
    let b = w.begin().unwrap();
    w.event_sent(b, 1).unwrap();
    w.event_sent(b, 1).unwrap();
    w.commit(b, Lsn(20)).unwrap();
    let open = w.begin().unwrap();
    w.event_sent(open, 1).unwrap();
    // The open transaction's events never count (it cannot be confirmed before its commit).
    assert_eq!(w.committed_unconfirmed_events(), 3);
    w.acked(b, 1).unwrap();
    w.acked(b, 1).unwrap();
    assert_eq!(
        (w.in_flight_events(), w.committed_unconfirmed_events()),
        (2, 3),
        "acked behind a slower one"
    );
    w.acked(a, 1).unwrap();
    assert_eq!(w.committed_unconfirmed_events(), 0);
    w.commit(open, Lsn(30)).unwrap();
    assert_eq!(w.committed_unconfirmed_events(), 1);
}

#[test]
fn acks_before_commit_do_not_confirm_an_open_transaction() {
    let mut w = AckWatermark::new(Lsn(0));
    let a = w.begin().unwrap();
    w.event_sent(a, 1).unwrap();
    w.acked(a, 1).unwrap();
    assert_eq!(w.confirmed(), Lsn(0));
    w.keepalive(Lsn(500));
    assert_eq!(
        w.confirmed(),
        Lsn(0),
        "keepalive inside an open transaction must not confirm"
    );
    w.commit(a, Lsn(30)).unwrap();
    assert_eq!(w.confirmed(), Lsn(30));
}

#[test]
fn keepalive_confirms_wal_end_when_idle_and_queues_behind_pending() {
    let mut w = AckWatermark::new(Lsn(5));
    w.keepalive(Lsn(50));
    assert_eq!(w.confirmed(), Lsn(50));
    let a = w.begin().unwrap();
    w.event_sent(a, 1).unwrap();
    w.commit(a, Lsn(60)).unwrap();
    w.keepalive(Lsn(70));
    w.keepalive(Lsn(80));
    assert_eq!(w.confirmed(), Lsn(50));
    assert_eq!(w.pending.len(), 2, "consecutive keepalives fold into one marker");
    w.acked(a, 1).unwrap();
    assert_eq!(w.confirmed(), Lsn(80));
}

#[test]
fn failure_poisons_everything_after_it() {
    let mut w = AckWatermark::new(Lsn(0));
    let a = w.begin().unwrap();
    w.event_sent(a, 1).unwrap();
    w.commit(a, Lsn(10)).unwrap();
    let b = w.begin().unwrap();
    w.event_sent(b, 1).unwrap();
    w.commit(b, Lsn(20)).unwrap();
    w.failed(a, 1).unwrap();
    w.acked(b, 1).unwrap();
    w.keepalive(Lsn(99));
    assert_eq!(w.confirmed(), Lsn(0));
    assert!(w.is_poisoned());
}

#[test]
fn never_goes_backwards() {
    let mut w = AckWatermark::new(Lsn(1000));
    let a = w.begin().unwrap();
    w.commit(a, Lsn(900)).unwrap();
    assert_eq!(w.confirmed(), Lsn(1000));
    w.keepalive(Lsn(10));
    assert_eq!(w.confirmed(), Lsn(1000));
}

#[test]
fn misuse_is_reported_not_ignored() {
    let mut w = AckWatermark::new(Lsn(0));
    assert_eq!(w.acked(TxnTicket(7), 1), Err(WatermarkError::UnknownTicket(7)));
    let a = w.begin().unwrap();
    assert_eq!(w.begin(), Err(WatermarkError::AlreadyOpen));
    assert_eq!(w.acked(a, 1), Err(WatermarkError::NothingOutstanding(a.0)));
}

/// One generated transaction: its event count and whether the server sent a keepalive after it.
#[derive(Debug, Clone)]
struct GenTxn {
    events: u32,
    keepalive_after: bool,
}

fn scenario() -> impl Strategy<Value = (Vec<GenTxn>, Vec<u32>)> {
    prop::collection::vec((0u32..4, any::<bool>()), 1..40).prop_flat_map(|txns| {
        let txns: Vec<GenTxn> = txns
            .into_iter()
            .map(|(events, keepalive_after)| GenTxn {
                events,
                keepalive_after,
            })
            .collect();
        let total: u32 = txns.iter().map(|t| t.events).sum();
        // A random permutation of delivery order, expressed as picks from the remaining set.
        let picks = prop::collection::vec(any::<u32>(), total as usize);
        (Just(txns), picks)
    })
}

proptest! {
    /// Deliveries complete in random order, interleaved with the stream; after every step the
    /// reported LSN is never past the true safe point, never decreases, and it reaches the end.
    #[test]
    fn reported_lsn_never_passes_the_safe_point((txns, picks) in scenario(), stream_ahead in 1usize..10) {
        let mut w = AckWatermark::new(Lsn(0));
        // (ticket, txn index) of events handed to Kafka but not yet acknowledged.
        let mut in_flight: Vec<(TxnTicket, usize)> = Vec::new();
        let mut acked_per_txn = vec![0u32; txns.len()];
        let mut committed = 0usize;
        let mut picks = picks.into_iter();
        let mut last = Lsn(0);
        let end_lsn = |i: usize| Lsn(100 * (i as u64 + 1));
        let keepalive_lsn = |i: usize| Lsn(100 * (i as u64 + 1) + 50);

        let true_safe = |acked: &[u32], committed: usize, keepalives_seen: &dyn Fn(usize) -> bool| {
            let mut safe = Lsn(0);
            for (i, t) in txns.iter().enumerate().take(committed) {
                if acked[i] < t.events { break; }
                safe = end_lsn(i);
                if keepalives_seen(i) && t.keepalive_after { safe = keepalive_lsn(i); }
            }
            safe
        };

        loop {
            // Stream a few transactions ahead, then deliver one event.
            let mut streamed = 0;
            while committed < txns.len() && streamed < stream_ahead {
                let t = w.begin().unwrap();
                for _ in 0..txns[committed].events {
                    w.event_sent(t, 8).unwrap();
                    in_flight.push((t, committed));
                }
                w.commit(t, end_lsn(committed)).unwrap();
                if txns[committed].keepalive_after {
                    w.keepalive(keepalive_lsn(committed));
                }
                committed += 1;
                streamed += 1;
            }
            let c = committed;
            let safe = true_safe(&acked_per_txn, committed, &|i| i < c);
            prop_assert!(w.confirmed() <= safe, "confirmed {} past safe {}", w.confirmed(), safe);
            prop_assert!(w.confirmed() >= last);
            last = w.confirmed();
            if in_flight.is_empty() {
                if committed == txns.len() { break; }
                continue;
            }
            let pick = picks.next().unwrap_or(0) as usize % in_flight.len();
            let (ticket, idx) = in_flight.swap_remove(pick);
            w.acked(ticket, 8).unwrap();
            acked_per_txn[idx] += 1;
            let safe = true_safe(&acked_per_txn, committed, &|i| i < c);
            prop_assert!(w.confirmed() <= safe, "confirmed {} past safe {}", w.confirmed(), safe);
            prop_assert!(w.confirmed() >= last);
            last = w.confirmed();
        }
        // Everything acknowledged: the watermark reached the last transaction (or its keepalive).
        let n = txns.len() - 1;
        let expected = if txns[n].keepalive_after { keepalive_lsn(n) } else { end_lsn(n) };
        prop_assert_eq!(w.confirmed(), expected);
        prop_assert!(w.is_idle());
        prop_assert_eq!(w.in_flight_events(), 0);
    }
}
