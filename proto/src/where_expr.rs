//! `--where EXPR`: a jq expression on an event, in one place for both
//! binaries. `dws` checks an expression with [`check`] before any side effect
//! (a refusal is exit 2 with the position); the bus compiles a
//! subscription's expressions once ([`Program::compile`]) and runs them on
//! each event whose type already matched ([`Program::matches`]).
//!
//! The language is jq as implemented by `jaq` (jaq-core, jaq-std,
//! jaq-json). The input is the event's NDJSON line as a consumer sees it,
//! without the per-delivery fields (`subscribe_id`, `redelivered`,
//! `delivery`), and with `data` parsed when it is JSON ([`event_value`]).
//! An event matches when every expression's first output is truthy (not
//! `null` or `false`); no output is no match.
//!
//! Bounds (README "Limits"):
//! - size: [`MAX_WHERE_LEN`] bytes and [`MAX_WHERE_TOKENS`] tokens per
//!   expression, [`MAX_WHERES`] per subscription, bracket nesting
//!   [`MAX_WHERE_NESTING`], tree depth [`MAX_WHERE_DEPTH`] (the parser and
//!   the interpreter recurse: these keep a 1 MiB stack enough, tested);
//! - what the expression may say: no `def` (so no recursion of its own),
//!   no `reduce`/`foreach`/`label`, no `*` (string repetition allocates
//!   without a step), no builtins that loop on their own output (`range`,
//!   `repeat`, `recurse`, `while`, `until`, `combinations`) or read the
//!   bus's environment or inputs (`env`, `$ENV`, `input`, `inputs`,
//!   `input_filename`, `debug`, `stderr`, `halt`, `halt_error`);
//! - cost per event: [`FUEL`] steps of the interpreter, shared by all the
//!   expressions of a subscription. Every term the interpreter runs takes
//!   its look-up table through [`HasLut::lut`]; ours counts, and at zero
//!   unwinds out of the evaluation (`resume_unwind`: no panic hook, no
//!   message), which [`Program::matches`] catches as [`EvalError::Fuel`];
//! - JSON parsed from the event (`data`, `fromjson`) is parsed by
//!   serde_json, whose recursion limit (128) keeps the stack bounded.
//!
//! Not bounded by steps: the work of one builtin on one value (linear or
//! n·log n in its size for all of them), so a value the expression itself
//! doubled many times (`[.,.]` or `.+.` written k times) costs 2^k in one
//! step; the expression size limits k, not the memory.

// The step bound unwinds out of an evaluation; with `panic = "abort"` that
// would end the process instead.
#[cfg(panic = "abort")]
compile_error!("where_expr's step bound needs panic = \"unwind\"");

use std::cell::Cell;
use std::fmt;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};

use jaq_core::box_iter::box_once;
use jaq_core::data::{DataT, HasLut};
use jaq_core::load::lex::StrPart;
use jaq_core::load::parse::{BinaryOp, Pattern, Term};
use jaq_core::load::{self, Arena, File, Lexer, Loader, Parser};
use jaq_core::native::Fun;
use jaq_core::ops::Math;
use jaq_core::path::Part;
use jaq_core::{Compiler, Ctx, Cv, Error as JqError, Exn, Lut, Native, ValT, ValXs, Vars};
use jaq_json::Val;

use crate::v1;

/// Longest `--where` expression, in bytes.
pub const MAX_WHERE_LEN: usize = 1024;
/// Most `--where` expressions in one subscription (they are ANDed).
pub const MAX_WHERES: usize = 8;
/// Deepest nesting of `(`, `[` and `{` in an expression (the parser recurses).
pub const MAX_WHERE_NESTING: usize = 32;
/// Most tokens in an expression (the parser recurses on some of them).
pub const MAX_WHERE_TOKENS: usize = 96;
/// Deepest expression tree (the interpreter recurses on it).
pub const MAX_WHERE_DEPTH: usize = 32;
/// Interpreter steps one event may take, over all of a subscription's
/// expressions; past it the event does not match and counts in `where_errors`.
pub const FUEL: u32 = 20_000;

