# attack: sh_env_leak
# category: leak
# attempts: dump the environment (env, set, /proc/self/environ)
# expect: only the small fixed set; API_KEY never appears
# control: yes
# canaries: none
env
tr '\0' '\n' < /proc/self/environ 2>/dev/null
if [ -n "${API_KEY:-}" ]; then
    echo "ATTACK-RESULT: escaped API_KEY present"
else
    echo "ATTACK-RESULT: blocked no API_KEY"
fi
