# attack: fs_proc1_environ
# category: filesystem
# attempts: read /proc/1/environ (the host init's environment when there is no PID namespace)
# expect: EACCES/EPERM, or pid 1 is the cell's own process with the cell's small fixed environment
# control: no
# canaries: host_files
import errno
import hashlib
import os


def report(kind, detail):
    print("ATTACK-RESULT:", kind, detail, flush=True)


try:
    with open("/proc/1/environ", "rb") as f:
        data = f.read()
    print("DIGEST:" + hashlib.sha256(data).hexdigest())
    names = {e.split(b"=", 1)[0].decode("latin-1") for e in data.split(b"\0") if e}
    foreign = sorted(names - set(os.environ))
    if foreign:
        report("escaped", "pid 1 has variables the cell does not: %s" % ",".join(foreign[:8]))
    else:
        report("blocked", "pid 1 environment is the cell's own (%d vars)" % len(names))
except OSError as e:
    report("blocked", errno.errorcode.get(e.errno, str(e.errno)))
