//! A sandbox's network: a namespace of its own with one veth pair to the
//! host and no default route, so the only address it can reach is the host
//! end, where a relay forwards one port to the proxy. Isolation is checked
//! from the routing table (`ip route get` of an outside address must be
//! unreachable), never by connecting out. Its nameserver is the host end too:
//! a [`Resolver`] that refuses every query and keeps the names asked. Needs
//! root (CAP_NET_ADMIN, and port 53).

use crate::resolver::{Question, Resolver};

use std::net::{Ipv4Addr, SocketAddr};
use tokio::net::{TcpListener, TcpStream};
use tokio::process::Command;
use tokio::task::JoinHandle;

/// Pairs are `flr{n}h` (host) and `flr{n}n` (namespace), in `10.214.0.0/16`:
/// one /30 per `n`.
const SLOTS: u32 = 1 << 14;

#[derive(Debug, thiserror::Error)]
pub enum NetworkError {
    #[error("ip {args}: {stderr} (a sandbox network needs root: CAP_NET_ADMIN)")]
    Ip { args: String, stderr: String },
    #[error("iproute2's `ip` is not installed: {0}")]
    NoIp(std::io::Error),
    #[error("no free sandbox network slot (flr0..flr{SLOTS} all taken)")]
    Exhausted,
    #[error("relay on {addr}: {source}")]
    Relay {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("the sandbox's resolver on {ip}:53: {source}")]
    Resolver {
        ip: Ipv4Addr,
        source: std::io::Error,
    },
    #[error("namespace {ns} is not isolated: {why}")]
    NotIsolated { ns: String, why: String },
}

