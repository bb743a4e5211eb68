"""Start-up cost of the Python shim beside a bare interpreter (not a test).

    /usr/bin/python3 tests/python/bench_startup.py [runs]

Interleaves, in one run, the same spawn path (empty environment, fd 3 a
socketpair) for:
  bare         python3 -I -S -c pass
  shim         python3 -I -S -B -c <shim>, a `pass` cell through the full
               protocol (start frame in, done frame out)
  precompiled  python3 -I -S -B -c <loader.py> PATH, PATH holding the
               shim's --precompile output: no shim source compiled per cell
and prints p50/p99 and the ratios to bare.
"""

import fcntl
import os
import socket
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

PY = harness.PYTHON
def spawn(argv):
    """Spawn with fd 3 = the child's end of a socketpair, placed at 3 in
    this process only around the spawn (moved up first so nothing collides)."""
    parent, child = socket.socketpair()
    moved = fcntl.fcntl(child.fileno(), fcntl.F_DUPFD_CLOEXEC, 100)
    child.close()
    saved = fcntl.fcntl(3, fcntl.F_DUPFD_CLOEXEC, 100) if _fd_open(3) else None
    try:
        os.dup2(moved, 3)
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, env={}, pass_fds=(3,), cwd="/tmp")
    finally:
        os.close(3)
        os.close(moved)
        if saved is not None:
            os.dup2(saved, 3, inheritable=False)
            os.close(saved)
    return proc, parent


def _fd_open(fd):
    try:
        os.fstat(fd)
        return True
    except OSError:
        return False


def bare():
    proc, sock = spawn([PY, "-I", "-S", "-c", "pass"])
    proc.wait()
    sock.close()


def run_pass_cell(argv):
    proc, sock = spawn(argv)
    harness.write_frame(sock, harness.start_frame("pass"))
    done = harness.read_frame(sock, harness.DEFAULT_MAX_FRAME)
    assert done["t"] == "done" and done["status"] == "ok", done
    proc.wait()
    sock.close()


def shim():
    run_pass_cell([PY, "-I", "-S", "-B", "-c", harness.SHIM])


def precompiled():
    run_pass_cell([PY, "-I", "-S", "-B", "-c", harness.LOADER, harness.blob_path()])


def main():
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 100
    cases = [("bare -I -S -c pass", bare), ("shim, pass cell", shim), ("shim precompiled, pass cell", precompiled)]
    samples = {name: [] for name, _ in cases}
    for _, fn in cases:
        fn()
    for _ in range(runs):
        for name, fn in cases:
            t = time.perf_counter()
            fn()
            samples[name].append((time.perf_counter() - t) * 1000)
    base = statistics.median(samples[cases[0][0]])
    for name, _ in cases:
        xs = sorted(samples[name])
        p50 = statistics.median(xs)
        p99 = xs[min(len(xs) - 1, int(len(xs) * 0.99))]
        print("%-30s p50 %6.2f ms  p99 %6.2f ms  %.2fx bare" % (name, p50, p99, p50 / base))


if __name__ == "__main__":
    main()
