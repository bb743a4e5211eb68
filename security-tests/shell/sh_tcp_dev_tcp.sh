# attack: sh_tcp_dev_tcp
# category: network
# attempts: bash's /dev/tcp to the loopback TCP listener, and /dev/udp to the UDP listener
# expect: bash cannot run (exec denied) or the connects fail (network unreachable / permission denied); listeners see nothing
# control: yes
# canaries: tcp, udp
if e1=$(bash -c 'echo "{{MARKER}} tcp" > /dev/tcp/127.0.0.1/{{TCP_PORT}}' 2>&1); then
    echo "ATTACK-RESULT: escaped connected over /dev/tcp"
elif e2=$(bash -c 'echo "{{MARKER}} udp" > /dev/udp/127.0.0.1/{{UDP_PORT}}' 2>&1); then
    echo "ATTACK-RESULT: escaped sent over /dev/udp"
else
    echo "ATTACK-RESULT: blocked $e1 | $e2"
fi
