//! The Rhai backend: a hardened engine running in the (sandboxed) worker.
//! Capability functions are protocol round-trips to the supervisor.

use super::channel::Channel;
use super::json::{from_json, same, to_json};
use crate::protocol::{
    CapabilitySpec, Definition, Done, DoneStatus, DroppedVar, FromWorker, Preload, ReplyErrorKind,
    ScriptError, ScriptLimits, Start, ToWorker,
};
use rhai::packages::{Package, StandardPackage};
use rhai::{Dynamic, Engine, EvalAltResult, Position, Scope, AST};
use serde_json::{Map, Value};
use std::cell::RefCell;
use std::collections::HashSet;
use std::io::Write;
use std::rc::Rc;
use std::time::{Duration, Instant};

thread_local! {
    /// The standard package, built once per process: a fork server builds it
    /// before forking, so every cell child inherits it ready-made.
    static STANDARD: rhai::Shared<rhai::Module> = StandardPackage::new().as_shared_module();
}

fn standard_package() -> rhai::Shared<rhai::Module> {
    STANDARD.with(Clone::clone)
}

/// Build what every cell needs before the first fork.
pub fn prewarm() {
    let _ = standard_package();
}

/// The engine every Rhai cell runs in. Built from `Engine::new_raw()`: only
/// the standard package (no file or module access), every limit set, `eval`
/// disabled, a deadline checked as the script runs, `print`/`debug` to
/// stdout.
pub fn hardened_engine(limits: &ScriptLimits, deadline: Instant) -> Engine {
    let mut engine = Engine::new_raw();
    engine.register_global_module(standard_package());
    engine.set_max_operations(limits.max_operations);
    engine.set_max_call_levels(limits.max_call_levels);
    engine.set_max_expr_depths(limits.max_expr_depth, limits.max_expr_depth);
    engine.set_max_string_size(limits.max_string_bytes);
    engine.set_max_array_size(limits.max_array_len);
    engine.set_max_map_size(limits.max_map_len);
    engine.set_max_modules(0);
    engine.set_max_functions(10_000);
    engine.set_max_variables(10_000);
    engine.set_module_resolver(rhai::module_resolvers::DummyModuleResolver::new());
    engine.disable_symbol("eval");
    engine.disable_symbol("import");
    engine.on_progress(move |ops| {
        if ops % 512 == 0 && Instant::now() >= deadline {
            Some(Dynamic::from("deadline"))
        } else {
            None
        }
    });
    engine.on_print(|s| {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{s}");
    });
    engine.on_debug(|s, _src, pos| {
        let mut out = std::io::stdout().lock();
        if pos.is_none() {
            let _ = writeln!(out, "[debug] {s}");
        } else {
            let _ = writeln!(out, "[debug {pos}] {s}");
        }
    });
    engine
}

/// Map a call reply error to the script-visible error value.
fn reply_error(kind: ReplyErrorKind, message: &str, pos: Position) -> Box<EvalAltResult> {
    let mut m = rhai::Map::new();
    m.insert("kind".into(), Dynamic::from(kind.as_str().to_owned()));
    m.insert("message".into(), Dynamic::from(message.to_owned()));
    Box::new(EvalAltResult::ErrorRuntime(Dynamic::from_map(m), pos))
}

fn do_call(
    chan: &Rc<RefCell<Channel>>,
    cap: &str,
    args: Map<String, Value>,
    pos: Position,
) -> Result<Dynamic, Box<EvalAltResult>> {
    let mut chan = chan.borrow_mut();
    let id = chan.next_id();
    let msg = FromWorker::Call(crate::protocol::Call {
        id,
        cap: cap.to_owned(),
        args,
    });
    if chan.send(&msg).is_err() {
        // The supervisor is gone or refused the frame; nothing to report to.
        std::process::exit(crate::exit::Exit::Internal.raw());
    }
    match chan.recv() {
        Ok(ToWorker::Reply(r)) if r.id == id => match (r.ok, r.error) {
            (_, Some(e)) => Err(reply_error(e.kind, &e.message, pos)),
            (Some(v), None) => Ok(from_json(&v)),
            (None, None) => Ok(Dynamic::UNIT),
        },
        _ => std::process::exit(crate::exit::Exit::Internal.raw()),
    }
}

