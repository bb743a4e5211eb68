# attack: fs_supervisor_environ
# category: filesystem
# attempts: read the supervisor's /proc/<pid>/environ, which holds the fake API_KEY
# expect: ENOENT (separate PID namespace) or EACCES/EPERM; API_KEY never appears in output
# control: yes
# canaries: none
import errno


def report(kind, detail):
    print("ATTACK-RESULT:", kind, detail, flush=True)


try:
    with open("/proc/{{SUPERVISOR_PID}}/environ", "rb") as f:
        data = f.read()
    print(data.replace(b"\0", b"\n").decode("latin-1"))
    report("escaped", "read %d bytes of the supervisor environment" % len(data))
except OSError as e:
    report("blocked", errno.errorcode.get(e.errno, str(e.errno)))
