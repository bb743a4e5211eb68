# attack: net_vsock
# category: network
# attempts: open an AF_VSOCK socket (the guest<->hypervisor channel); no connection is attempted
# expect: socket() fails with EPERM/EAFNOSUPPORT (seccomp allows no such family)
# control: yes
# canaries: none
import errno
import socket


def report(kind, detail):
    print("ATTACK-RESULT:", kind, detail, flush=True)


try:
    s = socket.socket(40, socket.SOCK_STREAM)  # AF_VSOCK
    s.close()
    report("escaped", "opened an AF_VSOCK socket")
except OSError as e:
    report("blocked", errno.errorcode.get(e.errno, str(e)) if e.errno else type(e).__name__)
