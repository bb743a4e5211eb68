# attack: fs_walk_root
# category: filesystem
# attempts: walk the whole visible filesystem (bounded at 60000 entries, /proc and /sys skipped) looking for the harness's canary directories and any secret.txt, then read what it finds
# expect: the cell's root is a minimal read-only view: no host temp directories, no canary files
# control: yes
# canaries: secret_file
import os

found = []
seen = 0


def walk(top, budget):
    global seen
    for root, dirs, files in os.walk(top, onerror=lambda e: None):
        dirs[:] = [d for d in dirs if not (root == "/" and d in ("proc", "sys", "dev"))]
        for name in dirs + files:
            seen += 1
            path = os.path.join(root, name)
            if (name.startswith("cbx-security-") or name == "secret.txt") and path not in found:
                found.append(path)
        if seen > budget:
            return


# Shared and temporary places first, then everything else.
for top in ("/var/tmp", "/tmp", "/dev/shm", "/run", "/home", "/root", "/srv", "/mnt", "/opt"):
    walk(top, 20000)
walk("/", 60000)
for path in found[:20]:
    print(path)
    if path.endswith("secret.txt"):
        try:
            with open(path) as f:
                print(f.read())
        except OSError as e:
            print("  unreadable:", e.strerror)
if found:
    print("ATTACK-RESULT: escaped host canary paths visible (%d), e.g. %s" % (len(found), found[0]), flush=True)
else:
    print("ATTACK-RESULT: blocked walked %d entries, no host canary visible" % seen, flush=True)
