//! The multi-host rehearsal of issue #16: two registry replicas and a worker,
//! each on a host of its own — a network namespace with its own address on
//! a bridge, made with iproute2 (`ip netns`, veth) for this test and removed
//! after it; traffic never leaves this machine. PostgreSQL is the shared
//! external dependency, reached through a TCP relay on the bridge (it
//! listens on the machine's loopback only). One replica is SIGKILLed under
//! write load: no acknowledged write is lost, the writers go on against the
//! other replica, and the worker fails over to it (R-SYNC-8) and ends at the
//! head revision with every record.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::process::Command;
use std::time::Duration;

use quiver_proto::v1 as pb;
use quiver_testkit::postgres::TestDatabase;
use tokio::net::{TcpListener, TcpStream};

use crate::harness::{
    ADMIN, CALLER, RegistryProcess, WORKER, WorkerProcess, WriteLoad, stdio_spec,
};

/// Runs `ip ARGS`; fails the test with its stderr when it fails.
fn ip(args: &[&str]) {
    let output = Command::new("ip")
        .args(args)
        .output()
        .expect("run ip (iproute2)");
    assert!(
        output.status.success(),
        "ip {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// Hosts on one bridge: network namespaces with an address each; the
/// bridge's own address (this process's side) is the gateway. Everything is
/// removed on drop.
struct TestNet {
    bridge: String,
    gateway: Ipv4Addr,
    hosts: Vec<(String, Ipv4Addr)>,
}

impl TestNet {
    fn create(names: &[&str]) -> TestNet {
        // Names and the subnet are unique to this process: interface names
        // are at most 15 bytes.
        let tag = std::process::id() % 100_000;
        let subnet = 1 + tag % 250;
        let bridge = format!("qvb{tag}");
        let gateway = Ipv4Addr::new(10, 213, subnet as u8, 1);
        let mut net = TestNet {
            bridge: bridge.clone(),
            gateway,
            hosts: Vec::new(),
        };
        ip(&["link", "add", &bridge, "type", "bridge"]);
        ip(&["addr", "add", &format!("{gateway}/24"), "dev", &bridge]);
        ip(&["link", "set", &bridge, "up"]);
        for (i, name) in names.iter().enumerate() {
            let netns = format!("qv{tag}-{name}");
            let address = Ipv4Addr::new(10, 213, subnet as u8, 2 + i as u8);
            let (outside, inside) = (format!("qvh{tag}{i}"), format!("qvn{tag}{i}"));
            ip(&["netns", "add", &netns]);
            net.hosts.push((netns.clone(), address));
            ip(&[
                "link", "add", &outside, "type", "veth", "peer", "name", &inside,
            ]);
            ip(&["link", "set", &inside, "netns", &netns]);
            ip(&["link", "set", &outside, "master", &bridge, "up"]);
            ip(&[
                "-n",
                &netns,
                "addr",
                "add",
                &format!("{address}/24"),
                "dev",
                &inside,
            ]);
            ip(&["-n", &netns, "link", "set", &inside, "up"]);
            ip(&["-n", &netns, "link", "set", "lo", "up"]);
        }
        net
    }

    /// The namespace and address of host `i`.
    fn host(&self, i: usize) -> (&str, IpAddr) {
        let (netns, address) = &self.hosts[i];
        (netns, IpAddr::V4(*address))
    }
}

impl Drop for TestNet {
    fn drop(&mut self) {
        // Deleting a namespace deletes the veth pair in it.
        for (netns, _) in &self.hosts {
            let _ = Command::new("ip").args(["netns", "del", netns]).status();
        }
        let _ = Command::new("ip")
            .args(["link", "del", &self.bridge])
            .status();
    }
}

/// Relays TCP connections to `listen` (on the bridge) to `target` (on this
/// machine's loopback), until dropped.
struct Relay {
    addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl Relay {
    async fn start(listen: IpAddr, target: SocketAddr) -> Relay {
        let listener = TcpListener::bind(SocketAddr::new(listen, 0))
            .await
            .expect("bind the relay on the bridge");
        let addr = listener.local_addr().expect("relay address");
        let task = tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                tokio::spawn(async move {
                    if let Ok(mut outbound) = TcpStream::connect(target).await {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    }
                });
            }
        });
        Relay { addr, task }
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// `postgres://…@host:port/db` with `host:port` replaced by `addr`.
fn via(url: &str, addr: SocketAddr) -> String {
    let mut url = url::Url::parse(url).expect("database URL");
    url.set_ip_host(addr.ip()).expect("an IP host");
    url.set_port(Some(addr.port())).expect("a port");
    url.to_string()
}

fn record(id: &str) -> pb::McpServerSpec {
    stdio_spec(id, "v")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_and_a_worker_on_separate_hosts_survive_a_replica_killed_under_write_load() {
    let net = TestNet::create(&["reg-a", "reg-b", "worker"]);
    let db = TestDatabase::create().await;
    let postgres: SocketAddr = {
        let url = url::Url::parse(db.url()).expect("database URL");
        let host = url.host_str().expect("database host").to_owned();
        tokio::net::lookup_host((host.as_str(), url.port().unwrap_or(5432)))
            .await
            .expect("resolve the database host")
            .next()
            .expect("a database address")
    };
    let relay = Relay::start(IpAddr::V4(net.gateway), postgres).await;
    let db_url = via(db.url(), relay.addr);
    let args = [
        "--database-url",
        db_url.as_str(),
        "--admin-token",
        ADMIN,
        "--worker-token",
        WORKER,
    ];
    let ((netns_a, host_a), (netns_b, host_b), (netns_w, host_w)) =
        (net.host(0), net.host(1), net.host(2));
    let mut a = RegistryProcess::start_in(netns_a, host_a, &args).await;
    let b = RegistryProcess::start_in(netns_b, host_b, &args).await;
    assert_eq!(a.grpc_addr().ip(), host_a);
    let worker = WorkerProcess::start_in(
        netns_w,
        host_w,
        &format!("{},{}", a.grpc_url(), b.grpc_url()),
        WORKER,
        CALLER,
        &[] as &[&str],
    )
    .await;
    let (_, ready) = worker.readyz().await;
    assert_eq!(ready["registry"], a.grpc_url(), "{ready}");

    // Writers on replica A until it dies; then writers on B.
    let on_a = WriteLoad::start(&a, ADMIN, 4, "a", record).await;
    crate::harness::eventually(
        Duration::from_secs(10),
        "writes acknowledged by A",
        || async { (on_a.acknowledged_count() >= 50).then_some(()) },
    )
    .await;
    a.kill_hard();
    let (attempted, acknowledged_a) = on_a.join_after_crash().await;
    let on_b = WriteLoad::start(&b, ADMIN, 4, "b", record).await;
    crate::harness::eventually(
        Duration::from_secs(10),
        "writes acknowledged by B",
        || async { (on_b.acknowledged_count() >= 50).then_some(()) },
    )
    .await;
    // B stays up: stop its writers by dropping their tasks' client side.
    let acknowledged_b = on_b.stop().await;

    // Every acknowledged write is there, at its revision, seen through B.
    let mut client = b.client(Some(ADMIN)).await;
    let mut listed = client
        .list_mcp_servers(pb::ListMcpServersRequest::default())
        .await
        .expect("list through B")
        .into_inner();
    // An upsert a stopped writer had in flight may still commit after the
    // list: list again until the revision stays put (a few seconds at most).
    for _ in 0..20 {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let again = client
            .list_mcp_servers(pb::ListMcpServersRequest::default())
            .await
            .expect("list through B")
            .into_inner();
        if again.revision == listed.revision {
            break;
        }
        listed = again;
    }
    let stored: std::collections::BTreeMap<String, u64> = listed
        .servers
        .iter()
        .map(|s| (s.spec.as_ref().expect("spec").server_id.clone(), s.revision))
        .collect();
    for (id, revision) in acknowledged_a.iter().chain(&acknowledged_b) {
        assert_eq!(
            stored.get(id),
            Some(revision),
            "acknowledged write {id}@{revision} lost"
        );
    }
    let head = listed.revision;
    // The worker followed B from where A left off, without a gap.
    worker.synced(head, Duration::from_secs(20)).await;
    let (_, ready) = worker.readyz().await;
    assert_eq!(ready["registry"], b.grpc_url(), "{ready}");
    let servers = worker.get("/v1/mcp/servers").await.1["servers"]
        .as_array()
        .expect("servers")
        .len();
    assert_eq!(servers, stored.len());
    eprintln!(
        "multi-host: {} writes acknowledged by A before its SIGKILL ({attempted} attempted), \
         {} by B after; {} records at revision {head}; worker failed over to B",
        acknowledged_a.len(),
        acknowledged_b.len(),
        stored.len()
    );
    drop((worker, b, a, relay));
    drop(net);
}
