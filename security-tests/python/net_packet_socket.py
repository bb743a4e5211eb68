# attack: net_packet_socket
# category: network
# attempts: open an AF_PACKET raw socket (link-layer sniffing and injection); nothing is sent
# expect: socket() fails with EPERM (no CAP_NET_RAW; seccomp) or EAFNOSUPPORT
# control: yes
# canaries: none
import errno
import socket


def report(kind, detail):
    print("ATTACK-RESULT:", kind, detail, flush=True)


try:
    s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0003))
    s.close()
    report("escaped", "opened an AF_PACKET socket")
except OSError as e:
    report("blocked", errno.errorcode.get(e.errno, str(e)) if e.errno else type(e).__name__)
