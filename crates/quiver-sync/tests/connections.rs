//! A fleet of syncs at the registry's connection cap (issue #28).
//!
//! A registry caps its open connections; at the cap it closes the oldest
//! idle one to make room. The fan-out benchmark broke at 10,000 workers
//! because each sync held two connections (its watch's and its status
//! reports'): 20,000 passed the cap, and the oldest idle connection, the
//! admin client's, was closed under its next upsert. A sync now holds one
//! connection per replica whatever it calls, so a registry whose cap fits
//! its workers sheds nobody. Both hops here are counted by a loopback TCP
//! forwarder in front of the real registry.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use quiver_model::{McpServerSpec, StdioConfig, Transport};
use quiver_proto::credentials::{Credentials, RegistryClient};
use quiver_proto::v1 as pb;
use quiver_sync::{SyncOptions, SyncService};
use quiver_testkit::registry::{ADMIN_TOKEN, InProcessRegistry, WORKER_TOKEN};
use serde_json::Value;
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;

/// Syncs of the fleet (the benchmark runs 10,000; the cap scales with it).
const SYNCS: usize = 40;

/// A loopback TCP hop to a registry that counts the connections through it.
struct Hop {
    url: String,
    accepted: Arc<AtomicUsize>,
}

impl Hop {
    async fn to(target: SocketAddr) -> Hop {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = accepted.clone();
        tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                count.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    if let Ok(mut outbound) = TcpStream::connect(target).await {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    }
                });
            }
        });
        Hop { url, accepted }
    }

    fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }
}

async fn upsert(admin: &mut RegistryClient, id: &str) -> u64 {
    let mut spec = McpServerSpec::new(id, Transport::Stdio);
    spec.stdio = Some(StdioConfig {
        command: "mcp-server".into(),
        ..Default::default()
    });
    let response = admin
        .upsert_mcp_server(pb::UpsertMcpServerRequest {
            server: Some((&spec).into()),
            expected_revision: None,
        })
        .await
        .expect("the admin's upsert")
        .into_inner();
    response.server.unwrap().revision
}

/// Workers on the registry's board, by id.
async fn board(registry: &InProcessRegistry) -> Vec<Value> {
    let body: Value = reqwest::Client::new()
        .get(registry.url("/admin/api/workers"))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap()
        .error_for_status()
        .unwrap()
        .json()
        .await
        .unwrap();
    body["workers"].as_array().cloned().unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_that_fits_the_cap_sheds_no_connection() {
    // Room for the syncs, the admin client and one REST request.
    let registry = InProcessRegistry::sqlite(|options| {
        options.listener.max_connections = Some(SYNCS + 2);
    })
    .await;
    let admin_hop = Hop::to(registry.grpc_addr()).await;
    let channel = Channel::from_shared(admin_hop.url.clone())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut admin = Credentials::new(Some(ADMIN_TOKEN), None)
        .unwrap()
        .client(channel);
    // The admin's connection is now the oldest, and idle.
    upsert(&mut admin, "first").await;

    let sync_hop = Hop::to(registry.grpc_addr()).await;
    let shutdown = CancellationToken::new();
    let mut handles = Vec::new();
    for i in 0..SYNCS {
        let service = SyncService::new(SyncOptions {
            registry_urls: vec![sync_hop.url.clone()],
            token: Some(WORKER_TOKEN.into()),
            worker_id: format!("fleet-{i}"),
            report_interval: Duration::from_millis(100),
            ..Default::default()
        })
        .unwrap();
        handles.push(service.handle());
        tokio::spawn(service.run(shutdown.clone()));
    }
    for handle in &handles {
        tokio::time::timeout(Duration::from_secs(10), handle.wait_ready())
            .await
            .expect("every sync gets ready");
    }
    // Every sync watches and has reported (several times by now).
    let deadline = Instant::now() + Duration::from_secs(10);
    while board(&registry).await.len() < SYNCS {
        assert!(Instant::now() < deadline, "not every sync reported");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;

    let revision = upsert(&mut admin, "second").await;
    for handle in &handles {
        let mut updates = handle.subscribe();
        tokio::time::timeout(
            Duration::from_secs(10),
            updates.wait_for(|update| update.snapshot.revision >= revision),
        )
        .await
        .expect("every sync reaches the upsert")
        .unwrap();
    }
    assert_eq!(
        sync_hop.accepted(),
        SYNCS,
        "one connection per sync (watch, list, reports alike)"
    );
    assert_eq!(
        admin_hop.accepted(),
        1,
        "the admin's connection was closed to make room"
    );
    shutdown.cancel();
}
