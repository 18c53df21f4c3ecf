#!/bin/bash
set -euo pipefail
printf 'Hello, forgelog!\n' > /app/hello.txt