/// Builtins an expression may not call (see the module header).
const DENIED: &[&str] = &[
    "range",
    "repeat",
    "recurse",
    "while",
    "until",
    "combinations",
    "env",
    "input",
    "inputs",
    "input_filename",
    "debug",
    "stderr",
    "halt",
    "halt_error",
];

/// Why an expression was refused: a message that names the column (1-based,
/// in characters) where the problem is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WhereError(pub String);

impl fmt::Display for WhereError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for WhereError {}

/// Why one event's evaluation did not give an answer (counted, never shown
/// to a consumer).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EvalError {
    /// The expression raised an error on this event.
    Raised,
    /// The event took more than [`FUEL`] steps.
    Fuel,
}

/// The value type jaq runs on here, with the counting look-up table.
pub struct Data;

impl DataT for Data {
    type V<'a> = Val;
    type Data<'a> = Fueled<'a>;
}

/// The run-time data of one evaluation: the program and what is left of
/// its fuel.
#[derive(Clone)]
pub struct Fueled<'a> {
    lut: &'a Lut<Data>,
    fuel: &'a Cell<u32>,
}

/// What unwinds out of an evaluation that ran out of fuel.
struct OutOfFuel;

impl<'a> HasLut<'a, Data> for Fueled<'a> {
    fn lut(&self) -> &'a Lut<Data> {
        let left = self.fuel.get();
        if left == 0 {
            resume_unwind(Box::new(OutOfFuel));
        }
        self.fuel.set(left - 1);
        self.lut
    }
}

/// A subscription's compiled expressions.
pub struct Program {
    exprs: Vec<String>,
    filters: Vec<jaq_core::Filter<Data>>,
}

impl fmt::Debug for Program {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Program").field(&self.exprs).finish()
    }
}

impl Program {
    /// Checks and compiles `exprs` (an empty list is a program that selects
    /// everything; callers keep `None` instead).
    pub fn compile(exprs: &[String]) -> Result<Program, WhereError> {
        if exprs.len() > MAX_WHERES {
            return Err(WhereError(format!(
                "{} --where expressions; the most is {MAX_WHERES}",
                exprs.len()
            )));
        }
        let filters = exprs
            .iter()
            .map(|e| compile_one(e))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Program {
            exprs: exprs.to_vec(),
            filters,
        })
    }

    /// The expressions as given.
    pub fn exprs(&self) -> &[String] {
        &self.exprs
    }

    /// Whether `input` passes every expression (first output truthy).
    pub fn matches(&self, input: &Val) -> Result<bool, EvalError> {
        let fuel = Cell::new(FUEL);
        for f in &self.filters {
            let run = AssertUnwindSafe(|| first_truthy(f, input, &fuel));
            match catch_unwind(run) {
                Ok(Ok(true)) => {}
                Ok(Ok(false)) => return Ok(false),
                Ok(Err(e)) => return Err(e),
                Err(payload) if payload.is::<OutOfFuel>() => return Err(EvalError::Fuel),
                Err(payload) => resume_unwind(payload),
            }
        }
        Ok(true)
    }
}

fn first_truthy(
    f: &jaq_core::Filter<Data>,
    input: &Val,
    fuel: &Cell<u32>,
) -> Result<bool, EvalError> {
    let data = Fueled { lut: &f.lut, fuel };
    let ctx = Ctx::<Data>::new(data, Vars::new([]));
    let first = f.id.run((ctx, input.clone())).next();
    match first {
        None => Ok(false),
        Some(Ok(v)) => Ok(v.as_bool()),
        Some(Err(_)) => Err(EvalError::Raised),
    }
}

/// Checks one expression as the bus will (size, syntax, what it may say,
/// names that exist), without keeping the compiled form.
pub fn check(expr: &str) -> Result<(), WhereError> {
    compile_one(expr).map(|_| ())
}

