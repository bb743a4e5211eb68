# attack: sh_chroot
# category: process
# attempts: chroot to / (the first step of chroot-then-climb)
# expect: chroot fails (Operation not permitted)
# control: yes
# canaries: none
PATH="$PATH:/usr/sbin:/sbin"
if e=$(chroot / /bin/true 2>&1); then
    echo "ATTACK-RESULT: escaped chroot succeeded"
else
    echo "ATTACK-RESULT: blocked $e"
fi
