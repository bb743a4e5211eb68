# attack: proc_exec_shell
# category: process
# attempts: run /bin/sh through subprocess (fork + execve) and through os.posix_spawn
# expect: execve fails with EACCES (Landlock execute) or EPERM (seccomp); no shell output appears
# control: yes
# canaries: none
import errno
import os
import subprocess


def report(kind, detail):
    print("ATTACK-RESULT:", kind, detail, flush=True)


denials = []
try:
    out = subprocess.run(["/bin/sh", "-c", "echo SHELL-$((6*7))"], capture_output=True, timeout=5).stdout
    if b"SHELL-42" in out:
        report("escaped", "ran /bin/sh via subprocess")
    else:
        denials.append("subprocess:no-output")
except OSError as e:
    denials.append("subprocess:" + errno.errorcode.get(e.errno, str(e.errno)))
except Exception as e:
    denials.append("subprocess:" + type(e).__name__)
if denials:
    try:
        pid = os.posix_spawn("/bin/sh", ["sh", "-c", "exit 42"], {})
        _, status = os.waitpid(pid, 0)
        if os.waitstatus_to_exitcode(status) == 42:
            report("escaped", "ran /bin/sh via posix_spawn")
        else:
            report("blocked", " ".join(denials) + " posix_spawn:status %d" % status)
    except OSError as e:
        report("blocked", " ".join(denials) + " posix_spawn:" + errno.errorcode.get(e.errno, str(e.errno)))