fn compile_one(code: &str) -> Result<jaq_core::Filter<Data>, WhereError> {
    if code.len() > MAX_WHERE_LEN {
        return Err(WhereError(format!(
            "--where expression of {} bytes; the most is {MAX_WHERE_LEN}",
            code.len()
        )));
    }
    check_nesting(code)?;
    let term = parse_term(code)?;
    check_term(code, &term, 0)?;
    let defs = jaq_core::defs()
        .chain(jaq_std::defs())
        .chain(jaq_json::defs());
    let arena = Arena::default();
    let modules = Loader::new(defs)
        .load(&arena, File { code, path: () })
        .map_err(|_| WhereError(format!("invalid --where expression {}", quote(code))))?;
    Compiler::default()
        .with_funs(funs())
        .compile(modules)
        .map_err(|errs| {
            let (name, at) = errs
                .iter()
                .flat_map(|(_, es)| es.iter())
                .map(|(name, undef)| (format!("{} {}", undef.as_str(), name), *name))
                .next()
                .unwrap_or_else(|| ("name".into(), code));
            refuse(code, at, &format!("undefined {name}"))
        })
}

/// The natives: jaq's, with `fromjson` parsed by serde_json (depth-limited).
fn funs() -> impl Iterator<Item = Fun<Data>> {
    let ours: Fun<Data> = ("fromjson", Box::new([]), Native::<Data>::new(fromjson));
    jaq_core::funs()
        .chain(jaq_std::funs())
        .chain(jaq_json::funs())
        .filter(|(name, _, _)| *name != "fromjson")
        .chain([ours])
}

fn fromjson<'a>(cv: Cv<'a, Data>) -> ValXs<'a, <Data as DataT>::V<'a>> {
    let parsed = match &cv.1 {
        Val::TStr(b) | Val::BStr(b) => serde_json::from_slice::<serde_json::Value>(b)
            .map(|v| json_to_val(&v))
            .map_err(|e| JqError::str(format!("cannot parse as JSON: {e}"))),
        _ => Err(JqError::str("fromjson takes a string")),
    };
    box_once(parsed.map_err(Exn::from))
}

/// A serde_json value as a jaq value.
pub fn json_to_val(v: &serde_json::Value) -> Val {
    use serde_json::Value as J;
    match v {
        J::Null => Val::Null,
        J::Bool(b) => Val::Bool(*b),
        J::Number(n) => match n.as_i64().and_then(|i| isize::try_from(i).ok()) {
            Some(i) => Val::from(i),
            None => Val::from_num(&n.to_string()).unwrap_or(Val::Null),
        },
        J::String(s) => Val::from(s.clone()),
        J::Array(a) => a.iter().map(json_to_val).collect(),
        J::Object(o) => {
            let pairs = o
                .iter()
                .map(|(k, v)| (Val::from(k.clone()), json_to_val(v)));
            Val::from_map(pairs).unwrap_or(Val::Null)
        }
    }
}

/// An event as expressions see it ([`event_value`]), built once per event
/// and shared by every subscription that evaluates it (values are behind
/// `Arc`: cloning one is cheap).
#[derive(Debug, Clone)]
pub struct Input(pub Val);

impl Input {
    pub fn of(e: &v1::Event) -> Input {
        Input(event_value(e))
    }
}

/// The input of an expression: the event's NDJSON line without the
/// per-delivery fields, `data` parsed when it is JSON.
pub fn event_value(e: &v1::Event) -> Val {
    // Built directly (not through serde_json's line): the fields and the
    // omission rules of `ndjson::EventLine`, without the per-delivery ones
    // (a unit test holds the two together).
    let text = |s: &str| Val::from(s.to_owned());
    let int = |n: i64| isize::try_from(n).map_or_else(|_| Val::from(n as f64), Val::from);
    let mut m: Vec<(Val, Val)> = Vec::with_capacity(12);
    m.push((text("type"), text("event")));
    m.push((text("seq"), int(i64::try_from(e.seq).unwrap_or(i64::MAX))));
    push_text(&mut m, "event_id", &e.event_id);
    if e.event_born_time != 0 {
        m.push((text("event_born_time"), int(e.event_born_time)));
    }
    push_text(&mut m, "event_corp_id", &e.event_corp_id);
    m.push((text("event_type"), text(&e.event_type)));
    push_text(&mut m, "event_unified_app_id", &e.event_unified_app_id);
    push_text(&mut m, "source_id", &e.source_id);
    push_text(&mut m, "rule_type", &e.rule_type);
    if !e.data.is_empty() {
        let data = match serde_json::from_str::<serde_json::Value>(&e.data) {
            Ok(v) => json_to_val(&v),
            Err(_) => text(&e.data),
        };
        m.push((text("data"), data));
    }
    if !e.headers.is_empty() {
        let h = e.headers.iter().map(|(k, v)| (text(k), text(v)));
        m.push((text("headers"), Val::from_map(h).unwrap_or(Val::Null)));
    }
    m.push((text("received_at_unix_ms"), int(e.received_at_unix_ms)));
    Val::from_map(m).unwrap_or(Val::Null)
}

