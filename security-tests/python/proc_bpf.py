# attack: proc_bpf
# category: process
# attempts: bpf(BPF_MAP_CREATE) for a 1-entry array map (the entry point to loading eBPF programs)
# expect: EPERM (seccomp; no CAP_BPF) or SIGSYS
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
attr = ctypes.create_string_buffer(struct.pack("=IIII", 2, 4, 4, 1), 72)  # BPF_MAP_TYPE_ARRAY, key 4, value 4, 1 entry
fd = libc.syscall(ctypes.c_long(321), ctypes.c_int(0), attr, ctypes.c_uint(72))
if fd >= 0:
    os.close(fd)
    report("escaped", "created a BPF map")
else:
    e = ctypes.get_errno()
    report("blocked", errno.errorcode.get(e, str(e)))
