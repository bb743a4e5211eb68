# attack: fs_proc_self_mem_write
# category: filesystem
# attempts: open /proc/self/mem read-write and patch the process's own memory through it (a classic seccomp/W^X bypass primitive)
# expect: open for writing fails with EACCES (Landlock) or EPERM
# control: no
# canaries: none
import ctypes
import errno


def report(kind, detail):
    print("ATTACK-RESULT:", kind, detail, flush=True)


buf = ctypes.create_string_buffer(b"original", 16)
try:
    with open("/proc/self/mem", "r+b", buffering=0) as mem:
        mem.seek(ctypes.addressof(buf))
        mem.write(b"patched!")
    if buf.value == b"patched!":
        report("escaped", "patched own memory through /proc/self/mem")
    else:
        report("blocked", "write accepted but memory unchanged")
except OSError as e:
    report("blocked", errno.errorcode.get(e.errno, str(e.errno)))
