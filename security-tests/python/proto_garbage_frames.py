# attack: proto_garbage_frames
# category: protocol
# attempts: write 64 KiB of random bytes to every pipe/socket descriptor that could be the protocol channel
# expect: the supervisor ends the cell with protocol_error (no panic, no hang); the session is unharmed
# control: no
# canaries: supervisor_rss
# status: protocol_error
# timeout: 10
import os
import stat
import time

random = os.urandom(64 * 1024)
hit = []
for fd in range(3, 256):
    try:
        mode = os.fstat(fd).st_mode
    except OSError:
        continue
    if stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode):
        try:
            os.write(fd, random)
            hit.append(fd)
        except OSError:
            pass
print("wrote garbage to fds", hit, flush=True)
if not hit:
    print("ATTACK-RESULT: blocked no protocol descriptor accepted the write", flush=True)
else:
    time.sleep(8)
    print("ATTACK-RESULT: escaped the cell kept running after garbage frames", flush=True)
