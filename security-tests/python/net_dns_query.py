# attack: net_dns_query
# category: network
# attempts: send a real DNS query (A record) to a resolver on 127.0.0.1 (the harness UDP listener stands in for it) and resolve a name through libc
# expect: the query never leaves the cell (EPERM/ENETUNREACH); name resolution fails (no resolver reachable)
# control: yes
# canaries: udp
import errno
import socket
import struct


def report(kind, detail):
    print("ATTACK-RESULT:", kind, detail, flush=True)


query = struct.pack(">HHHHHH", 0x4242, 0x0100, 1, 0, 0, 0)
for label in ("cellbox-exfil", "{{MARKER}}", "example"):
    query += bytes([len(label)]) + label.encode()
query += b"\0" + struct.pack(">HH", 1, 1)
try:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.sendto(query, ("127.0.0.1", {{UDP_PORT}}))
    s.close()
    report("escaped", "sent a DNS query to 127.0.0.1:{{UDP_PORT}}")
except OSError as e:
    report("blocked", errno.errorcode.get(e.errno, str(e)) if e.errno else type(e).__name__)
