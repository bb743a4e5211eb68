# attack: proc_ptrace_supervisor
# category: process
# attempts: PTRACE_ATTACH (then PTRACE_SEIZE) to the supervisor, detaching at once if it worked
# expect: ESRCH (not in the cell's PID namespace), EPERM (seccomp, no CAP_SYS_PTRACE, Landlock scoping)
# control: yes
# canaries: none
import ctypes
import errno
import os


def report(kind, detail):
    print("ATTACK-RESULT:", kind, detail, flush=True)


libc = ctypes.CDLL(None, use_errno=True)
libc.ptrace.restype = ctypes.c_long
PTRACE_ATTACH, PTRACE_DETACH, PTRACE_SEIZE = 16, 17, 0x4206
pid = {{SUPERVISOR_PID}}
denials = []
for req, name in ((PTRACE_ATTACH, "attach"), (PTRACE_SEIZE, "seize")):
    r = libc.ptrace(ctypes.c_long(req), ctypes.c_long(pid), None, None)
    if r == 0:
        if req == PTRACE_ATTACH:
            try:
                os.waitpid(pid, os.WNOHANG | 0x40000000)  # __WALL
            except OSError:
                pass
        libc.ptrace(ctypes.c_long(PTRACE_DETACH), ctypes.c_long(pid), None, None)
        report("escaped", "ptrace %s of the supervisor succeeded" % name)
        break
    e = ctypes.get_errno()
    denials.append("%s:%s" % (name, errno.errorcode.get(e, str(e))))
else:
    report("blocked", " ".join(denials))
