#!/bin/bash
set -euo pipefail
wc -l < /app/items.txt > /app/count.txt
