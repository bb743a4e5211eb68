# attack: proto_raw_call_flood
# category: protocol
# attempts: write 100000 `call` frames back to back on the protocol channel without ever reading a reply
# expect: the supervisor stops it (protocol_error for unsolicited calls, a call-budget limit, or the wall timeout when the reply pipe fills); its memory stays flat
# control: no
# canaries: supervisor_rss
# status: protocol_error,limit_exceeded,policy_denied,timeout
# timeout: 10
import json
import os
import stat
import struct
import time

fds = []
for fd in range(3, 256):
    try:
        mode = os.fstat(fd).st_mode
    except OSError:
        continue
    if stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode):
        fds.append(fd)
sent = 0
try:
    for i in range(100000):
        body = json.dumps({"t": "call", "id": 10_000 + i, "cap": "emit", "args": {"event": {"i": i}}}).encode()
        frame = struct.pack(">I", len(body)) + body
        for fd in fds:
            os.write(fd, frame)
        sent += 1
except OSError as e:
    print("write failed after", sent, e, flush=True)
print("sent", sent, "calls", flush=True)
time.sleep(8)
print("ATTACK-RESULT: escaped sent %d unsolicited calls and kept running" % sent, flush=True)