/// A model capability's reply as a script sees it: the text (the record
/// with model, usage and cost goes to the cell's calls).
fn model_text(cap: &str, v: Dynamic) -> Dynamic {
    let text = |d: &Dynamic| -> Dynamic {
        d.read_lock::<rhai::Map>()
            .and_then(|m| m.get("text").cloned())
            .unwrap_or_else(|| d.clone())
    };
    match cap {
        "model_query" | "summarize" => text(&v),
        "model_query_batched" => match v.read_lock::<rhai::Array>() {
            Some(a) => Dynamic::from_array(a.iter().map(text).collect()),
            None => v.clone(),
        },
        _ => v,
    }
}

fn register_capabilities(engine: &mut Engine, caps: &[CapabilitySpec], chan: Rc<RefCell<Channel>>) {
    for spec in caps {
        for arity in 0..=spec.params.len() {
            let params: Vec<String> = spec.params[..arity].to_vec();
            let name = spec.name.clone();
            let chan = chan.clone();
            let types = vec![std::any::TypeId::of::<Dynamic>(); arity];
            engine.register_raw_fn(&spec.name, types, move |ctx, args| {
                let pos = ctx.call_position();
                let mut map = Map::new();
                for (p, a) in params.iter().zip(args.iter()) {
                    let v = to_json(a, 0).map_err(|e| {
                        reply_error(
                            ReplyErrorKind::InvalidArgs,
                            &format!("argument {p:?}: {e}"),
                            pos,
                        )
                    })?;
                    map.insert(p.clone(), v);
                }
                let v = do_call(&chan, &name, map, pos)?;
                Ok(model_text(&name, v))
            });
        }
    }
    register_tool_modules(engine, caps, &chan);
    // `invoke(name)` / `invoke(name, #{args})` for any name, known or not
    // (`call` is a Rhai keyword); `tool_call` is the same under the name
    // both languages share.
    for fname in ["invoke", "tool_call"] {
        register_invoke(engine, fname, chan.clone());
    }
}

/// `tools::SERVER::TOOL(#{args})` and `tools::SERVER::TOOL()` for each
/// tool `SERVER.TOOL` of an upstream server (a TOOL that is no Rhai name is
/// called with `tool_call` only).
fn register_tool_modules(
    engine: &mut Engine,
    caps: &[CapabilitySpec],
    chan: &Rc<RefCell<Channel>>,
) {
    use rhai::{FuncRegistration, Module, NativeCallContext};
    let mut servers: std::collections::BTreeMap<&str, Module> = std::collections::BTreeMap::new();
    for spec in caps {
        let Some((server, tool)) = spec.name.split_once('.') else {
            continue;
        };
        if !tool.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            || tool.starts_with(|c: char| c.is_ascii_digit())
        {
            continue;
        }
        let m = servers.entry(server).or_default();
        let (name, c) = (spec.name.clone(), chan.clone());
        FuncRegistration::new(tool).set_into_module(
            m,
            move |ctx: NativeCallContext, args: rhai::Map| -> Result<Dynamic, Box<EvalAltResult>> {
                let pos = ctx.call_position();
                let v = to_json(&Dynamic::from_map(args), 0)
                    .map_err(|e| reply_error(ReplyErrorKind::InvalidArgs, &e, pos))?;
                let map = match v {
                    Value::Object(m) => m,
                    _ => Map::new(),
                };
                do_call(&c, &name, map, pos)
            },
        );
        let (name, c) = (spec.name.clone(), chan.clone());
        FuncRegistration::new(tool).set_into_module(
            m,
            move |ctx: NativeCallContext| -> Result<Dynamic, Box<EvalAltResult>> {
                do_call(&c, &name, Map::new(), ctx.call_position())
            },
        );
    }
    if servers.is_empty() {
        return;
    }
    let mut tools = Module::new();
    for (server, m) in servers {
        tools.set_sub_module(server, m);
    }
    engine.register_static_module("tools", tools.into());
}

