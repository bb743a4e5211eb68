# attack: res_memory_fork_bomb
# category: resource
# attempts: fork 10 children that each touch 600 MiB and hold it together (6 GiB in all; each child alone is within RLIMIT_AS)
# expect: the cell's processes together are held to its memory limit: children past it are killed (or fail to allocate), far fewer than 10 hold their memory at once
# control: no
# canaries: none
# status: ok,error,limit_exceeded,killed
# timeout: 30
import os

CHILDREN = 10
SIZE = 600 << 20
release_r, release_w = os.pipe()
reports = []
for i in range(CHILDREN):
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        os.close(release_w)
        try:
            b = bytearray(SIZE)
            for j in range(0, SIZE, 4096):
                b[j] = 1
            os.write(w, b"1")
        except MemoryError:
            os._exit(3)
        os.read(release_r, 1)  # hold the memory until the parent lets go
        os._exit(0)
    os.close(w)
    reports.append((pid, r))
reported = 0
for pid, r in reports:
    if os.read(r, 1) == b"1":
        reported += 1
os.close(release_w)
ends = [os.waitpid(pid, 0)[1] for pid, _ in reports]
# Held at once: children still alive, their memory in place, at release.
held = sum(1 for s in ends if os.WIFEXITED(s) and os.WEXITSTATUS(s) == 0)
killed = sum(1 for s in ends if os.WIFSIGNALED(s))
mib = held * (SIZE >> 20)
if held == CHILDREN:
    print("ATTACK-RESULT: escaped %d children held %d MiB at once" % (held, mib), flush=True)
else:
    print("ATTACK-RESULT: blocked %d of %d children held their memory at once (%d MiB); %d killed"
          % (held, CHILDREN, mib, killed), flush=True)
