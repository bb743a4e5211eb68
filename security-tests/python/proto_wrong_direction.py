# attack: proto_wrong_direction
# category: protocol
# attempts: send supervisor-to-worker messages (`setup`, `start`, `reply`) and a second `ready` with a forged sandbox report up the protocol channel
# expect: protocol_error (unexpected message); the forged report never reaches the result's sandbox field
# control: no
# canaries: forged, supervisor_rss
# status: protocol_error
# timeout: 10
import json
import os
import stat
import struct
import time

msgs = [
    {"t": "ready", "report": {"profile": "{{FORGE_TOKEN}}", "layers": [{"name": "{{FORGE_TOKEN}}", "applied": True, "detail": "forged"}], "landlock_abi": 99, "namespaces": ["{{FORGE_TOKEN}}"]}},
    {"t": "reply", "id": 1, "ok": "{{FORGE_TOKEN}}"},
    {"t": "start", "language": "python", "code": "1", "limits": {}, "max_frame_bytes": 1},
]
data = b"".join(struct.pack(">I", len(b)) + b for b in (json.dumps(m).encode() for m in msgs))
hit = []
for fd in range(3, 256):
    try:
        mode = os.fstat(fd).st_mode
    except OSError:
        continue
    if stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode):
        try:
            os.write(fd, data)
            hit.append(fd)
        except OSError:
            pass
print("sent wrong-direction frames on fds", hit, flush=True)
if not hit:
    print("ATTACK-RESULT: blocked no protocol descriptor accepted the write", flush=True)
else:
    time.sleep(8)
    print("ATTACK-RESULT: escaped the cell kept running after wrong-direction frames", flush=True)