fn register_invoke(engine: &mut Engine, fname: &str, chan: Rc<RefCell<Channel>>) {
    let c1 = chan.clone();
    engine.register_fn(
        fname,
        move |ctx: rhai::NativeCallContext, name: &str| -> Result<Dynamic, Box<EvalAltResult>> {
            do_call(&c1, name, Map::new(), ctx.call_position())
        },
    );
    engine.register_fn(
        fname,
        move |ctx: rhai::NativeCallContext,
              name: &str,
              args: rhai::Map|
              -> Result<Dynamic, Box<EvalAltResult>> {
            let pos = ctx.call_position();
            let v = to_json(&Dynamic::from_map(args), 0)
                .map_err(|e| reply_error(ReplyErrorKind::InvalidArgs, &e, pos))?;
            let map = match v {
                Value::Object(m) => m,
                _ => Map::new(),
            };
            do_call(&chan, name, map, pos)
        },
    );
}

fn position_of(pos: Position) -> (Option<u64>, Option<u64>) {
    (
        pos.line().map(|l| l as u64),
        pos.position().map(|c| c as u64),
    )
}

/// Strip Rhai's " (line N, position M)" suffix: the position has fields.
fn bare_message(msg: &str) -> String {
    match msg.rfind(" (line ") {
        Some(i) if msg.ends_with(')') => msg[..i].to_owned(),
        _ => msg.to_owned(),
    }
}

/// Classify an engine error: (status, error, which limit).
fn describe(err: &EvalAltResult) -> (DoneStatus, ScriptError, Option<String>) {
    let mut traceback = Vec::new();
    let mut inner = err;
    while let EvalAltResult::ErrorInFunctionCall(name, _src, e, pos) = inner {
        traceback.push(format!("in call to function {name} ({pos})"));
        inner = e;
    }
    let (line, column) = position_of(inner.position());
    let (status, kind, limit) = match inner {
        EvalAltResult::ErrorTooManyOperations(_) => (
            DoneStatus::LimitExceeded,
            "LimitExceeded",
            Some("operations"),
        ),
        EvalAltResult::ErrorDataTooLarge(..) => (
            DoneStatus::LimitExceeded,
            "LimitExceeded",
            Some("data size"),
        ),
        EvalAltResult::ErrorStackOverflow(_) => (
            DoneStatus::LimitExceeded,
            "LimitExceeded",
            Some("call depth"),
        ),
        EvalAltResult::ErrorTooManyModules(_) => {
            (DoneStatus::LimitExceeded, "LimitExceeded", Some("modules"))
        }
        EvalAltResult::ErrorTerminated(..) => (DoneStatus::Timeout, "Timeout", None),
        EvalAltResult::ErrorParsing(..) => (DoneStatus::Error, "SyntaxError", None),
        EvalAltResult::ErrorFunctionNotFound(..) => (DoneStatus::Error, "FunctionNotFound", None),
        EvalAltResult::ErrorVariableNotFound(..) => (DoneStatus::Error, "VariableNotFound", None),
        EvalAltResult::ErrorMismatchDataType(..) | EvalAltResult::ErrorMismatchOutputType(..) => {
            (DoneStatus::Error, "TypeError", None)
        }
        EvalAltResult::ErrorArithmetic(..) => (DoneStatus::Error, "ArithmeticError", None),
        EvalAltResult::ErrorIndexNotFound(..)
        | EvalAltResult::ErrorArrayBounds(..)
        | EvalAltResult::ErrorStringBounds(..)
        | EvalAltResult::ErrorBitFieldBounds(..) => (DoneStatus::Error, "IndexError", None),
        EvalAltResult::ErrorRuntime(v, _) => {
            let kind = v
                .read_lock::<rhai::Map>()
                .and_then(|m| m.get("kind").map(|k| k.to_string()));
            match kind.as_deref().map(ReplyErrorKind::from_name) {
                Some(Some(k)) if k.is_refusal() => (DoneStatus::Error, "PermissionError", None),
                Some(_) => (DoneStatus::Error, "CapabilityError", None),
                None => (DoneStatus::Error, "RuntimeError", None),
            }
        }
        _ => (DoneStatus::Error, "RuntimeError", None),
    };
    let message = match inner {
        EvalAltResult::ErrorRuntime(v, _) => v
            .read_lock::<rhai::Map>()
            .and_then(|m| m.get("message").map(|k| k.to_string()))
            .unwrap_or_else(|| v.to_string()),
        EvalAltResult::ErrorTerminated(..) => {
            "the script ran past its time limit and was stopped".to_owned()
        }
        other => bare_message(&other.to_string()),
    };
    traceback.reverse();
    (
        status,
        ScriptError {
            kind: kind.to_owned(),
            message,
            traceback: (!traceback.is_empty()).then(|| traceback.join("\n")),
            line,
            column,
        },
        limit.map(str::to_owned),
    )
}

