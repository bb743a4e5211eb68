# attack: leak_hostname
# category: leak
# attempts: read the hostname (gethostname, uname, /proc/sys/kernel/hostname, /etc/hostname)
# expect: the cell has its own UTS name; the host's hostname never appears
# control: yes
# canaries: host_id
import os
import socket

seen = set()
try:
    seen.add(socket.gethostname())
except OSError:
    pass
seen.add(os.uname().nodename)
for path in ("/proc/sys/kernel/hostname", "/etc/hostname"):
    try:
        with open(path) as f:
            seen.add(f.read().strip())
    except OSError:
        pass
for name in sorted(seen):
    print(name)
print("ATTACK-RESULT: attempted hostnames seen: %d; the host-identity canary decides" % len(seen), flush=True)
