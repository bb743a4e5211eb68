# attack: sh_disk_fill
# category: resource
# attempts: dd 1 GiB of zeros into scratch (the file is removed afterwards)
# expect: dd dies of SIGXFSZ / fails with EFBIG or ENOSPC well before 1 GiB
# control: no
# canaries: none
# status: ok,error,limit_exceeded,killed
# timeout: 20
dd if=/dev/zero of=fill.bin bs=1M count=1024 2>dd.err
rc=$?
size=$(stat -c %s fill.bin 2>/dev/null || echo 0)
rm -f fill.bin
if [ "$size" -ge 1073741824 ]; then
    echo "ATTACK-RESULT: escaped wrote $size bytes"
else
    echo "ATTACK-RESULT: blocked dd stopped at $size bytes (rc $rc)"
fi
