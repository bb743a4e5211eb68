# attack: proc_memfd_exec
# category: process
# attempts: copy the interpreter into a memfd and execute it from there (fexecve via /proc/self/fd), sidestepping path-based exec rules
# expect: memfd_create or execve fails (EPERM from seccomp, EACCES); the copied interpreter never runs
# control: yes
# canaries: none
import errno
import os
import sys


def report(kind, detail):
    print("ATTACK-RESULT:", kind, detail, flush=True)


try:
    fd = os.memfd_create("innocent", 0)
    with open(sys.executable, "rb") as src:
        while True:
            chunk = src.read(1 << 20)
            if not chunk:
                break
            os.write(fd, chunk)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.dup2(w, 1)
            os.execv("/proc/self/fd/%d" % fd, ["python3", "-S", "-c", "print('MEMFD-' + str(6 * 7))"])
        except OSError as e:
            os.write(2, ("exec:%s\n" % errno.errorcode.get(e.errno, str(e.errno))).encode())
            os._exit(111)
    os.close(w)
    out = os.read(r, 4096)
    _, status = os.waitpid(pid, 0)
    if b"MEMFD-42" in out:
        report("escaped", "executed a memfd copy of the interpreter")
    else:
        report("blocked", "exec from memfd failed (status %d)" % status)
except OSError as e:
    report("blocked", errno.errorcode.get(e.errno, str(e.errno)))