fn failed(status: DoneStatus, error: ScriptError, limit: Option<String>) -> Done {
    Done {
        status,
        value: Value::Null,
        repr: None,
        vars: Map::new(),
        kept: Vec::new(),
        dropped: Vec::new(),
        definitions: Vec::new(),
        error: Some(error),
        limit,
        live: None,
        display: Vec::new(),
        display_dropped: Vec::new(),
    }
}

/// Compile earlier cells' function definitions into one functions-only AST.
fn replay_definitions(engine: &Engine, defs: &[Definition]) -> AST {
    let mut acc = AST::empty();
    for d in defs {
        match engine.compile(&d.source) {
            Ok(ast) => acc = acc.merge(&ast.clone_functions_only()),
            Err(e) => crate::report!(
                "cellbox: could not restore the definitions of {}: {e}",
                d.names.join(", ")
            ),
        }
    }
    acc
}

/// A session's variables sent ahead of its cell (a `preload` frame), made
/// into the cell's scope while the worker waits.
pub(crate) struct Preloaded {
    vars: std::sync::Arc<Map<String, Value>>,
    scope: Scope<'static>,
}

impl Preloaded {
    pub(crate) fn new(p: Preload) -> Preloaded {
        Preloaded {
            scope: scope_of(&p.vars),
            vars: p.vars,
        }
    }
}

fn scope_of(vars: &Map<String, Value>) -> Scope<'static> {
    let mut scope = Scope::new();
    for (k, v) in vars {
        scope.push_dynamic(k.as_str(), from_json(v));
    }
    scope
}

/// The scope after a cell: each name once, at its first place, with its
/// newest value; those equal to what the cell was given go back as names
/// only (`kept`), so that a session that holds a large value does not have
/// it copied and sent back after every cell. The rest as JSON, or dropped.
fn carried(
    scope: &Scope<'static>,
    given: &Map<String, Value>,
    code: &str,
) -> (Map<String, Value>, Vec<String>, Vec<DroppedVar>) {
    let named = named_in(code, given);
    let mut entries: Vec<(&str, &Dynamic)> = Vec::new();
    let mut at: std::collections::HashMap<&str, usize> = std::collections::HashMap::new();
    let newest_first: Vec<(&str, bool, &Dynamic)> = scope.iter_raw().collect();
    for (name, _constant, v) in newest_first.into_iter().rev() {
        match at.get(name) {
            Some(&i) => entries[i].1 = v,
            None => {
                at.insert(name, entries.len());
                entries.push((name, v));
            }
        }
    }
    let (mut vars, mut kept, mut dropped) = (Map::new(), Vec::new(), Vec::new());
    for (name, v) in entries {
        // A value shared with a closure is read through a copy.
        let flat;
        let v = if v.is_shared() {
            flat = v.flatten_clone();
            &flat
        } else {
            v
        };
        // A given variable the cell does not name is as it was given; one
        // it names is compared.
        let unchanged = match given.get(name) {
            Some(_) if !named.contains(name) => true,
            Some(g) => same(v, g, 0),
            None => false,
        };
        if unchanged {
            kept.push(name.to_owned());
            continue;
        }
        match to_json(v, 0) {
            Ok(j) => {
                vars.insert(name.to_owned(), j);
            }
            Err(reason) => dropped.push(DroppedVar {
                name: name.to_owned(),
                type_name: v.type_name().to_owned(),
                reason,
            }),
        }
    }
    (vars, kept, dropped)
}

