# attack: net_udp_loopback
# category: network
# attempts: send UDP datagrams to the harness listener on 127.0.0.1 with sendto and with connect+send
# expect: socket/sendto fails (EPERM/EAFNOSUPPORT from seccomp, ENETUNREACH in a net namespace); the listener receives nothing
# control: yes
# canaries: udp
import errno
import socket


def report(kind, detail):
    print("ATTACK-RESULT:", kind, detail, flush=True)


try:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.sendto(b"{{MARKER}} sendto", ("127.0.0.1", {{UDP_PORT}}))
    s.connect(("127.0.0.1", {{UDP_PORT}}))
    s.send(b"{{MARKER}} send")
    s.close()
    report("escaped", "sent datagrams to 127.0.0.1:{{UDP_PORT}}")
except OSError as e:
    report("blocked", errno.errorcode.get(e.errno, str(e)) if e.errno else type(e).__name__)
