# attack: proc_setns
# category: process
# attempts: open the supervisor's and pid 1's namespace files (/proc/<pid>/ns/{mnt,net,pid,uts,ipc,user}) and setns into them
# expect: opening fails (ENOENT/EACCES) or setns fails with EPERM (seccomp, no CAP_SYS_ADMIN)
# control: yes
# canaries: none
import ctypes
import errno
import os


def report(kind, detail):
    print("ATTACK-RESULT:", kind, detail, flush=True)


libc = ctypes.CDLL(None, use_errno=True)
joined = []
denials = set()
for pid in ({{SUPERVISOR_PID}}, 1):
    for ns in ("mnt", "net", "pid", "uts", "ipc", "user"):
        try:
            fd = os.open("/proc/%d/ns/%s" % (pid, ns), os.O_RDONLY)
        except OSError as e:
            denials.add("open:" + errno.errorcode.get(e.errno, str(e.errno)))
            continue
        if libc.setns(fd, 0) == 0:
            joined.append("%d/%s" % (pid, ns))
        else:
            e = ctypes.get_errno()
            denials.add("setns:" + errno.errorcode.get(e, str(e)))
        os.close(fd)
if joined:
    report("escaped", "joined namespaces " + ",".join(joined))
else:
    report("blocked", " ".join(sorted(denials)))
