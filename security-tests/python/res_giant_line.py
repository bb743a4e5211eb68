# attack: res_giant_line
# category: resource
# attempts: write one 200 MB line with no newline (line-buffered readers must not try to hold it)
# expect: the supervisor caps what it keeps (truncated.stdout set) and does not grow
# control: no
# canaries: output_cap, supervisor_rss
# status: ok,limit_exceeded,killed,error
# timeout: 30
import os

chunk = b"x" * (1 << 20)
for _ in range(200):
    os.write(1, chunk)
os.write(2, b"ATTACK-RESULT: attempted wrote a 200 MB line; the output cap decides\n")
