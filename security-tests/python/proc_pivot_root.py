# attack: proc_pivot_root
# category: process
# attempts: pivot_root(".", ".") from scratch; scratch is not a mount point, so even a permitted call stops at EINVAL and changes nothing
# expect: EPERM (seccomp, no CAP_SYS_ADMIN) or SIGSYS; any other errno means the permission check was passed
# control: no
# canaries: none
import ctypes
import errno


def report(kind, detail):
    print("ATTACK-RESULT:", kind, detail, flush=True)


libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
r = libc.syscall(ctypes.c_long(155), b".", b".")
e = ctypes.get_errno()
if r == 0:
    report("escaped", "pivot_root succeeded")
elif e in (errno.EPERM, errno.EACCES, errno.ENOSYS):
    report("blocked", errno.errorcode[e])
else:
    report("escaped", "pivot_root passed the permission check (%s)" % errno.errorcode.get(e, str(e)))
