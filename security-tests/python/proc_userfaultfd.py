# attack: proc_userfaultfd
# category: process
# attempts: userfaultfd(2) and /dev/userfaultfd (used to stall the kernel mid-copy in race exploits)
# expect: EPERM (seccomp) or ENOENT for the device; SIGSYS is also a denial
# control: yes
# canaries: none
import ctypes
import errno
import os


def report(kind, detail):
    print("ATTACK-RESULT:", kind, detail, flush=True)


libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
denials = []
fd = libc.syscall(ctypes.c_long(323), ctypes.c_int(os.O_CLOEXEC | os.O_NONBLOCK))
if fd >= 0:
    os.close(fd)
    report("escaped", "userfaultfd() returned an fd")
else:
    e = ctypes.get_errno()
    denials.append("syscall:" + errno.errorcode.get(e, str(e)))
    try:
        dfd = os.open("/dev/userfaultfd", os.O_RDWR)
        os.close(dfd)
        report("escaped", "opened /dev/userfaultfd")
    except OSError as e:
        denials.append("dev:" + errno.errorcode.get(e.errno, str(e.errno)))
        report("blocked", " ".join(denials))
