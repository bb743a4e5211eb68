# attack: leak_network_interfaces
# category: leak
# attempts: list network interfaces and addresses (if_nameindex, /proc/net/dev, /sys/class/net, /proc/net/fib_trie)
# expect: only a loopback interface (down) is visible; no host address or MAC appears
# control: yes
# canaries: host_id
import socket

names = set()
try:
    names.update(n for _, n in socket.if_nameindex())
except OSError as e:
    print("if_nameindex:", e)
for path in ("/proc/net/dev", "/proc/net/fib_trie", "/proc/net/arp"):
    try:
        with open(path) as f:
            text = f.read()
        print(text)
        if path.endswith("dev"):
            names.update(line.split(":")[0].strip() for line in text.splitlines()[2:])
    except OSError as e:
        print(path, e)
try:
    import os

    for n in os.listdir("/sys/class/net"):
        names.add(n)
        try:
            with open("/sys/class/net/%s/address" % n) as f:
                print(n, f.read().strip())
        except OSError:
            pass
except OSError as e:
    print("/sys/class/net", e)
print(sorted(names))
others = sorted(n for n in names if n != "lo")
if others:
    print("ATTACK-RESULT: escaped host interfaces visible:", ",".join(others), flush=True)
else:
    print("ATTACK-RESULT: blocked only loopback is visible", flush=True)