/// The names of `given` that are words of `code`: the only variables a
/// cell can have changed. A Rhai script reaches a variable only by its
/// name: `eval` is disabled, a function does not see its caller's scope,
/// a closure captures by name, and no custom syntax or variable resolver
/// is registered. So a variable whose name is no word of the text is not
/// touched, and need not be compared (that is O(its size) per cell in a
/// session holding large values).
///
/// A word is a longest run of letters, digits and `_`: an identifier is
/// read as one, and code that does not compile never gets here. A word
/// that does not start with a letter or `_` (a number, where an
/// identifier may follow in the same run) counts from each letter or `_`
/// in it too. A name found in a string or a comment is compared, which is
/// only slower.
fn named_in<'a>(code: &str, given: &'a Map<String, Value>) -> HashSet<&'a str> {
    // A cell without a session, the most common, has nothing to look for.
    if given.is_empty() {
        return HashSet::new();
    }
    let word_start = |c: char| c.is_alphabetic() || c == '_';
    let mut words: HashSet<&str> = HashSet::new();
    for run in code.split(|c: char| !(c.is_alphanumeric() || c == '_')) {
        if !run.starts_with(word_start) {
            for (i, c) in run.char_indices() {
                if word_start(c) {
                    words.insert(&run[i..]);
                }
            }
        }
        words.insert(run);
    }
    given
        .keys()
        .map(String::as_str)
        .filter(|k| words.contains(k))
        .collect()
}

/// Run `start`'s cell (with the variables of `preloaded` when `start`
/// says so); `last`: nothing runs after it in this process.
fn evaluate(
    chan: Rc<RefCell<Channel>>,
    start: &Start,
    last: bool,
    preloaded: Option<Preloaded>,
) -> Done {
    let (given, mut scope) = match (start.preloaded, preloaded) {
        (true, Some(p)) => (p.vars, p.scope),
        (false, stale) => {
            // Sent ahead and changed since: the worker exits after this
            // cell, so what it made need not be freed.
            std::mem::forget(stale);
            (start.vars.clone(), scope_of(&start.vars))
        }
        (true, None) => {
            return failed(
                DoneStatus::Error,
                ScriptError {
                    kind: "ProtocolError".into(),
                    message: "the cell's variables were to be sent ahead, and were not".into(),
                    ..ScriptError::default()
                },
                None,
            )
        }
    };
    // Stop a little before the supervisor's own deadline, so a runaway
    // script ends with a position instead of a SIGKILL.
    let margin = Duration::from_millis((start.limits.timeout_ms / 10).min(200));
    let deadline =
        Instant::now() + Duration::from_millis(start.limits.timeout_ms).saturating_sub(margin);
    let mut engine = hardened_engine(&start.limits, deadline);
    register_capabilities(&mut engine, &start.capabilities, chan);

    let cell_ast = match engine.compile(&start.code) {
        Ok(a) => a,
        Err(e) => {
            let (line, column) = position_of(e.1);
            return failed(
                DoneStatus::Error,
                ScriptError {
                    kind: "SyntaxError".into(),
                    message: bare_message(&e.to_string()),
                    traceback: None,
                    line,
                    column,
                },
                None,
            );
        }
    };
    let full = replay_definitions(&engine, &start.definitions).merge(&cell_ast);
    let value = match engine.eval_ast_with_scope::<Dynamic>(&mut scope, &full) {
        Ok(v) => v,
        Err(e) => {
            let (status, error, limit) = describe(&e);
            return failed(status, error, limit);
        }
    };
    let value = to_json(&value, 0).unwrap_or_else(|_| Value::String(value.to_string()));
    let (vars, kept, dropped) = carried(&scope, &given, &start.code);
    let mut names: Vec<String> = cell_ast
        .iter_functions()
        .map(|f| f.name.to_string())
        .collect();
    names.sort();
    names.dedup();
    // The worker exits right after `done`: freeing the engine and the
    // script's data first would only cost time (and, in a forked worker,
    // pages copied from the fork server just to be freed). A warm-up's are
    // freed, so that the cell after it has their pages at hand.
    if last {
        std::mem::forget((engine, scope, full, cell_ast, given));
    }
    let definitions = if names.is_empty() {
        Vec::new()
    } else {
        vec![Definition {
            names,
            source: start.code.clone(),
        }]
    };
    Done {
        status: DoneStatus::Ok,
        value,
        repr: None,
        vars,
        kept,
        dropped,
        definitions,
        error: None,
        limit: None,
        live: None,
        display: Vec::new(),
        display_dropped: Vec::new(),
    }
}

