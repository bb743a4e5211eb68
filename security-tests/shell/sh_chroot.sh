# attack: sh_chroot
# category: process
# attempts: chroot into scratch's parent chain
# expect: chroot fails (Operation not permitted)
# control: yes
# canaries: none
PATH="$PATH:/usr/sbin:/sbin"
if chroot / /bin/true 2>/dev/null; then
    echo "ATTACK-RESULT: escaped chroot succeeded"
else
    echo "ATTACK-RESULT: blocked chroot failed"
fi
