# attack: proc_kexec_load
# category: process
# attempts: kexec_load and kexec_file_load with invalid flags, so even a permitted call stops at EINVAL and loads nothing
# expect: EPERM (seccomp, no CAP_SYS_BOOT), ENOSYS or SIGSYS; EINVAL means the permission check was passed
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
r = libc.syscall(ctypes.c_long(246), ctypes.c_ulong(0), ctypes.c_ulong(0), None, ctypes.c_ulong(0x0000fff0))
e = ctypes.get_errno()
results.append("kexec_load:" + (errno.errorcode.get(e, str(e)) if r < 0 else "ok"))
if r == 0 or e not in (errno.EPERM, errno.EACCES, errno.ENOSYS):
    passed.append("kexec_load")
r = libc.syscall(ctypes.c_long(320), ctypes.c_int(-1), ctypes.c_int(-1), ctypes.c_ulong(0), None, ctypes.c_ulong(0xfffffff0))
e = ctypes.get_errno()
results.append("kexec_file_load:" + (errno.errorcode.get(e, str(e)) if r < 0 else "ok"))
if r == 0 or e not in (errno.EPERM, errno.EACCES, errno.ENOSYS):
    passed.append("kexec_file_load")
if passed:
    report("escaped", "passed the permission check: " + " ".join(results))
else:
    report("blocked", " ".join(results))