/// A worker that waits for its cell: run what every cell runs (a `start`
/// frame parsed, the engine built with capability functions, a script
/// compiled and evaluated, its `done` encoded) on a script of our own, so
/// that the code and heap pages this takes are the process's own before the
/// cell's code comes. It calls no capability and writes nothing.
pub(crate) fn warm_up(chan: &Rc<RefCell<Channel>>) {
    const SAMPLE: &str = r#"{"t":"start","language":"rhai",
        "code":"let a = [1, 2]; let m = #{k: \"v\"}; fn f(x) { x + 1 } f(a.len() + m.len())",
        "vars":{"n":1,"s":"x"},
        "capabilities":[{"name":"emit","params":["event"]},{"name":"read_file","params":["path"]}],
        "limits":{"timeout_ms":1000,"max_operations":100000,"max_call_levels":16,
            "max_expr_depth":64,"max_string_bytes":4096,"max_array_len":256,"max_map_len":256},
        "max_frame_bytes":65536}"#;
    if let Ok(ToWorker::Start(start)) = serde_json::from_slice::<ToWorker>(SAMPLE.as_bytes()) {
        let done = evaluate(chan.clone(), &start, false, None);
        let _ = serde_json::to_vec(&FromWorker::Done(Box::new(done)));
    }
}

