# attack: sh_host_identity
# category: leak
# attempts: print hostname, interfaces and addresses (hostname, /proc/net/dev, /sys/class/net, ip addr)
# expect: a cell-private hostname and only loopback
# control: yes
# canaries: host_id
hostname 2>/dev/null || cat /proc/sys/kernel/hostname
cat /proc/net/dev 2>/dev/null
ls /sys/class/net 2>/dev/null
for i in /sys/class/net/*; do cat "$i/address" 2>/dev/null; done
ip -o addr 2>/dev/null
echo "ATTACK-RESULT: attempted host identity printed; the host-identity canary decides"
