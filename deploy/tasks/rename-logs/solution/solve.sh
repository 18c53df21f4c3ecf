#!/bin/bash
set -euo pipefail
cd /app/logs && for f in *.log; do mv "$f" "${f%.log}.txt"; done
