use super::*;

#[test]
fn a_peer_verdict_is_kept_for_the_connection_until_the_ca_is_reloaded() {
    let conn = ConnInfo::default();
    let calls = std::cell::Cell::new(0);
    let verify = |result: Result<(), String>| {
        calls.set(calls.get() + 1);
        result
    };
    assert_eq!(conn.peer_verdict(1, || verify(Ok(()))), Ok(()));
    // Every request of the connection (each holds a clone) reuses it.
    let request = conn.clone();
    assert_eq!(request.peer_verdict(1, || verify(Err("x".into()))), Ok(()));
    assert_eq!(calls.get(), 1);
    // Another CA load: verified again, and the new verdict is the one kept.
    let refused = request.peer_verdict(2, || verify(Err("not the cluster's".into())));
    assert_eq!(refused, Err("not the cluster's".to_string()));
    assert_eq!(conn.peer_verdict(2, || verify(Ok(()))), refused);
    assert_eq!(calls.get(), 2);
    assert!(conn.cert_names().is_empty());
}

/// Review of issue 33: with every place taken, a new handshake took the oldest one's,
/// whoever held it, so one address opening ~850 silent connections a second evicted every
/// other client whose handshake took 300 ms. Now the address holding the most places
/// gives up its oldest: a flood from one address evicts only its own.
#[test]
fn a_flood_from_one_address_evicts_only_its_own_handshakes() {
    let flood: Option<IpAddr> = Some([10, 0, 0, 66].into());
    let client: Option<IpAddr> = Some([10, 0, 0, 7].into());
    let mut h = Handshakes::default();
    let mut flooding = Vec::new();
    for _ in 0..MAX_HANDSHAKES - 1 {
        flooding.push(h.start(flood).1);
    }
    let (_, mut served, _) = h.start(client);
    for _ in 0..10 * MAX_HANDSHAKES {
        flooding.push(h.start(flood).1);
    }
    assert!(
        served.try_recv().is_err(),
        "the client's handshake was evicted"
    );
    assert_eq!(h.pending.len(), MAX_HANDSHAKES);
    let given_up = flooding
        .iter_mut()
        .filter_map(|r| r.try_recv().ok())
        .count();
    assert_eq!(given_up, 10 * MAX_HANDSHAKES);
    // The addresses of one IPv6 /64 count as one source.
    let mut h = Handshakes::default();
    let (_, mut v6_client, _) = h.start(Some("2001:db8:1::7".parse().unwrap()));
    for i in 0..2 * MAX_HANDSHAKES as u16 {
        let one_host = std::net::Ipv6Addr::new(0x2001, 0xdb8, 2, 0, 0, 0, 9, i);
        h.start(Some(one_host.into()));
    }
    assert!(
        v6_client.try_recv().is_err(),
        "a /64's flood evicted another network"
    );
    // One address alone still takes the oldest place (as before), and a finished
    // handshake frees its address's place.
    let mut h = Handshakes::default();
    let (first, _gone, _) = h.start(client);
    h.finished(first);
    let (_, mut lone, _) = h.start(client);
    for _ in 0..MAX_HANDSHAKES {
        h.start(client);
    }
    assert!(lone.try_recv().is_ok());
}

