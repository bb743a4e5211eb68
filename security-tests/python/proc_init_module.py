# attack: proc_init_module
# category: process
# attempts: init_module with an empty image and finit_module on fd -1, so even a permitted call loads nothing
# expect: EPERM (seccomp, no CAP_SYS_MODULE), ENOSYS or SIGSYS; any other errno means the permission check was passed
# control: no
# canaries: none
import ctypes
import errno


def report(kind, detail):
    print("ATTACK-RESULT:", kind, detail, flush=True)


libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
results = []
passed = []
for name, call in (
    ("init_module", lambda: libc.syscall(ctypes.c_long(175), None, ctypes.c_ulong(0), b"")),
    ("finit_module", lambda: libc.syscall(ctypes.c_long(313), ctypes.c_int(-1), b"", ctypes.c_int(0))),
):
    r = call()
    e = ctypes.get_errno()
    results.append("%s:%s" % (name, errno.errorcode.get(e, str(e)) if r < 0 else "ok"))
    if r == 0 or e not in (errno.EPERM, errno.EACCES, errno.ENOSYS):
        passed.append(name)
if passed:
    report("escaped", "passed the permission check: " + " ".join(results))
else:
    report("blocked", " ".join(results))
