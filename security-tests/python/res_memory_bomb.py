# attack: res_memory_bomb
# category: resource
# attempts: allocate and touch memory in 64 MiB blocks (bounded at 2 GiB)
# expect: MemoryError (RLIMIT_AS/DATA) or the cell is killed/limited well before 2 GiB
# control: no
# canaries: none
# status: ok,error,limit_exceeded,killed
# timeout: 15
BLOCK = 64 * 1024 * 1024
LIMIT = 2 * 1024 * 1024 * 1024
blocks = []
try:
    while len(blocks) * BLOCK < LIMIT:
        blocks.append(b"\x01" * BLOCK)
    print("ATTACK-RESULT: escaped allocated %d MiB" % (len(blocks) * 64), flush=True)
except MemoryError:
    n = len(blocks)
    blocks = None
    print("ATTACK-RESULT: blocked MemoryError after %d MiB" % (n * 64), flush=True)
