# attack: proc_perf_event_open
# category: process
# attempts: perf_event_open a software CPU-clock counter on itself (perf is a rich kernel attack surface and side channel)
# expect: EPERM/EACCES (seccomp, perf_event_paranoid) or SIGSYS
# control: yes
# canaries: none
import ctypes
import errno
import os
import struct


def report(kind, detail):
    print("ATTACK-RESULT:", kind, detail, flush=True)


libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
attr = ctypes.create_string_buffer(struct.pack("=IIQ", 1, 128, 0), 128)  # PERF_TYPE_SOFTWARE, size, PERF_COUNT_SW_CPU_CLOCK
fd = libc.syscall(ctypes.c_long(298), attr, ctypes.c_int(0), ctypes.c_int(-1), ctypes.c_int(-1), ctypes.c_ulong(0))
if fd >= 0:
    os.close(fd)
    report("escaped", "opened a perf event")
else:
    e = ctypes.get_errno()
    report("blocked", errno.errorcode.get(e, str(e)))