async fn ip(args: &[&str]) -> Result<String, NetworkError> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .await
        .map_err(NetworkError::NoIp)?;
    if !out.status.success() {
        return Err(NetworkError::Ip {
            args: args.join(" "),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The namespace's name for slot `n` (what `podman --network ns:` joins).
pub fn namespace_name(n: u32) -> String {
    format!("forgelog-{n}")
}

fn addresses(n: u32) -> (Ipv4Addr, Ipv4Addr) {
    let base = u32::from(Ipv4Addr::new(10, 214, 0, 0)) + n * 4;
    (Ipv4Addr::from(base + 1), Ipv4Addr::from(base + 2))
}

/// A live sandbox network; [`SandboxNetwork::remove`] deletes it.
#[derive(Debug)]
pub struct SandboxNetwork {
    pub slot: u32,
    pub namespace: String,
    /// The host end: the sandbox reaches the proxy at `http://{host_ip}:{port}`.
    pub host_ip: Ipv4Addr,
    pub port: u16,
    relay: JoinHandle<()>,
    resolver: Option<Resolver>,
}

impl SandboxNetwork {
    /// A namespace whose only way out is a relay to `proxy`, starting the
    /// search for a free slot at `hint` (slots are taken atomically by
    /// creating the veth pair, so concurrent orchestrators never share one).
    pub async fn create(proxy: SocketAddr, hint: u32) -> Result<SandboxNetwork, NetworkError> {
        let mut slot = None;
        for i in 0..SLOTS {
            let n = (hint + i) % SLOTS;
            let (h, p) = (format!("flr{n}h"), format!("flr{n}n"));
            match ip(&["link", "add", &h, "type", "veth", "peer", "name", &p]).await {
                Ok(_) => {
                    slot = Some(n);
                    break;
                }
                Err(NetworkError::Ip { stderr, .. }) if stderr.contains("exists") => continue,
                Err(e) => return Err(e),
            }
        }
        let n = slot.ok_or(NetworkError::Exhausted)?;
        let net = SandboxNetwork {
            slot: n,
            namespace: namespace_name(n),
            host_ip: addresses(n).0,
            port: proxy.port(),
            relay: tokio::spawn(async {}),
            resolver: None,
        };
        match net.configure().await {
            Ok(()) => {}
            Err(e) => {
                net.remove().await;
                return Err(e);
            }
        }
        let listen = SocketAddr::from((net.host_ip, net.port));
        let listener = match TcpListener::bind(listen).await {
            Ok(l) => l,
            Err(source) => {
                net.remove().await;
                return Err(NetworkError::Relay {
                    addr: listen,
                    source,
                });
            }
        };
        let net = SandboxNetwork {
            relay: tokio::spawn(relay(listener, proxy)),
            ..net
        };
        match Resolver::start(net.host_ip).await {
            Ok(r) => Ok(SandboxNetwork {
                resolver: Some(r),
                ..net
            }),
            Err(source) => {
                let ip = net.host_ip;
                net.remove().await;
                Err(NetworkError::Resolver { ip, source })
            }
        }
    }

    /// The DNS questions the sandbox asked so far, in order.
    pub fn dns_asked(&self) -> Vec<Question> {
        self.resolver
            .as_ref()
            .map(Resolver::asked)
            .unwrap_or_default()
    }

    async fn configure(&self) -> Result<(), NetworkError> {
        let n = self.slot;
        let (host, inside) = addresses(n);
        let (h, p, ns) = (format!("flr{n}h"), format!("flr{n}n"), &self.namespace);
        // A namespace left by a killed orchestrator on this slot goes first.
        let _ = ip(&["netns", "del", ns]).await;
        ip(&["netns", "add", ns]).await?;
        ip(&["link", "set", &p, "netns", ns]).await?;
        ip(&["addr", "add", &format!("{host}/30"), "dev", &h]).await?;
        ip(&["link", "set", &h, "up"]).await?;
        ip(&["-n", ns, "addr", "add", &format!("{inside}/30"), "dev", &p]).await?;
        ip(&["-n", ns, "link", "set", &p, "up"]).await?;
        ip(&["-n", ns, "link", "set", "lo", "up"]).await?;
        self.check_isolated().await
    }

    /// The routing table's word: the host end is reachable through the veth,
    /// an outside address is not (no default route), and no route but the
    /// veth's own /30 exists.
    pub async fn check_isolated(&self) -> Result<(), NetworkError> {
        let ns = &self.namespace;
        let not_isolated = |why: String| NetworkError::NotIsolated {
            ns: ns.clone(),
            why,
        };
        let to_host = ip(&["-n", ns, "route", "get", &self.host_ip.to_string()]).await?;
        if !to_host.contains(&format!("flr{}n", self.slot)) {
            return Err(not_isolated(format!(
                "the host end is routed as {to_host:?}"
            )));
        }
        for outside in ["1.1.1.1", "8.8.8.8", "10.0.0.1", "192.168.0.1"] {
            match ip(&["-n", ns, "route", "get", outside]).await {
                Err(NetworkError::Ip { stderr, .. }) if stderr.contains("unreachable") => {}
                other => return Err(not_isolated(format!("{outside} is routed: {other:?}"))),
            }
        }
        let routes = ip(&["-n", ns, "-4", "route", "show", "table", "all"]).await?;
        let routes: Vec<&str> = routes
            .lines()
            .filter(|l| !l.contains("table local"))
            .collect();
        if routes.len() != 1 {
            return Err(not_isolated(format!("routes {routes:?}")));
        }
        Ok(())
    }

    /// Deletes the namespace (its veth pair goes with it) and stops the relay.
    pub async fn remove(self) {
        self.relay.abort();
        if let Some(r) = self.resolver {
            r.stop();
        }
        let _ = ip(&["netns", "del", &self.namespace]).await;
        let _ = ip(&["link", "del", &format!("flr{}h", self.slot)]).await;
    }
}

/// Deletes slot `n`'s namespace and pair, if there (a killed orchestrator's).
pub async fn remove_slot(n: u32) {
    let _ = ip(&["netns", "del", &namespace_name(n)]).await;
    let _ = ip(&["link", "del", &format!("flr{n}h")]).await;
}

/// Forwards every connection to `target` until aborted.
async fn relay(listener: TcpListener, target: SocketAddr) {
    while let Ok((mut inside, _)) = listener.accept().await {
        tokio::spawn(async move {
            if let Ok(mut proxy) = TcpStream::connect(target).await {
                let _ = tokio::io::copy_bidirectional(&mut inside, &mut proxy).await;
            }
        });
    }
}
