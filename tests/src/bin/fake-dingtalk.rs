//! `fake-dingtalk`: the loopback fake DingTalk Stream gateway as a process,
//! for scripts and the demo. Prints its base URL (the `open_api` value) as
//! the first stdout line and serves until killed.
//!
//! ```text
//! fake-dingtalk [--port N] [--client-id ID] [--quiet]
//!               [--push-count N] [--push-every-ms MS] [--event-type T]
//!               [--disconnect-close-after-ms MS] [--system-ping-every-ms MS]
//! ```
//!
//! The client secret it accepts comes from the environment
//! (`FAKE_DINGTALK_CLIENT_SECRET`, default `fake-client-secret`), never from
//! argv. `--push-count N` pushes N demo EVENTs, one every `--push-every-ms`
//! (default 1000), starting once a client is connected. More events, a
//! server `disconnect` or a dropped connection can be requested at any time
//! over HTTP: `POST <base>/_fake/push` with `{"eventType":"…","data":{…}}`,
//! `POST <base>/_fake/disconnect`, `POST <base>/_fake/drop`.

use std::{io::Write, time::Duration};

use dws_tests::fake_dingtalk::{Event, FakeDingTalk, Options};

fn usage(msg: &str) -> ! {
    eprintln!("fake-dingtalk: {msg}");
    eprintln!(
        "usage: fake-dingtalk [--port N] [--client-id ID] [--quiet] [--push-count N] [--push-every-ms MS] \
         [--event-type T] [--disconnect-close-after-ms MS] [--system-ping-every-ms MS]"
    );
    std::process::exit(2);
}

fn main() {
    let mut opts = Options {
        verbose: true,
        ..Options::default()
    };
    if let Some(s) = std::env::var("FAKE_DINGTALK_CLIENT_SECRET")
        .ok()
        .filter(|s| !s.is_empty())
    {
        opts.client_secret = s;
    }
    let mut push_count = 0u64;
    let mut push_every = Duration::from_secs(1);
    let mut event_type = "demo_event".to_owned();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = |name: &str| {
            args.next()
                .unwrap_or_else(|| usage(&format!("{name} needs a value")))
        };
        let mut num = |name: &str| -> u64 {
            let v = value(name);
            v.parse()
                .unwrap_or_else(|_| usage(&format!("{name}: {v:?} is not a number")))
        };
        match a.as_str() {
            "--port" => {
                opts.port =
                    u16::try_from(num("--port")).unwrap_or_else(|_| usage("--port: out of range"))
            }
            "--client-id" => opts.client_id = value("--client-id"),
            "--quiet" => opts.verbose = false,
            "--push-count" => push_count = num("--push-count"),
            "--push-every-ms" => push_every = Duration::from_millis(num("--push-every-ms")),
            "--event-type" => event_type = value("--event-type"),
            "--disconnect-close-after-ms" => {
                opts.disconnect_close_after =
                    Duration::from_millis(num("--disconnect-close-after-ms"))
            }
            "--system-ping-every-ms" => {
                opts.system_ping_every = Some(Duration::from_millis(num("--system-ping-every-ms")))
            }
            "-h" | "--help" => {
                println!("fake-dingtalk: a loopback fake of the DingTalk Stream app gateway; see the source for options");
                return;
            }
            other => usage(&format!("unknown argument {other:?}")),
        }
    }
    let fake = FakeDingTalk::start_with(opts);
    {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{}", fake.base_url());
        let _ = out.flush();
    }
    if push_count > 0 {
        fake.wait_connected(Duration::from_secs(24 * 3600));
        for i in 1..=push_count {
            let id = format!("demo-{i:04}");
            fake.push_event(&Event::new(
                id,
                event_type.clone(),
                format!("{{\"n\":{i}}}"),
            ));
            std::thread::sleep(push_every);
        }
    }
    loop {
        std::thread::park();
    }
}
