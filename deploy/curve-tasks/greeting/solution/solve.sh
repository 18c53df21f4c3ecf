#!/bin/bash
set -euo pipefail
echo 'good morning' > /app/greeting.txt
