//! Code of Python cells that take over the runtime shim they run in (its
//! globals are one `__globals__` away, through any function it gives the
//! cell), shared by the integration suite and the security suite. Each
//! forks children that hold a file whose name contains `token` open, so
//! the host can find them (and what can still run) in `/proc`.

// Each crate that includes this file uses what it needs of it.
#![allow(dead_code)]

/// A live session's state loop taken over: every state process from then
/// on arms a timer that, every 50 ms, forks a child holding a file named
/// `token` open (at most 20) and spins the CPU for 30 ms, around the real
/// loop, which it still runs (so the session goes on answering). The
/// cell's value is `"hijacked"`.
pub fn state_loop_code(token: &str) -> String {
    format!(
        r#"import os, signal, time
G = call.__globals__
serve = G["_state_serve"]
forked = []
busy = []

def spin(signum, frame):
    if busy:
        return
    busy.append(1)
    if len(forked) < 20:
        pid = os.fork()
        if pid == 0:
            f = open({token:?}, "w")
            while True:
                time.sleep(0.01)
        forked.append(pid)
    t = time.monotonic()
    while time.monotonic() - t < 0.03:
        pass
    busy.pop()

def hijacked():
    signal.signal(signal.SIGALRM, spin)
    signal.setitimer(signal.ITIMER_REAL, 0.05, 0.05)
    serve()

G["_state_serve"] = hijacked
"hijacked"
"#
    )
}

/// A cell without a state process (sessionless, warm or fresh) that takes
/// over the shim's frame sender and its exit: when the shim sends the
/// cell's `done`, the sender forks a child first (holding `<token>-done`
/// open) and writes its pid into the answer, sends it, and then never
/// returns, forking a child (`<token>-later`) every 20 ms (at most 20);
/// `posix._exit`, which the shim calls last, sleeps instead. While the
/// cell runs it forks one child of its own (`<token>-cell`). Its answer's
/// value is `"hijacked, forked PID at done"`: the sender ran.
pub fn shim_sender_code(token: &str) -> String {
    format!(
        r#"import os, posix, signal, time
G = call.__globals__
send = G["_send"]
forked = []

def holder(what):
    if len(forked) >= 20:
        return 0
    pid = os.fork()
    if pid == 0:
        signal.setitimer(signal.ITIMER_REAL, 0)
        f = open({token:?} + "-" + what, "w")
        while True:
            time.sleep(0.01)
    forked.append(pid)
    return pid

def hijacked(data):
    if not bytes(data).startswith(b'{{"t":"done"'):
        return send(data)
    pid = holder("done")
    send(bytes(data).replace(b'"hijacked"', b'"hijacked, forked %d at done"' % pid, 1))
    # The answer is out: fork on a timer from now on, and never leave.
    signal.signal(signal.SIGALRM, lambda signum, frame: holder("later"))
    signal.setitimer(signal.ITIMER_REAL, 0.02, 0.02)
    while True:
        time.sleep(0.01)

G["_send"] = hijacked
posix._exit = lambda code: time.sleep(60)
holder("cell")
time.sleep(0.3)
"hijacked"
"#
    )
}
