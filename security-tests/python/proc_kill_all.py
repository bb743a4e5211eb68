# attack: proc_kill_all
# category: process
# attempts: kill(-1, SIGCONT): signal every process the cell may signal (harmless signal; the harness keeps stopped victims as root and as nobody and checks they stay stopped)
# expect: the signal reaches only the cell's own processes (PID namespace) or fails with EPERM/ESRCH; no host victim is touched
# control: no
# canaries: victim
import errno
import os
import signal

try:
    os.kill(-1, signal.SIGCONT)
    print("ATTACK-RESULT: attempted kill(-1) returned success; the victims decide", flush=True)
except OSError as e:
    print("ATTACK-RESULT: blocked", errno.errorcode.get(e.errno, str(e.errno)), flush=True)
