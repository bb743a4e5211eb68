# attack: net_netlink_route
# category: network
# attempts: open a NETLINK_ROUTE socket and dump the interface list (RTM_GETLINK) to learn the host's network
# expect: socket() fails (EPERM/EAFNOSUPPORT from seccomp) or only a loopback interface exists (net namespace)
# control: yes
# canaries: host_id
import errno
import os
import socket
import struct


def report(kind, detail):
    print("ATTACK-RESULT:", kind, detail, flush=True)


try:
    s = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0)
    s.bind((0, 0))
    RTM_GETLINK, NLM_F_REQUEST, NLM_F_DUMP = 18, 1, 0x300
    msg = struct.pack("=LHHLL", 32, RTM_GETLINK, NLM_F_REQUEST | NLM_F_DUMP, 1, 0) + struct.pack("=BxHiII", 0, 0, 0, 0, 0)
    s.send(msg)
    names = []
    done = False
    while not done:
        data = s.recv(65536)
        off = 0
        while off + 16 <= len(data):
            length, mtype = struct.unpack_from("=LH", data, off)
            if length < 16 or mtype == 3:  # NLMSG_DONE
                done = True
                break
            if mtype == 16:  # RTM_NEWLINK
                a = off + 16 + 16
                while a + 4 <= off + length:
                    alen, atype = struct.unpack_from("=HH", data, a)
                    if alen < 4:
                        break
                    if atype == 3:  # IFLA_IFNAME
                        names.append(data[a + 4:a + alen].split(b"\0")[0].decode())
                    a += (alen + 3) & ~3
            off += (length + 3) & ~3
    s.close()
    for n in names:
        print(n)
    others = [n for n in names if n != "lo"]
    if others:
        report("escaped", "netlink dump shows host interfaces: " + ",".join(others))
    else:
        report("blocked", "netlink works but only loopback is visible")
except OSError as e:
    report("blocked", errno.errorcode.get(e.errno, str(e)) if e.errno else type(e).__name__)
