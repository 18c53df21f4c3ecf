//! The log over TLS, as against a managed Kafka: the client settings come from
//! `FORGELOG_KAFKA_CONFIG`, the broker's certificate is verified against a CA
//! of the test's own, and a client that does not trust that CA gets nothing.
//!
//! tansu 0.6 serves no TLS, so the broker advertises a TLS front (rustls) that
//! forwards to it: every connection a client makes after the bootstrap goes to
//! the address the metadata names, which is the front.

use forgelog_schemas::testing::call_finished;
use forgelog_schemas::Event;
use forgelog_stream::broker::{find_tansu, LocalBroker};
use forgelog_stream::testing::{free_local_addr, produce, unique_run_id};
use forgelog_stream::{parse_properties, StreamConfig, PROPERTIES_ENV};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Output};
use std::sync::Arc;
use tokio_rustls::rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};
use tokio_rustls::rustls::ServerConfig;
use tokio_rustls::TlsAcceptor;

/// A CA (its PEM) and a server certificate for 127.0.0.1 that it signed.
fn certificates() -> (String, ServerConfig) {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};
    let ca_key = KeyPair::generate().unwrap();
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(DnType::CommonName, "forgelog test CA");
    let ca = ca.self_signed(&ca_key).unwrap();
    let key = KeyPair::generate().unwrap();
    let server = CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()])
        .unwrap()
        .signed_by(&key, &ca, &ca_key)
        .unwrap();
    let provider = Arc::new(tokio_rustls::rustls::crypto::ring::default_provider());
    let config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![server.der().clone()],
            PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
        )
        .unwrap();
    (ca.pem(), config)
}

/// Terminates TLS on `front` and relays each connection to `back`.
async fn tls_front(front: tokio::net::TcpListener, tls: ServerConfig, back: SocketAddr) {
    let acceptor = TlsAcceptor::from(Arc::new(tls));
    loop {
        let Ok((tcp, _)) = front.accept().await else {
            continue;
        };
        let acceptor = acceptor.clone();
        tokio::spawn(async move {
            // A client that refuses the certificate ends here.
            let Ok(mut tls) = acceptor.accept(tcp).await else {
                return;
            };
            if let Ok(mut broker) = tokio::net::TcpStream::connect(back).await {
                let _ = tokio::io::copy_bidirectional(&mut tls, &mut broker).await;
            }
        });
    }
}

fn forgelog(brokers: SocketAddr, properties: Option<&Path>, args: &[&str]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_forgelog"));
    cmd.args(args).env("FORGELOG_BROKERS", brokers.to_string());
    match properties {
        Some(p) => cmd.env(PROPERTIES_ENV, p),
        None => cmd.env_remove(PROPERTIES_ENV),
    };
    cmd.output().unwrap()
}

#[test]
fn the_log_goes_through_a_verified_tls_connection_and_untrusting_clients_get_nothing() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (ca_pem, tls) = certificates();
    let ca = dir.path().join("ca.pem");
    std::fs::write(&ca, ca_pem).unwrap();

    let (front, back) = (free_local_addr(), free_local_addr());
    let listener = rt.block_on(tokio::net::TcpListener::bind(front)).unwrap();
    rt.spawn(tls_front(listener, tls, back));
    let tansu = find_tansu().expect("tansu (scripts/setup.sh installs it)");
    let _broker =
        LocalBroker::start_advertising(&tansu, &dir.path().join("broker"), back, front).unwrap();

    let trusting = dir.path().join("trusting.properties");
    std::fs::write(
        &trusting,
        format!("security.protocol=SSL\nssl.ca.location={}\n", ca.display()),
    )
    .unwrap();

    // The CLI, configured by the file alone.
    let out = forgelog(front, Some(&trusting), &["topics", "create"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // The spool-backed producer, with the same properties.
    let run = unique_run_id("tls");
    let config = StreamConfig {
        brokers: front.to_string(),
        extra: parse_properties(&std::fs::read_to_string(&trusting).unwrap()).unwrap(),
        claims: forgelog_stream::claims::ClaimsConfig::from_env(),
    };
    let events: Vec<Event> = (0..20)
        .map(|i| call_finished(&run, "s1", i, 8, 4).into())
        .collect();
    rt.block_on(produce(&config, &events));

    // Read back through the CLI over TLS: every event, in order.
    let out = forgelog(
        front,
        Some(&trusting),
        &["tail", "forgelog.calls", "--from-beginning", "--run", &run],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let indices: Vec<i64> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["call_index"]
                .as_i64()
                .unwrap()
        })
        .collect();
    assert_eq!(indices, (0..20).collect::<Vec<_>>());

    // A client that does not trust the CA, and one that speaks plaintext, are refused.
    let untrusting = dir.path().join("untrusting.properties");
    std::fs::write(&untrusting, "security.protocol=SSL\n").unwrap();
    for (what, properties) in [
        ("untrusting", Some(untrusting.as_path())),
        ("plaintext", None),
    ] {
        let out = forgelog(front, properties, &["topics", "list"]);
        assert!(
            !out.status.success(),
            "a {what} client listed the topics: {}",
            String::from_utf8_lossy(&out.stdout)
        );
    }
}
