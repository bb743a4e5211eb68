# attack: proc_x32_syscall
# category: process
# attempts: syscalls through the x32 ABI numbering (nr | 0x40000000): getpid, then unshare(CLONE_NEWUSER); a filter that ignores bit 30 would let denied calls through
# expect: ENOSYS/EPERM or SIGSYS for both (x32 numbers are outside any allowlist)
# control: no
# canaries: none
import ctypes
import errno


def report(kind, detail):
    print("ATTACK-RESULT:", kind, detail, flush=True)


libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
X32 = 0x40000000
got = []
denials = []
for name, nr, args in (("getpid", 39, ()), ("unshare", 272, (ctypes.c_ulong(0x10000000),))):
    r = libc.syscall(ctypes.c_long(nr | X32), *args)
    if r >= 0:
        got.append("%s=%d" % (name, r))
    else:
        e = ctypes.get_errno()
        denials.append("%s:%s" % (name, errno.errorcode.get(e, str(e))))
if got:
    report("escaped", "x32 syscalls ran: " + ",".join(got))
else:
    report("blocked", " ".join(denials))
