# attack: proc_kill_victim
# category: process
# attempts: SIGKILL a host process the harness started (and SIGSTOP it, in case kill is filtered by signal)
# expect: ESRCH (PID namespace), EPERM (different uid, Landlock signal scoping, seccomp); the victim lives
# control: yes
# canaries: victim
import errno
import os
import signal


def report(kind, detail):
    print("ATTACK-RESULT:", kind, detail, flush=True)


denials = []
for sig in (signal.SIGSTOP, signal.SIGKILL):
    try:
        os.kill({{VICTIM_PID}}, sig)
        report("escaped", "sent %s to the victim" % sig.name)
        break
    except OSError as e:
        denials.append("%s:%s" % (sig.name, errno.errorcode.get(e.errno, str(e.errno))))
else:
    report("blocked", " ".join(denials))
