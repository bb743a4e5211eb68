# attack: net_unix_abstract
# category: network
# attempts: connect to the harness's abstract unix socket (abstract names live in the network namespace, not the filesystem)
# expect: ECONNREFUSED in a separate net namespace, EPERM from Landlock scoping (ABI >= 6) or seccomp; the listener sees nothing
# control: yes
# canaries: abstract
import errno
import socket


def report(kind, detail):
    print("ATTACK-RESULT:", kind, detail, flush=True)


try:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(3)
    s.connect("\0{{ABSTRACT_NAME}}")
    s.sendall(b"{{MARKER}}\n")
    s.close()
    report("escaped", "connected to the abstract socket {{ABSTRACT_NAME}}")
except OSError as e:
    report("blocked", errno.errorcode.get(e.errno, str(e)) if e.errno else type(e).__name__)
