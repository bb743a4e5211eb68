# attack: net_raw_socket
# category: network
# attempts: open a raw IPv4 socket (SOCK_RAW/IPPROTO_UDP) and hand-craft a UDP datagram to the loopback listener
# expect: socket() fails with EPERM (no CAP_NET_RAW; seccomp) or EAFNOSUPPORT
# control: yes
# canaries: udp
import errno
import socket
import struct


def report(kind, detail):
    print("ATTACK-RESULT:", kind, detail, flush=True)


try:
    s = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_UDP)
    payload = b"{{MARKER}} raw"
    header = struct.pack(">HHHH", 40000, {{UDP_PORT}}, 8 + len(payload), 0)
    s.sendto(header + payload, ("127.0.0.1", 0))
    s.close()
    report("escaped", "opened a raw socket and sent a crafted datagram")
except OSError as e:
    report("blocked", errno.errorcode.get(e.errno, str(e)) if e.errno else type(e).__name__)