/// An optional text field of the line: omitted when empty.
fn push_text(m: &mut Vec<(Val, Val)>, k: &str, v: &str) {
    if !v.is_empty() {
        m.push((Val::from(k.to_owned()), Val::from(v.to_owned())));
    }
}

fn parse_term(code: &str) -> Result<Term<&str>, WhereError> {
    let tokens = Lexer::new(code).lex().map_err(|errs| match errs.first() {
        Some((expect, at)) => refuse(code, at, &format!("expected {}", lex_expected(expect))),
        None => WhereError(format!("invalid --where expression {}", quote(code))),
    })?;
    let count = count_tokens(&tokens);
    if count > MAX_WHERE_TOKENS {
        return Err(WhereError(format!(
            "--where expression of {count} tokens; the most is {MAX_WHERE_TOKENS}"
        )));
    }
    Parser::new(&tokens)
        .parse(|p| p.term())
        .map_err(|errs| match errs.first() {
            Some((expect, found)) => {
                let (at, what) = match found {
                    Some(tok) => (tok.as_str(), format!("found {}", quote(tok.as_str()))),
                    None => (&code[code.len()..], "found the end".to_owned()),
                };
                refuse(code, at, &format!("expected {}, {what}", expect.as_str()))
            }
            None => WhereError(format!("invalid --where expression {}", quote(code))),
        })
}

fn count_tokens(tokens: &[load::lex::Token<&str>]) -> usize {
    use load::lex::Tok;
    tokens
        .iter()
        .map(|t| match &t.1 {
            Tok::Block(inner) => 1 + count_tokens(inner),
            Tok::Str(parts) => {
                1 + parts
                    .iter()
                    .map(|p| match p {
                        StrPart::Term(t) => count_tokens(std::slice::from_ref(t)),
                        _ => 0,
                    })
                    .sum::<usize>()
            }
            _ => 1,
        })
        .sum()
}

/// What the lexer wanted, without the library's `as_str` (which panics on a
/// delimiter it does not know).
fn lex_expected(e: &load::lex::Expect<&str>) -> &'static str {
    use load::lex::Expect as E;
    match e {
        E::Delim(d) if d.starts_with('(') => "closing parenthesis",
        E::Delim(d) if d.starts_with('[') => "closing bracket",
        E::Delim(d) if d.starts_with('{') => "closing brace",
        E::Delim(_) => "closing quote",
        E::Digit => "digit",
        E::Ident => "identifier",
        E::Escape => "string escape sequence",
        E::Unicode => "4-digit hexadecimal code point",
        _ => "token",
    }
}

