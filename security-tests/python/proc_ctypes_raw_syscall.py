# attack: proc_ctypes_raw_syscall
# category: process
# attempts: bypass any Python-level guard with raw syscall(2) through ctypes: socket + connect to the loopback TCP listener + write
# expect: the raw calls fail exactly like the wrapped ones (EPERM from seccomp, EACCES from Landlock, ENETUNREACH); the listener sees nothing
# control: yes
# canaries: tcp
import ctypes
import errno
import socket
import struct


def report(kind, detail):
    print("ATTACK-RESULT:", kind, detail, flush=True)


libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
SYS_socket, SYS_connect, SYS_write = 41, 42, 1
fd = libc.syscall(ctypes.c_long(SYS_socket), ctypes.c_long(2), ctypes.c_long(1), ctypes.c_long(0))
if fd < 0:
    e = ctypes.get_errno()
    report("blocked", "socket:" + errno.errorcode.get(e, str(e)))
else:
    addr = struct.pack("=H", socket.AF_INET) + struct.pack(">H", {{TCP_PORT}}) + socket.inet_aton("127.0.0.1") + b"\0" * 8
    r = libc.syscall(ctypes.c_long(SYS_connect), ctypes.c_long(fd), addr, ctypes.c_long(16))
    if r < 0:
        e = ctypes.get_errno()
        report("blocked", "connect:" + errno.errorcode.get(e, str(e)))
    else:
        msg = b"{{MARKER}} raw\n"
        libc.syscall(ctypes.c_long(SYS_write), ctypes.c_long(fd), msg, ctypes.c_long(len(msg)))
        report("escaped", "raw syscalls connected to 127.0.0.1:{{TCP_PORT}}")
