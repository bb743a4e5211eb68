# attack: net_bind_listen
# category: network
# attempts: bind and listen on TCP port BIND_PORT (0.0.0.0, then 127.0.0.1) and accept for 3 s; the harness tries to connect to it meanwhile
# expect: socket/bind fails (EPERM from seccomp, EACCES from Landlock ABI >= 4); nothing on the host can reach it
# control: yes
# canaries: bind
import errno
import socket
import time


def report(kind, detail):
    print("ATTACK-RESULT:", kind, detail, flush=True)


denials = []
for addr in ("0.0.0.0", "127.0.0.1"):
    try:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((addr, {{BIND_PORT}}))
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
        report("escaped", "listening on %s:{{BIND_PORT}} (%d connections accepted)" % (addr, accepted))
        break
    except OSError as e:
        denials.append("%s:%s" % (addr, errno.errorcode.get(e.errno, str(e)) if e.errno else type(e).__name__))
else:
    report("blocked", " ".join(denials))
