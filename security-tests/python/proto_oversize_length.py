# attack: proto_oversize_length
# category: protocol
# attempts: announce a ~4 GiB frame (length prefix 0xfffffff0) on the protocol channel and trickle 1 MiB after it
# expect: the length is checked against the frame cap before any allocation: protocol_error at once, supervisor memory flat
# control: no
# canaries: supervisor_rss
# status: protocol_error
# timeout: 10
import os
import stat
import time

hit = []
for fd in range(3, 256):
    try:
        mode = os.fstat(fd).st_mode
    except OSError:
        continue
    if stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode):
        try:
            os.write(fd, b"\xff\xff\xff\xf0" + b"A" * (1 << 20))
            hit.append(fd)
        except OSError:
            pass
print("announced a 4 GiB frame on fds", hit, flush=True)
if not hit:
    print("ATTACK-RESULT: blocked no protocol descriptor accepted the write", flush=True)
else:
    time.sleep(8)
    print("ATTACK-RESULT: escaped the cell kept running after an oversized length prefix", flush=True)
