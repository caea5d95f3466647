//! The DingTalk sources over TLS: the fake behind a TLS front (a throwaway
//! CA made here with `rcgen`, a server certificate for `localhost`), the
//! bus trusting that CA through its test knob `DWS_DINGTALK_EXTRA_CA_FILE`.
//! The app stream (`https://` open call, `wss://` dial) and the personal
//! stream (`https://` ticket and control plane, `wss://` dial) deliver
//! events; the bus sends SNI `localhost`; a certificate from another CA is
//! refused and the source is lost with a reason that says so.

use std::{
    net::SocketAddr,
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::Duration,
};

use crate::test_ca::Ca;
use dws_tests::{
    fake_dingtalk::{personal::PersonalEvent, personal_profile_at, Event, FakeDingTalk},
    Child, TestEnv, EXIT_TIMEOUT,
};
use rustls::pki_types::{pem::PemObject, CertificateDer, PrivateKeyDer};
use serde_json::{json, Value};

const T: Duration = Duration::from_secs(30);

fn new_ca(name: &str) -> Ca {
    Ca::new(name)
}

/// A TLS server in front of the fake: every connection's TLS is ended here
/// and its bytes forwarded to the fake's plain port. Records the SNI names.
struct TlsFront {
    addr: SocketAddr,
    sni: Arc<Mutex<Vec<String>>>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl TlsFront {
    /// A front for `backend` with a `localhost` certificate signed by `ca`.
    fn start(ca: &Ca, backend: SocketAddr) -> TlsFront {
        let (cert, key) = ca.server_cert(&["localhost"], "fake dingtalk");
        let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert.as_bytes())
            .collect::<Result<_, _>>()
            .expect("cert PEM");
        let key = PrivateKeyDer::from_pem_slice(key.as_bytes()).expect("key PEM");
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("protocol versions")
            .with_no_client_auth()
            .with_single_cert(certs, key)
            .expect("server config");
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.set_nonblocking(true).expect("nonblocking");
        let addr = listener.local_addr().expect("addr");
        let sni = Arc::new(Mutex::new(vec![]));
        let seen = sni.clone();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).expect("listener");
                let accept = async {
                    loop {
                        let Ok((tcp, _)) = listener.accept().await else {
                            continue;
                        };
                        let (acceptor, seen) = (acceptor.clone(), seen.clone());
                        tokio::spawn(async move {
                            let Ok(mut tls) = acceptor.accept(tcp).await else {
                                return;
                            };
                            let name = tls.get_ref().1.server_name().unwrap_or("").to_owned();
                            seen.lock().unwrap_or_else(|p| p.into_inner()).push(name);
                            let Ok(mut plain) = tokio::net::TcpStream::connect(backend).await
                            else {
                                return;
                            };
                            let _ = tokio::io::copy_bidirectional(&mut tls, &mut plain).await;
                        });
                    }
                };
                tokio::select! {
                    _ = accept => {}
                    _ = stopped => {}
                }
            });
        });
        TlsFront {
            addr,
            sni,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    fn https(&self) -> String {
        format!("https://localhost:{}", self.addr.port())
    }

    fn wss(&self) -> String {
        format!("wss://localhost:{}", self.addr.port())
    }

    fn sni(&self) -> Vec<String> {
        self.sni.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

impl Drop for TlsFront {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn private(dir: &Path, name: &str, body: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, body).expect("write");
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    p
}

/// A bus trusting `ca_pem` (a file in the returned dir, to keep while the
/// bus runs) whose default profile is `section`; its backoff starts at
/// `backoff_ms`.
fn env_with_ca(ca_pem: &str, section: &str, backoff_ms: u64) -> (TestEnv, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("tempdir");
    let ca = private(dir.path(), "ca.pem", ca_pem);
    let env = TestEnv::with_env(&[
        ("DWS_DINGTALK_BACKOFF_MIN_MS", backoff_ms.to_string()),
        ("DWS_DINGTALK_BACKOFF_MAX_MS", (backoff_ms * 2).to_string()),
        ("DWS_DINGTALK_EXTRA_CA_FILE", ca.display().to_string()),
    ]);
    env.write_default_profile(section);
    (env, dir)
}

fn consumer(env: &TestEnv, args: &[&str]) -> Child {
    let mut argv = vec!["event", "consume"];
    argv.extend_from_slice(args);
    let mut c = env.dws(argv).stdin_hold().spawn();
    c.wait_ready();
    c
}

fn first_event(c: &mut Child) -> Value {
    let lines = c.wait_stdout_lines(1, T);
    serde_json::from_str(&lines[0]).expect("an NDJSON line")
}

fn finish(c: Child, n: u64) {
    c.signal(dws_tests::Sig::SIGTERM);
    c.wait_exit(EXIT_TIMEOUT).assert_clean_exit("signal", n);
}

#[test]
fn the_app_stream_over_https_and_wss_with_sni_and_a_checked_certificate() {
    let ca = new_ca("dws test CA");
    let fake = FakeDingTalk::start();
    let front = TlsFront::start(&ca, fake.addr());
    fake.set_ws_base(&front.wss());
    let (env, _ca_dir) = env_with_ca(&ca.pem, &fake.app_profile_at(&front.https(), ""), 100);
    let mut c = consumer(&env, &["*", "--from", "earliest"]);
    let conn = fake.wait_connected(T);
    let mid = fake.push_event(&Event::new(
        "tls-1",
        "user_add_org",
        json!({"userId": ["u"]}).to_string(),
    ));
    let ack = fake.wait_ack(&mid, T);
    assert_eq!((ack.code, ack.conn), (200, conn), "{ack:?}");
    assert_eq!(first_event(&mut c)["event_id"], "tls-1");
    let sni = front.sni();
    assert!(
        sni.len() >= 2 && sni.iter().all(|n| n == "localhost"),
        "the open call and the dial both over TLS, SNI localhost: {sni:?}"
    );
    finish(c, 1);
}

#[test]
fn the_personal_stream_over_https_and_wss() {
    let ca = new_ca("dws test CA");
    let fake = FakeDingTalk::start();
    let front = TlsFront::start(&ca, fake.addr());
    fake.set_ws_base(&front.wss());
    let dir = tempfile::tempdir().expect("tempdir");
    let token = private(dir.path(), "token", &fake.user_token());
    let (env, _ca_dir) = env_with_ca(
        &ca.pem,
        &personal_profile_at(
            &front.https(),
            &token.display().to_string(),
            "client_id = \"dws-test-client\"\n",
        ),
        100,
    );
    let key = "user_im_message_receive_at";
    let mut c = consumer(&env, &[key]);
    fake.wait_connected(T);
    let up = fake.creates()[0]
        .issued
        .clone()
        .expect("an upstream subscription");
    fake.push_personal(&PersonalEvent::new(
        "tls-p1",
        key,
        &up,
        json!({"body": {"content": "hi"}}),
    ));
    assert_eq!(first_event(&mut c)["event_id"], "tls-p1");
    let sni = front.sni();
    assert!(
        sni.len() >= 3 && sni.iter().all(|n| n == "localhost"),
        "create, ticket and dial over TLS: {sni:?}"
    );
    finish(c, 1);
}

#[test]
fn a_certificate_from_another_ca_is_refused() {
    let ca = new_ca("dws test CA");
    let other = new_ca("someone else");
    let fake = FakeDingTalk::start();
    let front = TlsFront::start(&ca, fake.addr());
    // The consumer attaches during the first backoff.
    let (env, _ca_dir) = env_with_ca(
        &other.pem,
        &fake.app_profile_at(&front.https(), "max_attempts = 2\n"),
        1500,
    );
    let c = consumer(&env, &["*"]);
    let out = c.wait_exit(T);
    let lost = out.assert_source_lost();
    assert!(
        lost.to_lowercase().contains("certificate") || lost.contains("UnknownIssuer"),
        "{lost}\n{out}"
    );
    assert_eq!(fake.open_count(), 0, "nothing reached the fake");
}
