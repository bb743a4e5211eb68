# attack: fs_supervisor_fds
# category: filesystem
# attempts: walk /proc/<supervisor>/fd and read every regular file the supervisor holds open (it inherited one from the harness)
# expect: ENOENT (PID namespace) or EACCES; nothing the supervisor holds can be reopened
# control: yes
# canaries: none
import errno
import os
import stat


def report(kind, detail):
    print("ATTACK-RESULT:", kind, detail, flush=True)


base = "/proc/{{SUPERVISOR_PID}}/fd"
try:
    fds = os.listdir(base)
    read = []
    for name in fds:
        path = os.path.join(base, name)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        except OSError:
            continue
        try:
            if stat.S_ISREG(os.fstat(fd).st_mode):
                print(os.pread(fd, 4096, 0).decode("latin-1"))
                read.append(name)
        finally:
            os.close(fd)
    report("escaped", "listed %d supervisor fds, read %d files" % (len(fds), len(read)))
except OSError as e:
    report("blocked", errno.errorcode.get(e.errno, str(e.errno)))
