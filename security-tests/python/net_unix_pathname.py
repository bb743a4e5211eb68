# attack: net_unix_pathname
# category: network
# attempts: connect to the harness's world-accessible pathname unix socket outside scratch
# expect: ENOENT (socket not in the cell's mount view), EACCES (Landlock ABI >= 9) or EPERM (seccomp); the listener sees nothing
# control: yes
# canaries: unix
import errno
import socket


def report(kind, detail):
    print("ATTACK-RESULT:", kind, detail, flush=True)


try:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(3)
    s.connect("{{UNIX_PATH}}")
    s.sendall(b"{{MARKER}}\n")
    s.close()
    report("escaped", "connected to {{UNIX_PATH}}")
except OSError as e:
    report("blocked", errno.errorcode.get(e.errno, str(e)) if e.errno else type(e).__name__)
