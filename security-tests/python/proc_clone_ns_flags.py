# attack: proc_clone_ns_flags
# category: process
# attempts: raw clone(2) with CLONE_NEWUSER|CLONE_NEWNET (a fork into fresh namespaces, bypassing unshare filters)
# expect: EPERM (seccomp denies clone with namespace flags)
# control: yes
# canaries: none
import ctypes
import errno
import os


def report(kind, detail):
    print("ATTACK-RESULT:", kind, detail, flush=True)


libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
CLONE_NEWUSER, CLONE_NEWNET, SIGCHLD = 0x10000000, 0x40000000, 17
pid = libc.syscall(ctypes.c_long(56), ctypes.c_ulong(CLONE_NEWUSER | CLONE_NEWNET | SIGCHLD), None, None, None, None)
if pid == 0:
    os._exit(0)
if pid > 0:
    os.waitpid(pid, 0)
    report("escaped", "clone with namespace flags created a child")
else:
    e = ctypes.get_errno()
    report("blocked", errno.errorcode.get(e, str(e)))
