#!/bin/bash
set -euo pipefail
python3 -c 'import json; print(json.load(open("/app/config.json"))["server"]["port"])' > /app/port.txt
