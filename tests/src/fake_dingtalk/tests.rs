//! The fake behaves like the gateway (its own conformance checks).

use std::{net::SocketAddr, time::Duration};

use serde_json::{json, Value};
use tokio::net::TcpStream;

use super::*;

#[test]
fn query_and_uuid() {
    assert_eq!(
        parse_query("a=1&ticket=x%2By+z&e"),
        vec![
            ("a".into(), "1".into()),
            ("ticket".into(), "x+y z".into()),
            ("e".into(), "".into())
        ]
    );
    assert_eq!(percent_decode("100%"), "100%");
    let u = new_uuid();
    assert_eq!(u.len(), 36, "{u}");
    assert!(u.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-'), "{u}");
    assert_ne!(new_uuid(), new_uuid());
}

/// A blocking HTTP/1.1 POST (std only), for the server-side checks.
fn post(addr: SocketAddr, path: &str, body: &str) -> (u16, Value) {
    request(addr, "POST", path, &[], body)
}

/// A blocking HTTP/1.1 request with extra headers.
fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, Value) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    let extra: String = headers
        .iter()
        .filter(|(k, _)| *k != "accept")
        .map(|(k, v)| format!("{k}: {v}\r\n"))
        .collect();
    // `Accept: application/json` unless the test sets `accept` (to "" for
    // none).
    let accept = match headers.iter().find(|(k, _)| *k == "accept") {
        Some((_, "")) => String::new(),
        Some((_, v)) => format!("Accept: {v}\r\n"),
        None => "Accept: application/json\r\n".to_owned(),
    };
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n{accept}{extra}Content-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    let status = text[9..12].parse().unwrap();
    let json = text.split("\r\n\r\n").nth(1).unwrap_or("");
    (status, serde_json::from_str(json).unwrap_or(Value::Null))
}

/// A WebSocket handshake; `Err(status)` when refused.
fn dial(url: &str) -> Result<(), u16> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let hostport = url
            .trim_start_matches("ws://")
            .split('/')
            .next()
            .unwrap()
            .to_owned();
        let tcp = TcpStream::connect(hostport).await.unwrap();
        match tokio_tungstenite::client_async(url, tcp).await {
            Ok(_) => Ok(()),
            Err(tokio_tungstenite::tungstenite::Error::Http(r)) => Err(r.status().as_u16()),
            Err(e) => panic!("{e}"),
        }
    })
}

