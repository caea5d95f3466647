//! Unit tests of `where_expr`: refusals with their column, matching, fuel.

use super::*;

fn prog(exprs: &[&str]) -> Program {
    Program::compile(&exprs.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap()
}

fn event(data: &str) -> Val {
    let mut e = v1::Event {
        seq: 7,
        event_id: "ev-1".into(),
        event_type: "im.message".into(),
        data: data.into(),
        received_at_unix_ms: 5,
        ..Default::default()
    };
    e.headers.insert("x-source".into(), "fake".into());
    event_value(&e)
}

#[test]
fn matching_sees_the_line_with_data_parsed() {
    let ev = event(r#"{"conversationId":"c1","atUsers":[{"dingtalkId":"me"}]}"#);
    assert_eq!(
        prog(&[r#".data.conversationId == "c1""#]).matches(&ev),
        Ok(true)
    );
    assert_eq!(
        prog(&[r#".data.conversationId == "c2""#]).matches(&ev),
        Ok(false)
    );
    assert_eq!(
        prog(&[r#".event_type | startswith("im.")"#]).matches(&ev),
        Ok(true)
    );
    assert_eq!(
        prog(&[r#".event_id == "ev-1" and .seq == 7"#]).matches(&ev),
        Ok(true)
    );
    assert_eq!(
        prog(&[r#".headers["x-source"] == "fake""#]).matches(&ev),
        Ok(true)
    );
    assert_eq!(
        prog(&[r#"any(.data.atUsers[]; .dingtalkId == "me")"#]).matches(&ev),
        Ok(true)
    );
    assert_eq!(
        prog(&["has(\"subscribe_id\") or has(\"redelivered\")"]).matches(&ev),
        Ok(false)
    );
    // ANDed; no output is no match.
    assert_eq!(prog(&["true", "false"]).matches(&ev), Ok(false));
    assert_eq!(prog(&["true", ".seq"]).matches(&ev), Ok(true));
    assert_eq!(prog(&["empty"]).matches(&ev), Ok(false));
    // Data that is not JSON stays a string.
    assert_eq!(
        prog(&[r#".data == "plain text""#]).matches(&event("plain text")),
        Ok(true)
    );
    assert_eq!(
        prog(&[r#".data.text.content | test("urgent")"#])
            .matches(&event(r#"{"text":{"content":"an urgent one"}}"#)),
        Ok(true)
    );
}

/// `event_value` is the NDJSON line (`ndjson::EventLine`) without the
/// per-delivery fields, `data` parsed when it is JSON.
#[test]
fn the_input_is_the_line_without_the_delivery_fields() {
    let full = v1::Event {
        seq: 9,
        event_id: "e".into(),
        event_born_time: 11,
        event_corp_id: "corp".into(),
        event_type: "a.b".into(),
        event_unified_app_id: "app".into(),
        subscription_id: "s".into(),
        source_id: "src".into(),
        rule_type: "at".into(),
        data: r#"{"k":[1,"x",null,true,2.5]}"#.into(),
        headers: [("h".to_string(), "v".to_string())].into(),
        received_at_unix_ms: 12,
        redelivered: true,
        delivery: 3,
    };
    let empty = v1::Event {
        event_type: "a.b".into(),
        data: "not json".into(),
        ..Default::default()
    };
    for e in [full, empty] {
        let mut line = serde_json::to_value(crate::ndjson::EventLine::from(&e)).unwrap();
        let obj = line.as_object_mut().unwrap();
        for k in ["subscribe_id", "redelivered", "delivery"] {
            obj.shift_remove(k);
        }
        if let Ok(data) = serde_json::from_str::<serde_json::Value>(&e.data) {
            obj.insert("data".into(), data);
        }
        assert_eq!(event_value(&e), json_to_val(&line), "{line}");
        assert_eq!(event_value(&e).to_string(), json_to_val(&line).to_string());
    }
}

#[test]
fn errors_and_fuel_are_no_answer() {
    let ev = event("{}");
    assert_eq!(
        prog(&[r#"error("x")"#]).matches(&ev),
        Err(EvalError::Raised)
    );
    assert_eq!(
        prog(&[".data.a.b.c | length > 1 | not | . + 1"]).matches(&ev),
        Err(EvalError::Raised)
    );
    // Many steps: a cartesian product over the input.
    let big = format!("[{}]", vec!["1"; 300].join(","));
    let ev = event(&format!("{{\"a\":{big}}}"));
    let p = prog(&[".data.a[] as $x | .data.a[] as $y | empty"]);
    assert_eq!(p.matches(&ev), Err(EvalError::Fuel));
    // The fuel is per evaluation: the next one starts full.
    assert_eq!(prog(&[".data.a | length == 300"]).matches(&ev), Ok(true));
    assert_eq!(p.matches(&ev), Err(EvalError::Fuel));
}

#[test]
fn fromjson_is_depth_limited() {
    let deep = "[".repeat(100_000);
    let ev = event(&serde_json::to_string(&serde_json::json!({"s": deep})).unwrap());
    assert_eq!(
        prog(&[".data.s | fromjson"]).matches(&ev),
        Err(EvalError::Raised)
    );
    assert_eq!(
        prog(&[".data.s | tonumber"]).matches(&ev),
        Err(EvalError::Raised)
    );
    let ev = event(r#"{"n":"12000"}"#);
    assert_eq!(prog(&[".data.n | tonumber > 10000"]).matches(&ev), Ok(true));
}

fn refusal(expr: &str) -> String {
    check(expr).unwrap_err().0
}

#[test]
fn refusals_name_the_column() {
    let e = refusal(".data.x ==");
    assert!(e.contains("at column 11"), "{e}");
    let e = refusal(".a | (.b");
    assert!(
        e.contains("column") && e.contains("closing parenthesis"),
        "{e}"
    );
    let e = refusal(".a | nosuchfn(1)");
    assert!(e.contains("column 6") && e.contains("nosuchfn"), "{e}");
    let e = refusal(".a | def f: f; f");
    assert!(e.contains("column 10") && e.contains("def"), "{e}");
    let e = refusal("last(range(1e9))");
    assert!(e.contains("column 6") && e.contains("range"), "{e}");
    let e = refusal("reduce .[] as $x (0; 1)");
    assert!(e.contains("column 1") && e.contains("reduce"), "{e}");
    assert!(refusal(r#""x" * 100000000000"#).contains("`*`"));
    assert!(refusal("$ENV.HOME").contains("$ENV"));
    assert!(refusal("env.HOME").contains("env"));
    assert!(refusal("label $f | 1").contains("label"));
    assert!(refusal(&"(".repeat(40)).contains("nested deeper"));
    assert!(refusal(&format!("\"{}\"", "a".repeat(MAX_WHERE_LEN))).contains("the most is"));
    assert!(refusal("import \"a\" as a; 1").contains("column"));
    assert!(refusal("\"abc").contains("closing quote"));
    assert!(check(
        r#".data.conversationId == "cid" and (.data.atUsers // [] | any(.dingtalkId == "u"))"#
    )
    .is_ok());
    let many: Vec<String> = (0..=MAX_WHERES).map(|_| "true".to_string()).collect();
    assert!(Program::compile(&many)
        .unwrap_err()
        .0
        .contains("the most is"));
}

/// Parsing, checking and running stay within a small stack whatever the
/// shape (the bus evaluates on its committer thread, 2 MiB).
#[test]
fn every_shape_within_the_limits_fits_a_small_stack() {
    let t = std::thread::Builder::new()
        .stack_size(1024 * 1024)
        .spawn(|| {
            let input = event(r#"{"a":[1,2]}"#);
            let mut accepted = 0;
            for pat in [
                "-",
                ".|",
                "try ",
                "1 as $x|",
                "not|",
                "[",
                "{a:",
                "true and ",
                ".a?//",
                "if true then 1 else ",
            ] {
                for n in [5, 10, 20, 31, 40, 64, 95, 128, 300, 1000] {
                    let code = format!("{}1", pat.repeat(n));
                    if let Ok(p) = Program::compile(&[code]) {
                        accepted += 1;
                        let _ = p.matches(&input);
                    }
                }
            }
            accepted
        })
        .unwrap();
    assert!(t.join().unwrap() > 10);
}

/// Not a test: `cargo test --release -p dws-proto where_cost -- --ignored --nocapture`.
#[test]
#[ignore]
fn where_cost() {
    let e = v1::Event {
        seq: 7,
        event_id: "ev-1".into(),
        event_type: "bench.x".into(),
        data: format!("{} 1 {}", 123456789, "x".repeat(230)),
        received_at_unix_ms: 5,
        ..Default::default()
    };
    let n = 100_000;
    let t = std::time::Instant::now();
    for _ in 0..n {
        std::hint::black_box(Input::of(std::hint::black_box(&e)));
    }
    println!("input: {:?} per event", t.elapsed() / n);
    let t = std::time::Instant::now();
    for _ in 0..100 {
        std::hint::black_box(prog(&[".data.a == 1"]));
    }
    println!("compile: {:?} per expression", t.elapsed() / 100);
    let input = Input::of(&e);
    for expr in ["true", "(.data | length) > 0", ".event_type == \"bench.x\""] {
        let p = prog(&[expr]);
        let t = std::time::Instant::now();
        for _ in 0..n {
            std::hint::black_box(p.matches(&input.0).ok());
        }
        println!("{expr}: {:?} per evaluation", t.elapsed() / n);
    }
}
