# attack: res_output_flood
# category: resource
# attempts: write 200 MB to stdout in 1 MiB chunks
# expect: the supervisor caps what it keeps (truncated.stdout set, result small) and does not grow; the cell may be stopped
# control: no
# canaries: output_cap, supervisor_rss
# status: ok,limit_exceeded,killed,error
# timeout: 30
import os

chunk = (b"flood " * 174763)[: 1 << 20]
for _ in range(200):
    os.write(1, chunk)
print("\nATTACK-RESULT: attempted wrote 200 MB; the output cap decides", flush=True)
