# attack: proto_raw_call_flood
# category: protocol
# attempts: write 100000 `call` frames back to back on the protocol channel without ever reading a reply
# expect: the supervisor stops it (protocol_error for unsolicited calls, a call-budget limit, or the wall timeout when the reply pipe fills); its memory stays flat
# control: no
# canaries: supervisor_rss
# status: protocol_error,limit_exceeded,policy_denied,timeout
# timeout: 10
import errno
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
failure = ""
for i in range(100000):
    body = json.dumps({"t": "call", "id": 10_000 + i, "cap": "emit", "args": {"event": {"i": i}}}).encode()
    frame = struct.pack(">I", len(body)) + body
    wrote = False
    for fd in list(fds):
        try:
            os.write(fd, frame)
            wrote = True
        except OSError as e:
            failure = errno.errorcode.get(e.errno, str(e.errno))
            fds.remove(fd)
    if not wrote:
        break
    sent += 1
print("sent", sent, "calls", failure, flush=True)
if sent == 0:
    print("ATTACK-RESULT: blocked no protocol descriptor accepted a frame (%s)" % failure, flush=True)
else:
    time.sleep(8)
    print("ATTACK-RESULT: escaped sent %d unsolicited calls and kept running" % sent, flush=True)