/// Review of issue 33's change (F8), then its reviews (33c MED 6, 33d MED 2): when every
/// source holds one place (a flood from many networks), the tie went first to the oldest
/// place (the client that had waited longest), then to the newest (a client that had just
/// arrived, evicted by the next arrival), then to any silent place (a client whose first
/// bytes were not read yet). Now a flood's own places go first when it holds more than
/// one, else places silent for a while, else one drawn at random.
#[test]
fn a_flood_from_many_networks_evicts_silent_connections_and_no_client_by_its_timing() {
    let source = |i: u32| Some(IpAddr::from(std::net::Ipv4Addr::from(0x0a00_0000 + i)));
    let t0 = std::time::Instant::now();
    let ms = |n: u64| t0 + Duration::from_millis(n);
    // A client that sent its ClientHello before the flood keeps its place.
    let mut h = Handshakes::default();
    let (id, mut client, _) = h.start_at(Some([192, 0, 2, 7].into()), t0);
    h.spoke(id);
    for i in 0..MAX_HANDSHAKES as u32 - 1 {
        h.start_at(source(i), t0);
    }
    for i in 0..4 * MAX_HANDSHAKES as u32 {
        h.start_at(source(100_000 + i), ms(1_000 + 2 * u64::from(i)));
    }
    assert!(
        client.try_recv().is_err(),
        "a flood of one silent place per network evicted a client that spoke"
    );
    assert_eq!(h.pending.len(), MAX_HANDSHAKES);

    // A client arriving into a full table of silent places, before its first bytes are
    // read, outlives the next arrivals: the places silent for a while go first.
    let mut h = Handshakes::default();
    for i in 0..MAX_HANDSHAKES as u32 {
        h.start_at(source(i), t0);
    }
    let (_, mut newcomer, _) = h.start_at(Some([192, 0, 2, 8].into()), ms(1_000));
    for i in 0..MAX_HANDSHAKES as u32 - 1 {
        h.start_at(source(200_000 + i), ms(1_000 + 2 * u64::from(i)));
    }
    assert!(
        newcomer.try_recv().is_err(),
        "the next arrival evicted a client that had just connected"
    );

    // A flood from one address whose connections each send a byte evicts its own, never a
    // client whose first bytes were not read yet.
    let mut h = Handshakes::default();
    let flood = Some([10, 0, 0, 66].into());
    for _ in 0..MAX_HANDSHAKES - 1 {
        let (id, _, _) = h.start_at(flood, t0);
        h.spoke(id);
    }
    let (_, mut quiet, _) = h.start_at(Some([192, 0, 2, 9].into()), ms(1));
    for _ in 0..MAX_HANDSHAKES {
        let (id, _, _) = h.start_at(flood, ms(2));
        h.spoke(id);
    }
    assert!(
        quiet.try_recv().is_err(),
        "a speaking flood evicted a client"
    );

    // When every place spoke, which one makes way is drawn: the newest is not singled out.
    let mut newest_evicted = 0;
    for round in 0..200u32 {
        let mut h = Handshakes::default();
        let mut last = None;
        for i in 0..MAX_HANDSHAKES as u32 {
            let (id, rx, _) = h.start_at(source(round * 1_000 + i), t0);
            h.spoke(id);
            last = Some(rx);
        }
        let (id, _, _) = h.start_at(source(999_999), ms(1));
        h.spoke(id);
        if last.unwrap().try_recv().is_ok() {
            newest_evicted += 1;
        }
        assert_eq!(h.pending.len(), MAX_HANDSHAKES);
    }
    assert!(
        newest_evicted < 20,
        "the newest made way {newest_evicted} times of 200"
    );
}

// The simulator's network under real tonic.

mod over_the_simulator {
    use std::io;
    use std::time::Duration;

    use tonic_health::pb::health_client::HealthClient;
    use tonic_health::pb::HealthCheckRequest;

    use super::super::Conn;
    use crate::sim;
    use crate::tls::Tls;

    /// Real tonic over simulated connections, in paused time: many calls, some at once,
    /// none lost (a lost wake-up shows as a call that never ends).
    #[tokio::test(start_paused = true)]
    async fn tonic_calls_over_the_simulated_network_all_finish() {
        sim::install(1_000_000, 7);
        sim::route("10.0.0.1:7100", 0, 1);
        let listener = sim::Listener::bind(1, "10.0.0.1:7100".parse().unwrap());
        let (_reporter, health) = tonic_health::server::health_reporter();
        let incoming = futures::stream::unfold(listener, |mut l| async move {
            let s = l.accept().await?;
            Some((Ok::<_, io::Error>(Conn::Sim(s)), l))
        });
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(health)
                .serve_with_incoming(incoming),
        );
        let channel = Tls::default()
            .channel("10.0.0.1:7100", |e| e.timeout(Duration::from_secs(1)))
            .unwrap();
        let client = HealthClient::new(channel);
        for round in 0..50 {
            let calls = (0..(1 + round % 7)).map(|_| {
                let mut c = client.clone();
                async move { c.check(HealthCheckRequest::default()).await }
            });
            for r in futures::future::join_all(calls).await {
                r.unwrap_or_else(|e| panic!("round {round}: {e}"));
            }
            tokio::time::sleep(Duration::from_millis(1 + round % 13)).await;
        }
        sim::uninstall();
    }
}
