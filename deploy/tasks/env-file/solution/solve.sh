#!/bin/bash
set -euo pipefail
printf 'PORT=8080\nMODE=production\nWORKERS=4\n' > /app/.env
