"""Start-up cost of the Python shim beside a bare interpreter (not a test).

    /usr/bin/python3 tests/python/bench_startup.py [runs]

Times, over the same run, a bare `python3 -I -S -c pass`, the same with
`-B -c <shim>` running a `pass` cell through the full protocol (start frame
in, done frame out), and the imports the shim adds.
"""

import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402


def timed(fn, runs):
    samples = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t) * 1000)
    samples.sort()
    return statistics.median(samples), samples[min(len(samples) - 1, int(len(samples) * 0.99))]


def bare():
    subprocess.run([harness.PYTHON, "-I", "-S", "-c", "pass"], check=True, env={})


def shim_cell():
    r = harness.run_cell("pass", capabilities=harness.CAPABILITIES)
    assert r.status == "ok", r


def main():
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 100
    for fn in (bare, shim_cell):
        fn()
    rows = []
    # Interleave so drift on a shared machine hits both alike.
    b, s = [], []
    for _ in range(runs):
        b.append(timed(bare, 1)[0])
        s.append(timed(shim_cell, 1)[0])
    for name, xs in (("bare -I -S -c pass", b), ("shim, pass cell, full protocol", s)):
        xs.sort()
        rows.append((name, statistics.median(xs), xs[min(len(xs) - 1, int(len(xs) * 0.99))]))
    for name, p50, p99 in rows:
        print("%-34s p50 %6.2f ms   p99 %6.2f ms" % (name, p50, p99))
    print("ratio p50: %.2fx" % (rows[1][1] / rows[0][1]))
    out = subprocess.run(
        [harness.PYTHON, "-I", "-S", "-X", "importtime", "-c", "import _json, _ast, _signal, _thread"],
        capture_output=True, text=True, env={},
    ).stderr
    print("imports the shim adds (-X importtime, us):")
    for line in out.splitlines():
        if any(m in line for m in ("_json", "_ast", "_signal", "_thread")):
            print("  " + line)


if __name__ == "__main__":
    main()
