//! A [`Listener`] on loopback with real sockets: the cap makes room for a
//! new client by closing idle connections, never busy ones; TLS handshakes
//! are bounded like request heads; shutdown lets requests in flight finish.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::routing::get;
use quiver_listen::{Connections, Listener, ListenerOptions};
use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// `/healthz` answers at once; `/slow` waits for a permit of `gate`.
fn router(gate: Arc<Semaphore>) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route(
            "/slow",
            get(move || {
                let gate = gate.clone();
                async move {
                    let _permit = gate.acquire().await;
                    "done"
                }
            }),
        )
}

struct Served {
    addr: SocketAddr,
    shutdown: CancellationToken,
    serving: JoinHandle<()>,
    gate: Arc<Semaphore>,
}

async fn serve(options: ListenerOptions, tls: Option<tokio_rustls::TlsAcceptor>) -> Served {
    let tcp = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = tcp.local_addr().unwrap();
    let connections = Connections::new(options);
    let shutdown = CancellationToken::new();
    let gate = Arc::new(Semaphore::new(0));
    let serving = tokio::spawn(
        Listener::new("test", tcp, &connections)
            .with_tls(tls)
            .serve(router(gate.clone()), shutdown.clone()),
    );
    Served {
        addr,
        shutdown,
        serving,
        gate,
    }
}

fn capped(max_connections: usize) -> ListenerOptions {
    ListenerOptions {
        max_connections: Some(max_connections),
        ..ListenerOptions::default()
    }
}

/// Sends `GET path` on a new connection; returns the connection (to read
/// the answer from).
async fn request(addr: SocketAddr, path: &str) -> TcpStream {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let head = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    stream.write_all(head.as_bytes()).await.unwrap();
    stream
}

/// Reads until the peer closes; what it sent (empty if it just closed).
async fn read_to_close(stream: &mut TcpStream, limit: Duration) -> String {
    let mut answer = Vec::new();
    tokio::time::timeout(limit, stream.read_to_end(&mut answer))
        .await
        .expect("closed within the limit")
        .ok();
    String::from_utf8_lossy(&answer).into_owned()
}

#[tokio::test]
async fn at_the_cap_idle_connections_make_room_and_busy_ones_are_kept() {
    let served = serve(capped(4), None).await;
    let mut slow = vec![request(served.addr, "/slow").await];
    tokio::time::sleep(Duration::from_millis(50)).await;
    let mut half_open = Vec::new();
    for _ in 0..50 {
        let mut stream = TcpStream::connect(served.addr).await.unwrap();
        stream
            .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
            .await
            .unwrap();
        half_open.push(stream);
    }
    let started = Instant::now();
    let mut health = request(served.addr, "/healthz").await;
    let answer = read_to_close(&mut health, Duration::from_secs(1)).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer:?}");
    assert!(started.elapsed() < Duration::from_millis(500));

    // Fill the rest of the cap with busy requests: a newcomer is refused.
    for _ in 0..3 {
        slow.push(request(served.addr, "/slow").await);
        // Busy (head parsed) before the next one arrives.
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    let mut refused = request(served.addr, "/healthz").await;
    assert_eq!(
        read_to_close(&mut refused, Duration::from_secs(1)).await,
        ""
    );
    // The busy ones were kept and are answered once they may finish.
    served.gate.add_permits(4);
    for stream in &mut slow {
        let answer = read_to_close(stream, Duration::from_secs(1)).await;
        assert!(answer.ends_with("done"), "{answer:?}");
    }
    served.shutdown.cancel();
    served.serving.await.unwrap();
}

#[tokio::test]
async fn silent_and_idle_connections_are_closed_by_their_deadlines() {
    let options = ListenerOptions {
        header_read_timeout: Duration::from_millis(200),
        idle_timeout: Duration::from_millis(400),
        ..ListenerOptions::default()
    };
    let served = serve(options, None).await;
    let mut silent = TcpStream::connect(served.addr).await.unwrap();
    let mut h2_preface_cut = TcpStream::connect(served.addr).await.unwrap();
    h2_preface_cut
        .write_all(b"PRI * HTTP/2.0\r\n")
        .await
        .unwrap();
    let mut idle = TcpStream::connect(served.addr).await.unwrap();
    idle.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let started = Instant::now();
    assert_eq!(read_to_close(&mut silent, Duration::from_secs(1)).await, "");
    assert_eq!(
        read_to_close(&mut h2_preface_cut, Duration::from_secs(1)).await,
        ""
    );
    let header_deadline = started.elapsed();
    let answer = read_to_close(&mut idle, Duration::from_secs(2)).await;
    let idle_deadline = started.elapsed();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer:?}");
    assert!(
        header_deadline >= Duration::from_millis(150)
            && header_deadline < Duration::from_millis(600),
        "{header_deadline:?}"
    );
    assert!(
        idle_deadline >= Duration::from_millis(350),
        "idle connection closed at the header deadline: {idle_deadline:?}"
    );
}

/// A TLS acceptor for a throw-away certificate.
fn acceptor() -> tokio_rustls::TlsAcceptor {
    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let issuer = Issuer::new(ca_params, ca_key);
    let key = KeyPair::generate().unwrap();
    let cert = CertificateParams::new(vec!["localhost".to_owned()])
        .unwrap()
        .signed_by(&key, &issuer)
        .unwrap();
    quiver_proto::tls::ServerTls::from_pem(cert.pem().as_bytes(), key.serialize_pem().as_bytes())
        .unwrap()
        .acceptor()
}

#[tokio::test]
async fn tls_handshakes_are_bounded_and_count_against_the_cap() {
    let options = ListenerOptions {
        header_read_timeout: Duration::from_millis(200),
        ..capped(2)
    };
    let served = serve(options, Some(acceptor())).await;
    let mut first = TcpStream::connect(served.addr).await.unwrap();
    tokio::time::sleep(Duration::from_millis(20)).await;
    let _second = TcpStream::connect(served.addr).await.unwrap();
    tokio::time::sleep(Duration::from_millis(20)).await;
    // A third makes room by closing the oldest handshake in progress.
    let _third = TcpStream::connect(served.addr).await.unwrap();
    let started = Instant::now();
    assert_eq!(read_to_close(&mut first, Duration::from_secs(1)).await, "");
    assert!(started.elapsed() < Duration::from_millis(150));
    let mut silent = TcpStream::connect(served.addr).await.unwrap();
    let started = Instant::now();
    assert_eq!(read_to_close(&mut silent, Duration::from_secs(1)).await, "");
    assert!(started.elapsed() >= Duration::from_millis(150));
}

#[tokio::test]
async fn shutdown_lets_requests_in_flight_finish() {
    let served = serve(ListenerOptions::default(), None).await;
    let mut slow = request(served.addr, "/slow").await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    served.shutdown.cancel();
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(
        TcpStream::connect(served.addr).await.is_err(),
        "still accepting after shutdown"
    );
    served.gate.add_permits(1);
    let answer = read_to_close(&mut slow, Duration::from_secs(1)).await;
    assert!(answer.ends_with("done"), "{answer:?}");
    tokio::time::timeout(Duration::from_secs(1), served.serving)
        .await
        .expect("serve returns once the last connection closed")
        .unwrap();
}
