# attack: sh_disk_fill_many_files
# category: resource
# attempts: write 48 files of 32 MiB each (1.5 GiB) in scratch with dd: each file stays under RLIMIT_FSIZE, the total does not (the files are removed afterwards)
# expect: the writes fail with ENOSPC (the one-shot cell's 64 MiB /tmp, or the supervisor's 1 GiB scratch tmpfs) well before 1.5 GiB
# control: no
# canaries: none
# status: ok,error,limit_exceeded,killed
# timeout: 30
n=0
while [ $n -lt 48 ]; do
    dd if=/dev/zero of=fill$n.bin bs=1M count=32 2>/dev/null || break
    n=$((n+1))
done
total=$(du -sm . | cut -f1)
rm -f fill*.bin
if [ "$n" -ge 48 ]; then
    echo "ATTACK-RESULT: escaped wrote 48 files of 32 MiB"
else
    echo "ATTACK-RESULT: blocked after $n files ($total MiB)"
fi