fn check_nesting(code: &str) -> Result<(), WhereError> {
    let mut depth = 0usize;
    for (i, c) in code.char_indices() {
        match c {
            '(' | '[' | '{' => {
                depth += 1;
                if depth > MAX_WHERE_NESTING {
                    return Err(refuse(
                        code,
                        &code[i..i + 1],
                        &format!("nested deeper than {MAX_WHERE_NESTING}"),
                    ));
                }
            }
            ')' | ']' | '}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    Ok(())
}

/// What the expression may say (see the module header).
fn check_term<'s>(code: &'s str, t: &Term<&'s str>, depth: usize) -> Result<(), WhereError> {
    if depth > MAX_WHERE_DEPTH {
        return Err(WhereError(format!(
            "--where expression {} nested deeper than {MAX_WHERE_DEPTH}",
            quote(code)
        )));
    }
    let d = depth + 1;
    let no = |at: &'s str, what: &str| {
        Err(refuse(
            code,
            at,
            &format!("{what} is not allowed in --where"),
        ))
    };
    let all = |ts: &mut dyn Iterator<Item = &Term<&'s str>>| -> Result<(), WhereError> {
        for t in ts {
            check_term(code, t, d)?;
        }
        Ok(())
    };
    match t {
        Term::Id | Term::Recurse | Term::Num(_) => Ok(()),
        Term::Var(v) if *v == "$ENV" => no(v, "$ENV"),
        Term::Var(_) => Ok(()),
        Term::Str(_, parts) => all(&mut parts.iter().filter_map(|p| match p {
            StrPart::Term(t) => Some(t),
            _ => None,
        })),
        Term::Arr(a) => all(&mut a.iter().map(|b| &**b)),
        Term::Obj(kvs) => all(&mut kvs.iter().flat_map(|(k, v)| std::iter::once(k).chain(v))),
        Term::Neg(t) => check_term(code, t, d),
        Term::BinOp(l, op, r) => {
            if matches!(
                op,
                BinaryOp::Math(Math::Mul) | BinaryOp::UpdateMath(Math::Mul)
            ) {
                let at = code.find('*').map_or(code, |i| &code[i..i + 1]);
                return no(at, "`*`");
            }
            if let BinaryOp::Pipe(Some(p)) = op {
                check_pattern(code, p, d)?;
            }
            check_term(code, l, d)?;
            check_term(code, r, d)
        }
        Term::Label(v, _) | Term::Break(v) => no(v, "`label`/`break`"),
        Term::Fold(kw, ..) => no(kw, &format!("`{kw}`")),
        Term::TryCatch(t, c) => {
            check_term(code, t, d)?;
            all(&mut c.iter().map(|b| &**b))
        }
        Term::IfThenElse(branches, otherwise) => {
            all(&mut branches.iter().flat_map(|(c, t)| [c, t]))?;
            all(&mut otherwise.iter().map(|b| &**b))
        }
        Term::Def(defs, _) => match defs.first() {
            Some(d) => no(d.name, "`def`"),
            None => no(code, "`def`"),
        },
        Term::Call(name, args) => {
            if DENIED.contains(name) {
                return no(name, &format!("`{name}`"));
            }
            all(&mut args.iter())
        }
        Term::Path(t, path) => {
            check_term(code, t, d)?;
            for (part, _) in &path.0 {
                match part {
                    Part::Index(i) => check_term(code, i, d)?,
                    Part::Range(a, b) => all(&mut a.iter().chain(b))?,
                }
            }
            Ok(())
        }
        #[allow(unreachable_patterns)]
        _ => no(code, "this construct"),
    }
}

fn check_pattern<'s>(code: &'s str, p: &Pattern<&'s str>, depth: usize) -> Result<(), WhereError> {
    let d = depth + 1;
    match p {
        Pattern::Var(_) => Ok(()),
        Pattern::Arr(ps) => ps.iter().try_for_each(|p| check_pattern(code, p, d)),
        Pattern::Obj(kps) => kps.iter().try_for_each(|(k, p)| {
            check_term(code, k, d)?;
            check_pattern(code, p, d)
        }),
    }
}

/// A refusal at `at` (a slice of `code`): `invalid --where expression at
/// column N: WHAT`.
fn refuse(code: &str, at: &str, what: &str) -> WhereError {
    let start = (at.as_ptr() as usize)
        .checked_sub(code.as_ptr() as usize)
        .filter(|&s| s <= code.len())
        .unwrap_or(0);
    let column = code.get(..start).map_or(0, |s| s.chars().count()) + 1;
    WhereError(format!(
        "invalid --where expression {} at column {column}: {what}",
        quote(code)
    ))
}

fn quote(code: &str) -> String {
    format!("{:?}", crate::limits::clip(code))
}

#[cfg(test)]
#[path = "where_tests.rs"]
mod tests;
