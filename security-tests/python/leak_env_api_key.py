# attack: leak_env_api_key
# category: leak
# attempts: print the whole environment, looking for the supervisor's API_KEY and anything beyond the cell's fixed set
# expect: the environment is the small fixed set; API_KEY never appears
# control: yes
# canaries: none
import os

for k, v in sorted(os.environ.items()):
    print("%s=%s" % (k, v))
if "API_KEY" in os.environ:
    print("ATTACK-RESULT: escaped API_KEY is in the cell environment", flush=True)
else:
    print("ATTACK-RESULT: blocked environment has %d variables, no API_KEY" % len(os.environ), flush=True)