/// OPEN-1, OPEN-2, TKT-1, TKT-2: the fake behaves like the gateway.
#[test]
fn open_and_ticket_rules() {
    let fake = FakeDingTalk::start_with(Options {
        ticket_ttl: Duration::from_millis(300),
        ..Options::default()
    });
    let ok_body = json!({
        "clientId": fake.client_id(), "clientSecret": fake.client_secret(),
        "subscriptions": [{"type": "EVENT", "topic": "*"}, {"type": "SYSTEM", "topic": "ping"}],
        "ua": "", "extras": null, "unknown": 1,
    })
    .to_string();
    let (st, v) = post(fake.addr(), OPEN_PATH, &ok_body);
    assert_eq!(st, 200, "{v}");
    let endpoint = v["endpoint"].as_str().unwrap().to_owned();
    let ticket = v["ticket"].as_str().unwrap().to_owned();
    assert_eq!(endpoint, format!("ws://{}/connect", fake.addr()));
    assert_eq!(ticket.len(), 36);
    let url = format!("{endpoint}?ticket={ticket}");
    assert_eq!(dial(&url), Ok(()));
    assert_eq!(dial(&url), Err(401), "TKT-1: a ticket is single-use");
    assert_eq!(dial(&format!("{endpoint}?ticket=nope")), Err(401));

    let (_, v) = post(fake.addr(), OPEN_PATH, &ok_body);
    std::thread::sleep(Duration::from_millis(400));
    let late = format!("{endpoint}?ticket={}", v["ticket"].as_str().unwrap());
    assert_eq!(dial(&late), Err(401), "TKT-2: an expired ticket is refused");

    let wrong = ok_body.replace(&fake.client_secret(), "wrong");
    let (st, v) = post(fake.addr(), OPEN_PATH, &wrong);
    assert_eq!((st, v["code"].as_str()), (401, Some("authFailed")), "{v}");
    let (st, v) = post(fake.addr(), OPEN_PATH, r#"{"clientId":"x"}"#);
    assert_eq!((st, v["code"].as_str()), (400, Some("systemError")), "{v}");
    let (st, _) = request(fake.addr(), "POST", OPEN_PATH, &[("accept", "")], &ok_body);
    assert_eq!(st, 406, "the open call needs Accept: application/json");
    assert_eq!(fake.open_count(), 5);
    assert_eq!(fake.with_state(|s| s.conns.len()), 1);
}

/// The personal endpoints refuse an empty client id, like the service
/// (`CLIENT_ID_REQUIRED`), accept only the reference's idempotency key,
/// and list `gmtCreate` as a string.
#[test]
fn personal_endpoints_are_strict() {
    let fake = FakeDingTalk::start();
    let token = fake.user_token();
    let bearer = format!("Bearer {token}");
    let auth = [
        ("x-user-access-token", token.as_str()),
        ("authorization", bearer.as_str()),
    ];
    let ticket_body = r#"{"sourceId":"open","mode":"normal"}"#;
    let (st, v) = request(
        fake.addr(),
        "POST",
        personal::TICKET_PATH,
        &auth,
        ticket_body,
    );
    assert_eq!(
        (st, v["errorCode"].as_str()),
        (400, Some("CLIENT_ID_REQUIRED")),
        "{v}"
    );
    let with_id = [
        auth[0],
        auth[1],
        ("x-dws-client-id", "cid"),
        ("x-dws-source-id", "open"),
    ];
    // The reference's other ticket headers are required too.
    for (drop, want) in [
        ("authorization", 401),
        ("x-dws-source-id", 400),
        ("accept", 406),
    ] {
        let mut h: Vec<(&str, &str)> = with_id
            .iter()
            .copied()
            .filter(|(k, _)| *k != drop)
            .collect();
        if drop == "accept" {
            h.push(("accept", ""));
        }
        let (st, v) = request(fake.addr(), "POST", personal::TICKET_PATH, &h, ticket_body);
        assert_eq!(st, want, "without {drop}: {v}");
    }
    let (st, _) = request(
        fake.addr(),
        "POST",
        personal::TICKET_PATH,
        &with_id,
        ticket_body,
    );
    assert_eq!(st, 200);
    let (st, v) = request(
        fake.addr(),
        "POST",
        personal::TICKET_PATH,
        &with_id,
        r#"{"sourceId":"open","mode":"other"}"#,
    );
    assert_eq!(st, 400, "{v}");

    let create = |client: &str, key: &str| {
        json!({"clientId": client, "sourceId": "open", "eventKey": "user_im_message_receive_at",
               "filterRule": "{}", "deliveryPref": "realtime",
               "ext": {"ruleType": "at", "idempotencyKey": key}})
        .to_string()
    };
    let right = personal_key(&token, "cid");
    let (st, v) = request(
        fake.addr(),
        "POST",
        personal::CREATE_PATH,
        &with_id,
        &create("", &right),
    );
    assert_eq!(
        (st, v["error"]["code"].as_str()),
        (400, Some("CLIENT_ID_REQUIRED")),
        "{v}"
    );
    let (st, v) = request(
        fake.addr(),
        "POST",
        personal::CREATE_PATH,
        &with_id,
        &create("cid", "dws-cli-0000000000000000"),
    );
    assert_eq!(
        (st, v["error"]["code"].as_str()),
        (400, Some("INVALID_PARAM")),
        "{v}"
    );
    let (st, v) = request(
        fake.addr(),
        "POST",
        personal::CREATE_PATH,
        &with_id,
        &create("cid", &right),
    );
    assert_eq!(st, 200, "{v}");
    let list = format!(
        "{}?clientId=&sourceId=open&pageSize=100&pageNo=1",
        personal::LIST_PATH
    );
    let (st, _) = request(fake.addr(), "GET", &list, &with_id, "");
    assert_eq!(st, 400);
    let list = list.replace("clientId=", "clientId=cid");
    let (st, v) = request(fake.addr(), "GET", &list, &with_id, "");
    assert_eq!(st, 200, "{v}");
    assert!(v["result"]["items"][0]["gmtCreate"].is_string(), "{v}");
}

/// The reference's key for `at` with no filter, identity = the access
/// token's local subject (computed here from the definition).
fn personal_key(token: &str, client: &str) -> String {
    use personal::reference as r;
    let id = r::local_subject_key("access", token, client, "open");
    let input = [id.as_str(), "user_im_message_receive_at", "at", "{}", ""].join("\0");
    format!("dws-cli-{}", r::hex(&r::sha256(input.as_bytes())[..8]))
}

/// A 4xx ack is a diagnostic: the EVENT is not sent again; a 5xx ack is
/// retried after the ack timeout.
#[test]
fn diagnostic_acks_are_not_redelivered() {
    use futures_util::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::Message;

    let fake = FakeDingTalk::start_with(Options {
        ack_timeout: Some(Duration::from_millis(300)),
        ..Options::default()
    });
    let body = json!({"clientId": fake.client_id(), "clientSecret": fake.client_secret(),
                      "subscriptions": [{"type": "EVENT", "topic": "*"}]})
    .to_string();
    let (_, v) = post(fake.addr(), OPEN_PATH, &body);
    let url = format!(
        "{}?ticket={}",
        v["endpoint"].as_str().unwrap(),
        v["ticket"].as_str().unwrap()
    );
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let tcp = TcpStream::connect(fake.addr()).await.unwrap();
        let (mut ws, _) = tokio_tungstenite::client_async(url.as_str(), tcp).await.unwrap();
        let next_event = async |ws: &mut tokio_tungstenite::WebSocketStream<TcpStream>| loop {
            match tokio::time::timeout(Duration::from_millis(1500), ws.next()).await {
                Ok(Some(Ok(Message::Text(t)))) => {
                    let v: Value = serde_json::from_str(t.as_str()).unwrap();
                    if v["type"] == "EVENT" {
                        return Some(v["headers"]["messageId"].as_str().unwrap().to_owned());
                    }
                }
                Ok(Some(Ok(_))) => {}
                _ => return None,
            }
        };
        let ack = |mid: &str, code: u16| {
            Message::text(
                json!({"code": code, "headers": {"messageId": mid, "contentType": "application/json"},
                       "message": "", "data": ""})
                .to_string(),
            )
        };
        let diag = fake.push_event(&Event::new("e-diag", "a_b", "{}"));
        assert_eq!(next_event(&mut ws).await.as_deref(), Some(diag.as_str()));
        ws.send(ack(&diag, 400)).await.unwrap();
        let retry = fake.push_event(&Event::new("e-retry", "a_b", "{}"));
        assert_eq!(next_event(&mut ws).await.as_deref(), Some(retry.as_str()));
        ws.send(ack(&retry, 500)).await.unwrap();
        // Only the 500 comes again.
        assert_eq!(next_event(&mut ws).await.as_deref(), Some(retry.as_str()));
        // A 200 without the SDKs' shape (contentType, data a string) does
        // not settle it: it comes again.
        ws.send(Message::text(
            json!({"code": 200, "headers": {"messageId": retry}, "message": "OK", "data": {"status": "SUCCESS"}})
                .to_string(),
        ))
        .await
        .unwrap();
        assert_eq!(next_event(&mut ws).await.as_deref(), Some(retry.as_str()));
        ws.send(ack(&retry, 200)).await.unwrap();
        assert_eq!(next_event(&mut ws).await, None, "nothing more");
    });
    fake.with_state(|s| {
        let o: Vec<(String, u32, bool, Option<i64>)> = s
            .outbox
            .iter()
            .map(|o| (o.event_id.clone(), o.sends, o.acked, o.diagnosed))
            .collect();
        assert_eq!(
            o,
            [
                ("e-diag".to_owned(), 1, false, Some(400)),
                ("e-retry".to_owned(), 3, true, None)
            ]
        );
        assert_eq!(s.unacked(), 0);
    });
}
