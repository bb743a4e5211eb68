# attack: fs_supervisor_cmdline
# category: filesystem
# attempts: read the supervisor's /proc/<pid>/cmdline and /proc/<pid>/status
# expect: ENOENT (separate PID namespace) or EACCES; the supervisor's command line never appears
# control: yes
# canaries: none
import errno


def report(kind, detail):
    print("ATTACK-RESULT:", kind, detail, flush=True)


try:
    with open("/proc/{{SUPERVISOR_PID}}/cmdline", "rb") as f:
        data = f.read()
    print(data.replace(b"\0", b" ").decode("latin-1"))
    if data:
        report("escaped", "read the supervisor command line (%d bytes)" % len(data))
    else:
        report("blocked", "empty command line")
except OSError as e:
    report("blocked", errno.errorcode.get(e.errno, str(e.errno)))
