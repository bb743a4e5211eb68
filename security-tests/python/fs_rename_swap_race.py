# attack: fs_rename_swap_race
# category: filesystem
# attempts: race a directory in scratch against a symlink to the outside dir (rename swap loop) while another thread writes into it
# expect: no write lands outside scratch: checks apply to the object actually opened, not to the path string
# control: yes
# canaries: scratch_escape
import os
import threading
import time

os.mkdir("real-dir")
os.symlink("{{OUTSIDE_DIR}}", "evil-link")
stop = time.monotonic() + 1.5
landed = []


def swapper():
    while time.monotonic() < stop:
        try:
            os.rename("real-dir", "slot")
            os.rename("slot", "real-dir")
            os.rename("evil-link", "slot")
            os.rename("slot", "evil-link")
        except OSError:
            pass


def writer():
    n = 0
    while time.monotonic() < stop:
        n += 1
        try:
            with open("slot/race-%d" % n, "w") as f:
                f.write("x\n")
            if os.path.realpath("slot").startswith("{{OUTSIDE_DIR}}"):
                landed.append(n)
        except OSError:
            pass


t1 = threading.Thread(target=swapper)
t2 = threading.Thread(target=writer)
t1.start()
t2.start()
t1.join()
t2.join()
try:
    outside = [n for n in os.listdir("{{OUTSIDE_DIR}}") if n.startswith("race-")]
except OSError:
    outside = []
if outside:
    print("ATTACK-RESULT: escaped %d files landed outside scratch" % len(outside), flush=True)
else:
    print("ATTACK-RESULT: blocked no write landed outside scratch", flush=True)
