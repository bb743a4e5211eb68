# cellbox Python zygote: run in the shim's globals by
#     python3 -I -S -B -c <shim.py> --zygote <this file> <config JSON>
# after the worker stage applied the pool-wide sandbox layers. fd 3 is a
# SOCK_SEQPACKET control channel to the supervisor (one JSON object per
# packet, tag "op", fds as SCM_RIGHTS; see src/sandbox/zygote.rs).
#
# The zygote never runs cell code. Per `spawn` it forks a child that
# tightens (own session, fds 0-3 only, per-cell rlimits, its scratch dir as
# cwd/HOME/TMPDIR, its own nested Landlock domain from the ruleset fd the
# supervisor built, the stacked cell seccomp filter) and then runs the shim's
# _main() exactly like a cold cell. The zygote reaps its children, kills each
# child's process group before reaping it, and reports how each ended.
import _socket
import resource
import select
import ctypes

_ZC = _loads(_ZYGOTE_CONFIG)
_CTL = _socket.socket(fileno=_FD)
_EXIT_SANDBOX = _ZC["exit_sandbox"]
_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long
_libc.prctl.restype = ctypes.c_int
_filter_bytes = bytes.fromhex(_ZC["cell_filter"])


class _Fprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


_filter_buf = ctypes.create_string_buffer(_filter_bytes, len(_filter_bytes))
_fprog = _Fprog(len(_filter_bytes) // 8, ctypes.addressof(_filter_buf))
# Each per-cell rlimit: its key in a cell's setup and its resource, as the
# supervisor names them (src/plan/rlimits.rs).
_RLIMITS = [(name, getattr(resource, res)) for name, res in _ZC["rlimits"]]
_ANC_SPACE = _socket.CMSG_SPACE(16 * 4)


def _preload():
    """The profile's package paths on sys.path and its `preload` modules
    imported once, so that every cell forked later finds them ready. A
    module that fails to import is reported and left out: a cell that
    imports it sees the error itself."""
    paths = _ZC.get("python_paths") or []
    if not paths:
        return
    import os

    _install_backend()
    for k, v in _PACKAGE_ENV:
        os.environ.setdefault(k, v)
    for p in paths:
        if p not in sys.path:
            sys.path.append(p)
    for name in _ZC.get("preload") or []:
        try:
            __import__(name)
        except BaseException as e:
            posix.write(2, ("cellbox zygote: failed to preload %s: %s: %s\n" % (name, type(e).__name__, _clean(str(e)))).encode("utf-8", "replace"))


_preload()


# How a cell ended is measured and reported without a Python object holding
# it: wait4 fills these buffers, snprintf writes the report from them, and
# all are zeroed once it is sent (with a second, all-zero report through the
# same calls, for the stack slots they used), so no later cell finds another
# cell's figures in the memory it was forked with.
class _Timeval(ctypes.Structure):
    _fields_ = [("sec", ctypes.c_long), ("usec", ctypes.c_long)]


class _Rusage(ctypes.Structure):
    _fields_ = [("utime", _Timeval), ("stime", _Timeval), ("maxrss", ctypes.c_long)] + [
        ("_more%d" % i, ctypes.c_long) for i in range(13)
    ]


_ru = _Rusage()
_wstatus = ctypes.c_int()
_wpid = ctypes.c_int()
_REPORT_CAP = 512
_report = ctypes.create_string_buffer(_REPORT_CAP)
_ru_fields = [ctypes.c_long.from_buffer(_ru, off) for off in (0, 8, 16, 24, 32)]
_zero_fields = [ctypes.c_long(0) for _ in _ru_fields]
_ENDED = b'{"op":"ended","pid":%d,"status":%d,"utime":[%ld,%ld],"stime":[%ld,%ld],"max_rss_kb":%ld}'
_libc.wait4.restype = ctypes.c_int
_libc.snprintf.restype = ctypes.c_int


def _zsys(nr, *args):
    if _libc.syscall(ctypes.c_long(nr), *args) < 0:
        e = ctypes.get_errno()
        raise OSError(e, posix.strerror(e))


def _zsend(obj, fds=()):
    anc = []
    if fds:
        payload = b"".join(fd.to_bytes(4, sys.byteorder, signed=True) for fd in fds)
        anc.append((_socket.SOL_SOCKET, _socket.SCM_RIGHTS, payload))
    _CTL.sendmsg([_dumps(obj).encode("utf-8")], anc)


def _fds_of(anc):
    """The fds of a recvmsg's ancillary data (SCM_RIGHTS)."""
    fds = []
    for level, kind, payload in anc:
        if level == _socket.SOL_SOCKET and kind == _socket.SCM_RIGHTS:
            n = len(payload) - len(payload) % 4
            fds.extend(int.from_bytes(payload[i : i + 4], sys.byteorder, signed=True) for i in range(0, n, 4))
    return fds


def _zrecv():
    """(message dict or None at EOF, fds)."""
    data, anc, flags, _ = _CTL.recvmsg(65536, _ANC_SPACE, _socket.MSG_CMSG_CLOEXEC)
    fds = _fds_of(anc)
    if flags & (_socket.MSG_TRUNC | _socket.MSG_CTRUNC):
        for fd in fds:
            posix.close(fd)
        raise ValueError("a truncated control message")
    if not data:
        return None, fds
    msg = _loads(data.decode("utf-8"))
    if type(msg) is not dict:
        raise ValueError("a control message is not an object")
    return msg, fds


def _read_setup(fd):
    """The cell's own setup ({scratch, rlimits, state?, waits?}), read from the pipe the
    supervisor filled: only ever in the child, after the fork, so the
    zygote (and every later cell) never holds it."""
    chunks = []
    while True:
        b = posix.read(fd, 65536)
        if not b:
            break
        chunks.append(b)
        if sum(len(c) for c in chunks) > 65536:
            raise ValueError("an oversized cell setup")
    setup = _loads(b"".join(chunks).decode("utf-8"))
    if type(setup) is not dict or type(setup.get("rlimits")) is not dict:
        raise ValueError("a malformed cell setup")
    return setup


def _child(fds):
    """In the forked child: tighten, then run the cell. Never returns."""
    try:
        _signal.set_wakeup_fd(-1)
        _signal.signal(_signal.SIGCHLD, _signal.SIG_DFL)
        _CTL.detach()  # fd 3 is about to become the cell's protocol socket
        # Into the cell's cgroups first (the `tasks` or, under cgroup v2,
        # `cgroup.procs` files after the five):
        # this single thread moves itself, which the kernel does without the
        # global lock a move by pid takes.
        for fd in fds[5:]:
            if posix.write(fd, b"0") != 1:
                raise OSError("could not join the cell's cgroup")
            posix.close(fd)
        fds = fds[:5]
        posix.setsid()
        null = posix.open("/dev/null", posix.O_RDONLY)
        sock, out, err, rules, setup_fd = fds
        if min(null, sock, out, err, rules, setup_fd) < 5:
            raise OSError("unexpected fd layout")
        msg = _read_setup(setup_fd)
        for src, dst in ((null, 0), (out, 1), (err, 2), (sock, _FD), (rules, 4)):
            posix.dup2(src, dst)
        posix.closerange(5, 1 << 20)
        rl = msg["rlimits"]
        for name, res in _RLIMITS:
            v = rl[name]
            if type(v) is not int or v < 0:
                raise ValueError("bad rlimit " + name)
            hard = v + 1 if res == resource.RLIMIT_CPU else v
            # Above the zygote's own hard limit is clamped to it, never
            # raised (as the worker's rlimits layer does).
            top = resource.getrlimit(res)[1]
            if top != resource.RLIM_INFINITY:
                v, hard = min(v, top), min(hard, top)
            else:
                v = resource.RLIM_INFINITY if v >= 1 << 63 else v
                hard = resource.RLIM_INFINITY if hard >= 1 << 63 else hard
            resource.setrlimit(res, (v, hard))
        scratch = msg["scratch"]
        if type(scratch) is not str or not scratch.startswith("/"):
            raise ValueError("bad scratch dir")
        # Its own nested Landlock domain, then the stacked cell filter
        # (which refuses landlock_restrict_self, so the order matters).
        _zsys(_ZC["nr_landlock_restrict_self"], ctypes.c_long(4), ctypes.c_long(0))
        posix.close(4)
        _zsys(_ZC["nr_seccomp"], ctypes.c_long(1), ctypes.c_long(0), ctypes.byref(_fprog))
        posix.chdir(scratch)
        import os

        os.environ["HOME"] = scratch
        os.environ["TMPDIR"] = scratch
        sys.path.append(scratch)  # modules in the scratch dir, after the stdlib
    except BaseException as e:
        try:
            posix.write(2, ("cellbox zygote: failed to prepare the cell: %s\n" % _clean(str(e))).encode("utf-8", "replace"))
        finally:
            posix._exit(_EXIT_SANDBOX)
    if msg.get("state") is True:
        _state_main()
    _st["waits"] = msg.get("waits") is True
    _main()
    posix._exit(0)


# ---------------------------------------------------------------- state processes
#
# A session's live namespace is kept in a **state process**: forked from
# the zygote like a cell (same layers: the session's scratch dir and
# limits), but instead of running a cell it serves its own control channel
# (fd 3, SOCK_SEQPACKET, the zygote's framing):
#
# - `run {id, rlimits}` with four fds (the cell's protocol socket, stdout,
#   stderr, and the control channel of the next state process): it forks
#   the cell's process, which runs the cell in the live namespace. If the
#   cell succeeds, that process becomes the session's next state process
#   once it has reported `done` (on the fd it was given; it says
#   `ready {pid}` there), or, when it may not (see `_live_may_become`),
#   forks it before reporting `done` and exits as any cell does. If the
#   cell fails, times out or is killed, neither happens: this state
#   process, untouched, stays the session's state.
#   When the supervisor holds none of this state process's spares (see
#   `_live_prefork`), the cell's process is forked when the cell comes.
# - `clone {id}` with one fd: fork a copy of this state process that
#   serves that channel (a checkpoint, or a restore from one).
# - `prefork {id}`: fork the next cell's process ahead (its spare, see
#   `_live_prefork`), answered `spawned {id, pid}` with the spare's channel.
# - replies: `spawned {id, pid}`, `error {id, message}`, `ended {pid, ...}`
#   (as the zygote reports its children). Nothing is sent unasked.
#
# A state process runs cell code (the session's own), so the supervisor
# trusts nothing it says beyond that session: pids are looked up in the
# session's cgroup, an answer to a request never made closes the channel,
# every report only ever decides that session's result, and between cells
# the session is frozen (after its spare has warmed up).


class _NewState(BaseException):
    """Raised in a fresh fork that is to serve as a state process (a
    successor made by a cell that succeeded, or a checkpoint's copy): it
    unwinds the stack it was forked with (the previous state process's loop
    and the cell's frames) back to `_state_main`, so a session's hundredth
    state process runs as shallow a stack as its first."""


def _state_main():
    """Serve a state process's control channel on fd 3. Never returns."""
    while True:
        try:
            _state_serve()
        except _NewState:
            continue
        except BaseException:
            posix._exit(_EXIT_SANDBOX)


def _state_serve():
    """One state process's loop; `_NewState` leaves it for the next."""
    global _CTL
    _st["live"] = True
    # A spare of the state process this one was forked from is not ours.
    _st.pop("spare", None)
    _CTL = _socket.socket(fileno=_FD)
    posix.set_inheritable(_FD, False)
    if "rl0" not in _st:
        _st["rl0"] = [(res, resource.getrlimit(res)) for _, res in _RLIMITS]
    else:
        for res, (soft, hard) in _st["rl0"]:
            try:
                resource.setrlimit(res, (soft, resource.getrlimit(res)[1]))
            except (OSError, ValueError):
                pass
    wake_r, wake_w = posix.pipe()
    posix.set_blocking(wake_r, False)
    posix.set_blocking(wake_w, False)
    _st["wake"] = (wake_r, wake_w)
    _signal.set_wakeup_fd(wake_w)
    _signal.signal(_signal.SIGCHLD, lambda signum, frame: None)
    # Every object the namespace holds now is left alone by the cyclic
    # collector (gc.freeze): a cell forked from here that collects would
    # otherwise touch each one and copy the whole heap page by page.
    # Cycles that become garbage later are kept until the session ends.
    import gc

    gc.freeze()
    _zsend({"op": "ready", "pid": posix.getpid()})
    poller = select.poll()
    poller.register(_FD, select.POLLIN)
    poller.register(wake_r, select.POLLIN)
    cells = {}
    while True:
        events = poller.poll()
        for fd, ev in events:
            if fd == wake_r:
                try:
                    while posix.read(wake_r, 512):
                        pass
                except BlockingIOError:
                    pass
                continue
            msg, fds = _zrecv()
            if msg is None:
                # Its spare, if any, is among its cells.
                for pid in cells:
                    try:
                        posix.kill(pid, _signal.SIGKILL)
                    except OSError:
                        pass
                posix._exit(0)
            op = msg.get("op")
            if op == "run":
                _live_run(msg, fds, cells)
            elif op == "clone":
                _live_clone(msg, fds)
            elif op == "prefork":
                for f in fds:
                    posix.close(f)
                _live_prefork(msg, cells)
            else:
                for f in fds:
                    posix.close(f)
        _reap(cells)
        if _st.get("spare") is not None and _st["spare"] not in cells:
            _st.pop("spare", None)


def _live_forked():
    """In a fresh fork of a state process: its signal plumbing is not ours."""
    _signal.set_wakeup_fd(-1)
    _signal.signal(_signal.SIGCHLD, _signal.SIG_DFL)
    for fd in _st.pop("wake", ()):
        posix.close(fd)
    _CTL.detach()


def _live_run(msg, fds, cells):
    cid = msg.get("id")
    rl = msg.get("rlimits")
    if type(cid) is not int or len(fds) != 4 or type(rl) is not dict:
        for fd in fds:
            posix.close(fd)
        _zsend({"op": "error", "id": cid if type(cid) is int else 0, "message": "a malformed run message"})
        return
    pid = posix.fork()
    if pid == 0:
        _live_forked()
        _live_cell(rl, fds)
    for fd in fds:
        posix.close(fd)
    cells[pid] = cid
    _zsend({"op": "spawned", "id": cid, "pid": pid})


def _live_cell(rl, fds):
    """In the process of one cell, forked from a state process: take the
    cell's fds (protocol socket, stdout, stderr, the next state process's
    channel) and limits, run it. Never returns."""
    try:
        sock, out, err, nxt = fds
        posix.dup2(out, 1)
        posix.dup2(err, 2)
        posix.dup2(sock, _FD)
        for fd in (sock, out, err):
            if fd not in (1, 2, _FD):
                posix.close(fd)
        posix.set_inheritable(nxt, False)
        _st["next_ctl"] = nxt
        if not _st.get("fork_hook"):
            # Once per line of state processes (forks inherit it).
            posix.register_at_fork(after_in_child=_live_drop_next)
            _st["fork_hook"] = True
        # The cell's own limits, as soft limits under the session's
        # (the next state process takes the session's back).
        for name, res in _RLIMITS:
            v = rl.get(name)
            if type(v) is int and v >= 0:
                hard = resource.getrlimit(res)[1]
                if hard != resource.RLIM_INFINITY:
                    v = min(v, hard)
                elif v >= 1 << 63:
                    v = resource.RLIM_INFINITY
                resource.setrlimit(res, (v, hard))
    except BaseException as e:
        try:
            posix.write(2, ("cellbox: failed to prepare the cell: %s\n" % _clean(str(e))).encode("utf-8", "replace"))
        finally:
            posix._exit(_EXIT_SANDBOX)
    _main()
    posix._exit(0)


# Once a cell is over, the supervisor asks the state process to fork its
# next cell's process ahead of time (its **spare**, `prefork`), so that a
# cell does not wait for a fork of the whole namespace, and is answered
# with the spare's channel: the supervisor sends the spare the cell's fds
# and limits itself, so that this process, whose pages the spare now
# shares, runs nothing on the cell's way (each page it wrote would be
# copied first). The spare warms up, says `warm` on its channel (the
# supervisor then freezes the session until the cell comes), and runs the
# cell as a cell forked then would. A spare is a child of its state
# process and one of its cells (its end is reported); it exits when the
# supervisor lets go of its channel. Where the supervisor holds no spare
# (a cell came before, a fork refused, a spare gone), it asks this process
# to `run` the cell, which is forked then.


def _live_prefork(msg, cells):
    cid = msg.get("id")
    if type(cid) is not int:
        _zsend({"op": "error", "id": 0, "message": "a malformed prefork message"})
        return
    try:
        ours, theirs = _socket.socketpair(_socket.AF_UNIX, _socket.SOCK_SEQPACKET)
    except OSError as e:
        _zsend({"op": "error", "id": cid, "message": "socketpair failed: %s" % e})
        return
    try:
        pid = posix.fork()
    except OSError as e:
        ours.close()
        theirs.close()
        _zsend({"op": "error", "id": cid, "message": "fork failed: %s" % e})
        return
    if pid == 0:
        try:
            ours.close()
            _live_forked()
            _st.pop("spare", None)
            # Not the state process's channel: its end is its own.
            posix.close(_FD)
            _live_warm_up()
            theirs.send(b'{"op":"warm"}')
            data, anc, flags, _ = theirs.recvmsg(4096, _ANC_SPACE, _socket.MSG_CMSG_CLOEXEC)
            fds = _fds_of(anc)
            theirs.close()
            if not data or len(fds) != 4 or flags & (_socket.MSG_TRUNC | _socket.MSG_CTRUNC):
                posix._exit(0)
            rl = _loads(data.decode("utf-8"))
            if type(rl) is not dict:
                posix._exit(_EXIT_SANDBOX)
        except BaseException:
            posix._exit(_EXIT_SANDBOX)
        _live_cell(rl, fds)
    theirs.close()
    cells[pid] = cid
    _st["spare"] = pid
    try:
        _zsend({"op": "spawned", "id": cid, "pid": pid}, (ours.fileno(),))
    except OSError:
        try:
            posix.kill(pid, _signal.SIGKILL)
        except OSError:
            pass
    ours.close()


def _live_warm_up():
    """In a spare, before its cell comes: what every cell runs, on a cell of
    its own outside the session's namespace (see `_warm_up`), so that the
    pages of the interpreter and the shim this writes, shared with the
    state process until then, are copied now rather than on the cell's way.
    The namespace's own objects are left alone: only a cell that uses them
    copies their pages."""
    saved = {k: _st.pop(k) for k in ("live", "live_module") if k in _st}
    try:
        _warm_up()
    finally:
        _st.update(saved)


def _live_clone(msg, fds):
    cid = msg.get("id")
    if type(cid) is not int or len(fds) != 1:
        for fd in fds:
            posix.close(fd)
        _zsend({"op": "error", "id": cid if type(cid) is int else 0, "message": "a malformed clone message"})
        return
    pid = posix.fork()
    if pid == 0:
        try:
            _live_forked()
            posix.dup2(fds[0], _FD)
            posix.close(fds[0])
        except BaseException:
            posix._exit(_EXIT_SANDBOX)
        raise _NewState()
    posix.close(fds[0])


def _live_drop_next():
    """In any child a cell forks (os.fork, multiprocessing): the channel of
    the session's next state process is not its to hold (a holder other
    than the successor keeps the supervisor waiting for it to say ready)."""
    nxt = _st.pop("next_ctl", None)
    if nxt is not None:
        try:
            posix.close(nxt)
        except OSError:
            pass



def _live_keep():
    """In a cell's process whose cell succeeded, before it reports `done`:
    make sure the session's next state process will hold the namespace as
    the cell left it. Either this process becomes it, once `done` is sent
    (True: see `_live_become`), or it forks it now, and exits as any cell
    does."""
    nxt = _st.get("next_ctl")
    if nxt is None:
        return False
    if _live_may_become():
        return True
    _st.pop("next_ctl", None)
    try:
        pid = posix.fork()
    except OSError:
        pid = -1
    if pid:
        posix.close(nxt)
        return
    _serve_next(nxt)


# A cell's process that succeeded serves as the session's next state
# process itself, without forking one (a fork copies the page tables of the
# whole namespace, and the cell's exit unmaps its copy: both grow with the
# session), when nothing it carries differs from what a fork would give:
# - one thread (fork keeps only the calling one; a thread left running
#   would go on running the session's code between cells);
# - no children, not even exited ones (a state process's children are
#   spared when what a cell left is ended: they are its spare);
# - less than half of the session's CPU-time limit used (RLIMIT_CPU counts
#   a process's whole life; each later cell is a fresh fork, so only this
#   one cell's time and the state's own idle work count against it);
# and its interval timers are disarmed (a fork's are). Its cell's limits
# (soft, under the session's) are put back by `_state_serve`, its stdout,
# stderr and protocol socket are closed, and it stays in the session's
# group, where it ran. Otherwise it forks the successor as before.


def _live_may_become():
    try:
        fd = posix.open("/proc/self/stat", posix.O_RDONLY)
        try:
            stat = posix.read(fd, 4096)
        finally:
            posix.close(fd)
        fields = stat[stat.rindex(b")") + 2 :].split()
        if int(fields[17]) != 1:  # num_threads
            return False
    except (OSError, ValueError, IndexError):
        return False
    try:
        if posix.waitid(posix.P_ALL, 0, posix.WEXITED | posix.WNOHANG | posix.WNOWAIT) is not None:
            return False
    except ChildProcessError:
        pass
    except OSError:
        return False
    else:
        return False
    limit = resource.getrlimit(resource.RLIMIT_CPU)[1]
    for res, (soft, hard) in _st.get("rl0") or ():
        if res == resource.RLIMIT_CPU:
            limit = soft
    if limit != resource.RLIM_INFINITY:
        used = resource.getrusage(resource.RUSAGE_SELF)
        if (used.ru_utime + used.ru_stime) * 2 >= limit:
            return False
    return True


def _live_become():
    """After `done` is sent by a cell's process that `_live_keep` found fit:
    become the session's next state process. Never returns."""
    nxt = _st.pop("next_ctl", None)
    try:
        for which in (_signal.ITIMER_REAL, _signal.ITIMER_VIRTUAL, _signal.ITIMER_PROF):
            _signal.setitimer(which, 0)
    except BaseException:
        posix._exit(_EXIT_SANDBOX)
    _serve_next(nxt)


def _serve_next(nxt):
    """Become the session's next state process on channel `nxt`: the
    standard streams on /dev/null, the channel on the protocol fd. Never
    returns."""
    try:
        try:
            null = posix.open("/dev/null", posix.O_RDWR)
        except OSError:
            null = posix.dup(0)
        for fd in (0, 1, 2):
            posix.dup2(null, fd)
        posix.close(null)
        posix.dup2(nxt, _FD)
        posix.close(nxt)
    except BaseException:
        posix._exit(_EXIT_SANDBOX)
    raise _NewState()


def _spawn(msg, fds, cells):
    cid = msg.get("id")
    # Five, then the cgroup files it joins: three under cgroup v1 (memory,
    # pids, cpuacct) and the session's freezer group for a state process,
    # one under v2 (where a session is frozen through its own group).
    if type(cid) is not int or len(fds) not in (5, 6, 8, 9):
        for fd in fds:
            posix.close(fd)
        _zsend({"op": "error", "id": cid if type(cid) is int else 0, "message": "a malformed spawn message"})
        return
    for stream in (_STDOUT, _STDERR):
        stream.flush()
    pid = posix.fork()
    if pid == 0:
        _child(fds)
    for fd in fds:
        posix.close(fd)
    cells[pid] = cid
    if msg.get("state") is True:
        _states.add(pid)
    try:
        pidfd = posix.pidfd_open(pid)
    except OSError as e:
        posix.kill(pid, _signal.SIGKILL)
        _zsend({"op": "error", "id": cid, "message": "pidfd_open failed: %s" % e})
        return
    try:
        _zsend({"op": "spawned", "id": cid, "pid": pid}, (pidfd,))
    finally:
        posix.close(pidfd)


# The zygote's children that are a session's first state process.
_states = set()


def _reap(cells):
    while True:
        try:
            info = posix.waitid(posix.P_ALL, 0, posix.WEXITED | posix.WNOHANG | posix.WNOWAIT)
        except ChildProcessError:
            return
        if info is None or not info.si_pid:
            return
        pid = info.si_pid
        if pid in cells and pid not in _states:
            # Whatever the cell left in its group goes first; the leader is
            # still unreaped, so its pid and group id are not reused yet.
            # Not for a session's first state process: the later ones,
            # forked from its cells, share its group and outlive it (the
            # supervisor ends what a live cell leaves, and a session's
            # processes with its cgroup).
            try:
                posix.killpg(pid, _signal.SIGKILL)
            except OSError:
                pass
        _states.discard(pid)
        if cells.pop(pid, None) is None:
            posix.waitpid(pid, 0)
            continue  # an orphan a cell left behind
        _wpid.value = pid
        try:
            if _libc.wait4(_wpid, ctypes.byref(_wstatus), 0, ctypes.byref(_ru)) < 0:
                continue
            n = _libc.snprintf(_report, _REPORT_CAP, _ENDED, _wpid, _wstatus, *_ru_fields)
            if 0 < n < _REPORT_CAP:
                _CTL.sendmsg([memoryview(_report)[:n]])
        finally:
            ctypes.memset(_report, 0, _REPORT_CAP)
            ctypes.memset(ctypes.byref(_ru), 0, ctypes.sizeof(_ru))
            _wstatus.value = 0
            _libc.snprintf(_report, _REPORT_CAP, _ENDED, _wpid, _wstatus, *_zero_fields)
            ctypes.memset(_report, 0, _REPORT_CAP)


def _quit(cells):
    for pid in cells:
        try:
            posix.killpg(pid, _signal.SIGKILL)
        except OSError:
            pass
    posix._exit(0)


def _zygote():
    # Nothing in this process (and so in no child) can be read or traced by
    # a process of the same uid.
    if _libc.prctl(4, 0, 0, 0, 0) != 0:  # PR_SET_DUMPABLE, 0
        posix._exit(_EXIT_SANDBOX)
    posix.set_inheritable(_FD, False)
    wake_r, wake_w = posix.pipe()
    posix.set_blocking(wake_r, False)
    posix.set_blocking(wake_w, False)
    _signal.set_wakeup_fd(wake_w)
    _signal.signal(_signal.SIGCHLD, lambda signum, frame: None)
    poller = select.poll()
    poller.register(_FD, select.POLLIN)
    poller.register(wake_r, select.POLLIN)
    cells = {}
    # What the zygote holds now (the shim, the preloaded modules) is left
    # alone by the cyclic collector in every child: a child that collects
    # would otherwise write each object's header and copy its pages, in
    # every cell and in every session's state process.
    import gc

    gc.collect()
    gc.freeze()
    # Give back to the kernel the heap pages freed since start-up (the
    # compiler's work on the shim, the imports' temporaries): they would
    # otherwise stay resident in the zygote for its whole life.
    _libc.malloc_trim(0)
    # The supervisor gives this zygote cells from now on: the time its
    # interpreter took to start and import the preloaded modules is not
    # counted against the answer to its first spawn.
    _zsend({"op": "serving"})
    while True:
        events = poller.poll()
        for fd, ev in events:
            if fd == wake_r:
                try:
                    while posix.read(wake_r, 512):
                        pass
                except BlockingIOError:
                    pass
                continue
            try:
                msg, fds = _zrecv()
            except (OSError, ValueError):
                _quit(cells)
            if msg is None:
                _quit(cells)
            if msg.get("op") == "spawn":
                _spawn(msg, fds, cells)
            else:
                for f in fds:
                    posix.close(f)
        _reap(cells)


try:
    _zygote()
except (BrokenPipeError, ConnectionResetError):
    # The supervisor's end is gone: it is shutting down (or gone itself).
    # A normal end, with nothing to say; this PID namespace's cells end
    # with its first process.
    posix._exit(0)
except BaseException as e:
    try:
        posix.write(2, ("cellbox zygote: %s: %s\n" % (type(e).__name__, _clean(str(e)))).encode("utf-8", "replace"))
    finally:
        posix._exit(_EXIT_SANDBOX)
