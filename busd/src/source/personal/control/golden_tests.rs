//! The idempotency key against golden values computed by real Go: the
//! reference CLI's own `BuildFilter`, `IdempotencyKey`, `CanonicalJSON`
//! and `Identity.Key`, run by `tests/golden/idempotency/main.go`
//! (`scripts/goldens.sh` regenerates `goldens.json`). Floats, large
//! integers, `<` `>` `&`, unicode and control characters, nested objects,
//! field aliases, the `and` wrapper, filters that are not objects, every
//! rule and identity form.

use std::time::Duration;

use proto::v1::UpstreamSpec;
use serde::Deserialize;

use super::request::{go_json, CreateRequest, Identity};

#[derive(Deserialize)]
struct Golden {
    name: String,
    corp_id: String,
    user_id: String,
    local_subject: String,
    client_id: String,
    source_id: String,
    event_key: String,
    rule_type: String,
    user: String,
    open_dingtalk_id: String,
    group: String,
    filter_json: String,
    query: String,
    rule_canonical: String,
    filter_canonical: String,
    key: String,
}

const GOLDENS: &str = include_str!("../../../../../tests/golden/idempotency/goldens.json");

#[test]
fn idempotency_keys_match_real_go() {
    let goldens: Vec<Golden> = serde_json::from_str(GOLDENS).expect("goldens.json");
    assert!(goldens.len() >= 10);
    let mut wrong = vec![];
    for g in &goldens {
        let spec = UpstreamSpec {
            rule_type: g.rule_type.clone(),
            user: g.user.clone(),
            open_dingtalk_id: g.open_dingtalk_id.clone(),
            group: g.group.clone(),
            query: vec![g.query.clone()],
            filter_json: g.filter_json.clone(),
            name: String::new(),
        };
        let req = match CreateRequest::from_spec(
            std::slice::from_ref(&g.event_key),
            &spec,
            Duration::from_secs(60),
        ) {
            Ok(r) => r,
            Err(e) => {
                wrong.push(format!("{}: refused: {e}", g.name));
                continue;
            }
        };
        let identity = Identity {
            corp_id: g.corp_id.clone(),
            user_id: g.user_id.clone(),
            client_id: g.client_id.clone(),
            source_id: g.source_id.clone(),
            local_subject: g.local_subject.clone(),
        };
        let got = (
            go_json(&req.rule_param),
            req.filter.as_ref().map(go_json).unwrap_or_default(),
            req.idempotency_key(&identity),
        );
        let want = (
            g.rule_canonical.clone(),
            g.filter_canonical.clone(),
            g.key.clone(),
        );
        if got != want {
            wrong.push(format!("{}:\n  got  {got:?}\n  want {want:?}", g.name));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}
