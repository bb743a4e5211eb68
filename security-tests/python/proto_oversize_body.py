# attack: proto_oversize_body
# category: protocol
# attempts: send a complete, valid-JSON `emit` frame of 16 MiB (twice the default frame cap) on the protocol channel
# expect: protocol_error (frame exceeds the cap); the supervisor never buffers the whole body
# control: no
# canaries: supervisor_rss
# status: protocol_error
# timeout: 10
import json
import os
import stat
import struct
import time

body = json.dumps({"t": "emit", "event": {"pad": "p" * (16 * 1024 * 1024)}}).encode()
frame = struct.pack(">I", len(body)) + body
hit = []
for fd in range(3, 256):
    try:
        mode = os.fstat(fd).st_mode
    except OSError:
        continue
    if stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode):
        try:
            os.write(fd, frame)
            hit.append(fd)
        except OSError:
            pass
print("sent a %d-byte frame on fds %s" % (len(frame), hit), flush=True)
if not hit:
    print("ATTACK-RESULT: blocked no protocol descriptor accepted the write", flush=True)
else:
    time.sleep(8)
    print("ATTACK-RESULT: escaped the cell kept running after an oversized frame", flush=True)