/// Run one Rhai cell and report it. Returns the worker's exit code.
pub(crate) fn run_cell(
    chan: Rc<RefCell<Channel>>,
    start: Start,
    preloaded: Option<Preloaded>,
) -> i32 {
    let done = evaluate(chan.clone(), &start, true, preloaded);
    let _ = std::io::stdout().flush();
    let mut chan = chan.borrow_mut();
    match chan.send(&FromWorker::Done(Box::new(done))) {
        // Nothing is left to do (stdout was flushed above): end now, without
        // exit handlers or destructors (once let go, if asked to linger).
        Ok(()) => {
            if start.linger {
                chan.wait_closed();
            }
            crate::sandbox::process::exit_now(0)
        }
        Err(e) => {
            // An oversized result (e.g. a huge value) still ends the cell
            // cleanly with an error instead of silence.
            let msg = format!("the cell's result could not be sent: {e}");
            let done = failed(
                DoneStatus::Error,
                ScriptError {
                    kind: "ResultTooLarge".into(),
                    message: msg,
                    ..ScriptError::default()
                },
                Some("frame size".into()),
            );
            match chan.send(&FromWorker::Done(Box::new(done))) {
                Ok(()) => 0,
                Err(_) => 7,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn vars(v: Value) -> Map<String, Value> {
        match v {
            Value::Object(m) => m,
            _ => Map::new(),
        }
    }

    #[test]
    fn names_are_the_words_of_the_text() {
        let given = vars(json!({
            "ab": 1, "b": 2, "abc": 3, "zz": 4, "ü": 5, "ctx": 6, "x1": 7, "ff": 8,
            "in_str": 9, "n": 10, "my-var": 11,
        }));
        let code = "abc + ü.len() // ctx in a comment\n`${in_str}` + 2x1 + 0xff + n";
        let mut found: Vec<&str> = named_in(code, &given).into_iter().collect();
        found.sort();
        // "ab" and "b" are parts of a word, not words; after a digit a
        // word may start anywhere ("x1", "ff": read as if a number ended
        // there).
        assert_eq!(found, ["abc", "ctx", "ff", "in_str", "n", "x1", "ü"]);
        assert!(named_in("1", &given).is_empty());
        // A name that is no identifier is not one a script can name.
        assert!(named_in("my-var", &given).is_empty());
        assert!(named_in("anything", &Map::new()).is_empty());
    }

    #[test]
    fn a_variable_the_cell_does_not_name_is_kept_without_a_look() {
        // The scope holds other values than were given, as if changed: one
        // the code names is sent back; one it does not name is kept (it
        // cannot have changed, so it is not compared).
        let given = vars(json!({"big": "x", "other": [1, 2]}));
        let mut scope = Scope::new();
        scope.push_dynamic("big", Dynamic::from("y".to_owned()));
        scope.push_dynamic("other", Dynamic::from_array(vec![Dynamic::from(1_i64)]));
        let (sent, kept, dropped) = carried(&scope, &given, "other.len()");
        assert_eq!(kept, ["big"]);
        assert_eq!(Value::Object(sent), json!({"other": [1]}));
        assert!(dropped.is_empty());
        let (sent, kept, _) = carried(&scope, &given, "big + other.len()");
        assert!(kept.is_empty());
        assert_eq!(Value::Object(sent), json!({"big": "y", "other": [1]}));
    }

    /// What lets the worker skip a variable the cell does not name: no
    /// script reaches one without naming it. Each of these tries, and the
    /// variables are as they were given afterwards.
    #[test]
    fn no_script_changes_a_variable_without_naming_it() {
        let given = vars(json!({
            "secret": {"k": [1, 2, 3], "s": "text"},
            "plain_text": "abc",
            "count_7": 7,
        }));
        let attempts = [
            // a function does not see its caller's scope, even as a method
            r#"fn f() { this.k = 0; this } let m = #{}; m.f()"#,
            r#"fn g(x) { x.k = 0; } let m = #{k: 1}; g(m); m"#,
            // a name built at run time reaches functions, never variables
            r#"let p = Fn("sec" + "ret"); p.call()"#,
            r#"let c = "plain" + "_text"; call(Fn(c))"#,
            r#"let c = "count" + "_7"; is_def_var(c)"#,
            r#"curry(Fn("sec" + "ret"), 1).call()"#,
            r#"let o = #{}; o.call(Fn("sec" + "ret"))"#,
            // a closure captures only what it names
            r#"let q = 1; let f = || { q += 1; q }; f.call(); f.call()"#,
            // global:: reaches constants only
            r#"fn k() { global::count } k()"#,
            r#"let s = `${"sec"}ret`; s"#,
            // names declared, shadowed in a block and gone
            r#"{ let x = 1; let y = #{}; y.k = 5; } 2"#,
        ];
        let limits = crate::supervisor::Limits::default().script_limits();
        for code in attempts {
            let mut scope = scope_of(&given);
            let engine = hardened_engine(&limits, Instant::now() + Duration::from_secs(5));
            // Failing is fine; changing a variable is not.
            let _ = engine.eval_with_scope::<Dynamic>(&mut scope, code);
            assert!(named_in(code, &given).is_empty(), "{code}");
            for (name, value) in &given {
                let now = scope.get(name).map(|d| to_json(d, 0).ok());
                assert_eq!(now, Some(Some(value.clone())), "{code}: {name}");
            }
            let (sent, kept, dropped) = carried(&scope, &given, code);
            // Only what the cell declared goes back.
            let back = sent.keys().chain(dropped.iter().map(|d| &d.name));
            assert!(back.into_iter().all(|k| !given.contains_key(k)), "{code}");
            assert_eq!(kept, ["secret", "plain_text", "count_7"], "{code}");
        }
    }
}
