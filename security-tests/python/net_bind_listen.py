# attack: net_bind_listen
# category: network
# attempts: bind TCP port BIND_PORT on 0.0.0.0 (no listen, so nothing is exposed), then bind and listen on 127.0.0.1:BIND_PORT for 3 s while the harness tries to connect
# expect: socket/bind fails (EPERM from seccomp, EACCES from Landlock ABI >= 4); nothing on the host can reach the cell
# control: yes
# canaries: bind
import errno
import socket
import time


def report(kind, detail):
    print("ATTACK-RESULT:", kind, detail, flush=True)


def name(e):
    return errno.errorcode.get(e.errno, str(e)) if e.errno else type(e).__name__


granted = []
denials = []
try:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", {{BIND_PORT}}))
    s.close()
    granted.append("bind 0.0.0.0:{{BIND_PORT}}")
except OSError as e:
    denials.append("0.0.0.0:" + name(e))
try:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", {{BIND_PORT}}))
    s.listen(8)
    s.settimeout(0.2)
    deadline = time.monotonic() + 3
    accepted = 0
    while time.monotonic() < deadline:
        try:
            c, _ = s.accept()
            c.close()
            accepted += 1
        except socket.timeout:
            pass
    s.close()
    granted.append("listen 127.0.0.1:{{BIND_PORT}} (%d connections accepted)" % accepted)
except OSError as e:
    denials.append("127.0.0.1:" + name(e))
if granted:
    report("escaped", "; ".join(granted))
else:
    report("blocked", " ".join(denials))
