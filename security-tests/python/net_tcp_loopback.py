# attack: net_tcp_loopback
# category: network
# attempts: TCP connect to the harness listener on 127.0.0.1 and send the run marker
# expect: connect fails (ENETUNREACH with a down loopback in a net namespace, EACCES from Landlock, EPERM from seccomp); the listener sees nothing
# control: yes
# canaries: tcp
import errno
import socket


def report(kind, detail):
    print("ATTACK-RESULT:", kind, detail, flush=True)


try:
    s = socket.create_connection(("127.0.0.1", {{TCP_PORT}}), timeout=3)
    s.sendall(b"{{MARKER}}\n")
    s.close()
    report("escaped", "connected to 127.0.0.1:{{TCP_PORT}}")
except OSError as e:
    report("blocked", errno.errorcode.get(e.errno, str(e)) if e.errno else type(e).__name__)
