# attack: proc_signal_supervisor
# category: process
# attempts: signal the supervisor (SIGCONT, harmless) and probe it with signal 0
# expect: ESRCH (not in the cell's PID namespace) or EPERM (uid, Landlock signal scoping)
# control: yes
# canaries: none
import errno
import os
import signal


def report(kind, detail):
    print("ATTACK-RESULT:", kind, detail, flush=True)


denials = []
for sig in (0, signal.SIGCONT):
    try:
        os.kill({{SUPERVISOR_PID}}, sig)
        report("escaped", "signal %d delivered to the supervisor" % sig)
        break
    except OSError as e:
        denials.append("%d:%s" % (sig, errno.errorcode.get(e.errno, str(e.errno))))
else:
    report("blocked", " ".join(denials))
