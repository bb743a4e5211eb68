# attack: proc_daemon_setsid
# category: process
# attempts: double-fork with setsid so a grandchild outlives the cell; it tags itself with the run marker (comm and argv) and lives 25 s
# expect: fork fails, or the daemon dies with the cell (PID namespace teardown / process-group kill); the harness finds no survivor
# control: no
# canaries: none
# status: ok
import os
import sys
import time

try:
    pid = os.fork()
    if pid == 0:
        os.setsid()
        if os.fork() != 0:
            os._exit(0)
        try:
            with open("/proc/self/comm", "w") as f:
                f.write("{{MARKER}}"[:15])
        except OSError:
            pass
        for fd in (0, 1, 2):
            try:
                os.close(fd)
            except OSError:
                pass
        try:
            os.execv(sys.executable, [sys.executable, "-S", "-c", "import time; time.sleep(25)", "{{MARKER}}"])
        except OSError:
            time.sleep(25)
        os._exit(0)
    os.waitpid(pid, 0)
    print("ATTACK-RESULT: attempted daemon started; the survivor check decides", flush=True)
except OSError as e:
    print("ATTACK-RESULT: blocked fork:", e.strerror, flush=True)
