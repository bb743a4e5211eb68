# attack: net_tcp_v4mapped
# category: network
# attempts: reach the IPv4 loopback listener through an AF_INET6 socket and the v4-mapped address ::ffff:127.0.0.1
# expect: socket or connect fails (EAFNOSUPPORT/EPERM from seccomp, EACCES from Landlock, ENETUNREACH); the listener sees nothing
# control: yes
# canaries: tcp
import errno
import socket


def report(kind, detail):
    print("ATTACK-RESULT:", kind, detail, flush=True)


try:
    s = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
    s.settimeout(3)
    s.connect(("::ffff:127.0.0.1", {{TCP_PORT}}))
    s.sendall(b"{{MARKER}}\n")
    s.close()
    report("escaped", "connected through ::ffff:127.0.0.1")
except OSError as e:
    report("blocked", errno.errorcode.get(e.errno, str(e)) if e.errno else type(e).__name__)
