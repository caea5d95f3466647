//! What the fake recomputes the reference CLI's way, independently of the
//! bus: SHA-256, Go's `json.Marshal` of a decoded value, and the
//! idempotency key of a create (`internal/event/personal/registry.go`
//! `IdempotencyKey`, `internal/event/personal/client.go` `Identity.Key`).

use serde_json::Value;

/// SHA-256 (FIPS 180-4), for the fake's checks only.
pub fn sha256(data: &[u8]) -> [u8; 32] {
    const K: [u32; 64] = [
        0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4,
        0xab1c5ed5, 0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe,
        0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f,
        0x4a7484aa, 0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7,
        0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc,
        0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b,
        0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116,
        0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
        0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7,
        0xc67178f2,
    ];
    let mut h: [u32; 8] = [
        0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab,
        0x5be0cd19,
    ];
    let mut msg = data.to_vec();
    let bits = (data.len() as u64).wrapping_mul(8);
    msg.push(0x80);
    while msg.len() % 64 != 56 {
        msg.push(0);
    }
    msg.extend_from_slice(&bits.to_be_bytes());
    for block in msg.chunks(64) {
        let mut w = [0u32; 64];
        for (i, word) in block.chunks(4).enumerate() {
            w[i] = u32::from_be_bytes([word[0], word[1], word[2], word[3]]);
        }
        for i in 16..64 {
            let s0 = w[i - 15].rotate_right(7) ^ w[i - 15].rotate_right(18) ^ (w[i - 15] >> 3);
            let s1 = w[i - 2].rotate_right(17) ^ w[i - 2].rotate_right(19) ^ (w[i - 2] >> 10);
            w[i] = w[i - 16]
                .wrapping_add(s0)
                .wrapping_add(w[i - 7])
                .wrapping_add(s1);
        }
        let [mut a, mut b, mut c, mut d, mut e, mut f, mut g, mut hh] = h;
        for i in 0..64 {
            let s1 = e.rotate_right(6) ^ e.rotate_right(11) ^ e.rotate_right(25);
            let ch = (e & f) ^ (!e & g);
            let t1 = hh
                .wrapping_add(s1)
                .wrapping_add(ch)
                .wrapping_add(K[i])
                .wrapping_add(w[i]);
            let s0 = a.rotate_right(2) ^ a.rotate_right(13) ^ a.rotate_right(22);
            let maj = (a & b) ^ (a & c) ^ (b & c);
            let t2 = s0.wrapping_add(maj);
            hh = g;
            g = f;
            f = e;
            e = d.wrapping_add(t1);
            d = c;
            c = b;
            b = a;
            a = t1.wrapping_add(t2);
        }
        for (x, y) in h.iter_mut().zip([a, b, c, d, e, f, g, hh]) {
            *x = x.wrapping_add(y);
        }
    }
    let mut out = [0u8; 32];
    for (i, x) in h.iter().enumerate() {
        out[i * 4..i * 4 + 4].copy_from_slice(&x.to_be_bytes());
    }
    out
}

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Go's `json.Marshal` of a value decoded into `any`: sorted keys, HTML
/// characters and U+2028/9 escaped, numbers as float64.
pub fn go_marshal(v: &Value) -> String {
    match v {
        Value::Null => "null".into(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => {
            let f = n.as_f64().unwrap_or(0.0);
            if f != 0.0 && !(1e-6..1e21).contains(&f.abs()) {
                let e = format!("{f:e}");
                match e.split_once('e') {
                    Some((m, x)) if !x.starts_with('-') => format!("{m}e+{x}"),
                    _ => e,
                }
            } else {
                format!("{f}")
            }
        }
        Value::String(s) => {
            let mut out = String::from("\"");
            for c in s.chars() {
                match c {
                    '"' => out.push_str("\\\""),
                    '\\' => out.push_str("\\\\"),
                    '\n' => out.push_str("\\n"),
                    '\r' => out.push_str("\\r"),
                    '\t' => out.push_str("\\t"),
                    '\u{8}' => out.push_str("\\b"),
                    '\u{c}' => out.push_str("\\f"),
                    '\u{2028}' | '\u{2029}' => out.push_str(&format!("\\u{:04x}", c as u32)),
                    c if (c as u32) < 0x20 || matches!(c, '<' | '>' | '&') => {
                        out.push_str(&format!("\\u{:04x}", c as u32))
                    }
                    c => out.push(c),
                }
            }
            out.push('"');
            out
        }
        Value::Array(a) => format!(
            "[{}]",
            a.iter().map(go_marshal).collect::<Vec<_>>().join(",")
        ),
        Value::Object(o) => {
            let mut keys: Vec<&String> = o.keys().collect();
            keys.sort();
            let parts: Vec<String> = keys
                .into_iter()
                .map(|k| {
                    format!(
                        "{}:{}",
                        go_marshal(&Value::String(k.clone())),
                        go_marshal(&o[k])
                    )
                })
                .collect();
            format!("{{{}}}", parts.join(","))
        }
    }
}

/// The reference's idempotency key for a create body, given the caller's
/// identity key (`corp_user\0…` or `local_subject\0…`). `None` when the
/// body is not a create body.
pub fn idempotency_key(identity_key: &str, body: &Value) -> Option<String> {
    let event_key = body.get("eventKey")?.as_str()?;
    let rule_type = body.get("ext")?.get("ruleType")?.as_str()?;
    let rule: Value = serde_json::from_str(body.get("filterRule")?.as_str()?).ok()?;
    let filter = body
        .get("ext")
        .and_then(|e| e.get("filter"))
        .map(go_marshal)
        .unwrap_or_default();
    let input = [
        identity_key.to_owned(),
        event_key.to_owned(),
        rule_type.to_owned(),
        go_marshal(&rule),
        filter,
    ]
    .join("\0");
    Some(format!("dws-cli-{}", hex(&sha256(input.as_bytes())[..8])))
}

/// `corp_user\0corp\0user\0client\0source`.
pub fn corp_user_key(corp: &str, user: &str, client: &str, source: &str) -> String {
    ["corp_user", corp, user, client, source].join("\0")
}

/// `local_subject\0<kind>:<sha256 hex of token>\0client\0source`.
pub fn local_subject_key(kind: &str, token: &str, client: &str, source: &str) -> String {
    let subject = format!("{kind}:{}", hex(&sha256(token.trim().as_bytes())));
    ["local_subject", subject.as_str(), client, source].join("\0")
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn sha256_vectors() {
        assert_eq!(
            hex(&sha256(b"")),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        assert_eq!(
            hex(&sha256(b"abc")),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        let long = b"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
        assert_eq!(
            hex(&sha256(long)),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"
        );
    }

    #[test]
    fn marshal_and_key() {
        assert_eq!(
            go_marshal(&json!({"b": 1.0, "a": ["<x>", 2.5e-10]})),
            r#"{"a":["\u003cx\u003e",2.5e-10],"b":1}"#
        );
        let body = json!({"eventKey": "user_im_message_receive_at", "filterRule": "{}",
                          "ext": {"ruleType": "at"}});
        let key = local_subject_key("access", "tok", "cid", "open");
        // The same vector as the bus's unit test, computed with Python.
        assert_eq!(
            idempotency_key(&key, &body).unwrap(),
            "dws-cli-88b460eeefa9511c"
        );
    }

    /// The fake's Go JSON against real Go (`tests/golden/idempotency`,
    /// `scripts/goldens.sh`): every golden filter without field aliases
    /// or content terms, and every key.
    #[test]
    fn marshal_and_keys_match_real_go() {
        let goldens: Vec<Value> =
            serde_json::from_str(include_str!("../../../golden/idempotency/goldens.json"))
                .expect("goldens.json");
        let s = |g: &Value, k: &str| g[k].as_str().unwrap_or("").to_owned();
        for g in &goldens {
            let filter = s(g, "filter_json");
            let aliased = ["\"content\"", "\"sender", "\"conversation_id\""]
                .iter()
                .any(|a| filter.contains(a));
            if !filter.is_empty() && s(g, "query").is_empty() && !aliased {
                let v: Value = serde_json::from_str(&filter).expect("filter");
                assert_eq!(go_marshal(&v), s(g, "filter_canonical"), "{}", s(g, "name"));
            }
            let identity = if !s(g, "corp_id").is_empty() && !s(g, "user_id").is_empty() {
                corp_user_key(
                    &s(g, "corp_id"),
                    &s(g, "user_id"),
                    &s(g, "client_id"),
                    &s(g, "source_id"),
                )
            } else if !s(g, "local_subject").is_empty() {
                [
                    "local_subject",
                    &s(g, "local_subject"),
                    &s(g, "client_id"),
                    &s(g, "source_id"),
                ]
                .join("\0")
            } else {
                continue;
            };
            let rule = s(g, "rule_canonical");
            let mut body = serde_json::json!({"eventKey": s(g, "event_key"), "filterRule": rule,
                "ext": {"ruleType": s(g, "rule_type")}});
            let canon = s(g, "filter_canonical");
            if !canon.is_empty() {
                body["ext"]["filter"] = serde_json::from_str(&canon).expect("canonical filter");
            }
            assert_eq!(
                idempotency_key(&identity, &body).as_deref(),
                Some(s(g, "key").as_str()),
                "{}",
                s(g, "name")
            );
        }
    }
}
